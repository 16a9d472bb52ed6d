"""The low-bit observers' ``fake_quantize`` on NumPy, torch and JAX, bit for bit, on seeded random data.

- A NumPy array of an ml_dtypes float (bfloat16, float8_e4m3fn, float8_e5m2) comes back in its dtype with
  the values torch and JAX give for theirs: the integer formats compute in the input's dtype (each
  operation rounded to it), fp8/MX/BFP16 in float32 and round once at the end.
- NaN/Inf inputs (and NaN/Inf statistics) give NaN where torch does, without a NumPy ``RuntimeWarning``.
- The symmetric signed integer formats never give ``-0.0`` on JAX (XLA drops the addition of a zero point
  that is a compile-time zero, which turns ``round``'s ``-0.0`` into ``0.0`` on torch and NumPy).

JAX compiles once per configuration and input dtype (about a second each here): it runs a subset.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")

import jax.numpy as jnp  # noqa: E402

import observers_core as oc  # noqa: E402
from conftest import to_torch  # noqa: E402
from observers_core.adapters import _array_lowbit as npobs  # noqa: E402  (no public numpy module)
from observers_core.adapters import jax as jobs  # noqa: E402
from observers_core.adapters import torch as tobs  # noqa: E402

SHAPE = (16, 64)
LAYOUTS = {"tensor": {}, "channel": {"axis": 0}, "group": {"axis": 1, "group_size": 8}}


def _cases() -> list:
    """``(id, class name, keywords, on_jax)``: every integer dtype x symmetry x layout, fp8 x layout, every
    MX dtype x rounding, BFP16; ``on_jax`` marks one or more per format (every symmetric signed layout)."""
    cases = []
    for dtype in oc.INT_RANGES:
        for symmetric in (False, True):
            for layout, kw in LAYOUTS.items():
                jax_case = (symmetric and not dtype.startswith("u") and dtype in ("int2", "int8")) or (
                    dtype == "uint8" and layout == "group")
                cases.append((f"{dtype}-{'sym' if symmetric else 'asym'}-{layout}", "LowBitObserver",
                               dict(dtype=dtype, symmetric=symmetric, **kw), jax_case))
    for dtype in oc.FP8_MAX:
        for layout, kw in LAYOUTS.items():
            cases.append((f"{dtype}-{layout}", "FP8Observer", dict(dtype=dtype, **kw), layout == "channel"))
    for dtype in oc.MX_DTYPES:
        for rounding in oc.MX_ROUNDINGS:
            cases.append((f"{dtype}-{rounding}", "PerBlockMXObserver", dict(dtype=dtype, rounding=rounding, block_size=8),
                          dtype in ("mxfp4", "mxint8") and rounding == "even"))
    cases.append(("bfp16", "PerBlockBFPObserver", {}, True))
    return cases


CASES = _cases()
JAX_CASES = [c for c in CASES if c[3]]
SYMMETRIC_SIGNED = [c for c in CASES if c[1] == "LowBitObserver" and c[2]["symmetric"] and not c[2]["dtype"].startswith("u")]


def _params(cases: list) -> list:
    return [pytest.param(*case[1:3], id=case[0]) for case in cases]


def _data(rng: np.random.Generator, *, nonfinite: bool, decades: float = 3.0,
          fit_values: tuple = (np.nan, np.inf, -np.inf)) -> tuple[np.ndarray, np.ndarray]:
    """``(fit, x)`` float32: normal data at a random scale; ``x`` reaches past the fitted range, a tenth of it
    a thousand times smaller (rounds to zero, of either sign), ``-0.0`` included; with ``nonfinite`` NaN and
    +-Inf in ``x`` and ``fit_values`` in ``fit``."""
    scale = 10.0 ** rng.uniform(-decades, decades)
    fit = (rng.standard_normal(SHAPE) * scale).astype(np.float32)
    x = (rng.standard_normal(SHAPE) * scale * rng.uniform(0.3, 3.0)).astype(np.float32)
    small = rng.random(SHAPE) < 0.1
    x[small] *= np.float32(1e-3)
    x[0, :2] = [-0.0, 0.0]
    if nonfinite:
        for a, values in ((fit, list(fit_values)), (x, [np.nan, np.inf, -np.inf])):
            a.reshape(-1)[rng.choice(a.size, len(values), replace=False)] = values
    return fit, x


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_bits(actual, expected, what: str) -> None:
    """Same dtype, NaN where NaN, the same bits elsewhere (``-0.0`` is not ``0.0``)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    nan_a, nan_e = np.isnan(actual.astype(np.float32)), np.isnan(expected.astype(np.float32))
    bad = (nan_a != nan_e) | (~nan_a & (_bits(actual) != _bits(expected)))
    assert not bad.any(), (what, int(bad.sum()), actual[bad][:6], expected[bad][:6], np.argwhere(bad)[:6].tolist())


def _torch_out(y: torch.Tensor) -> np.ndarray:
    """A torch result as numpy with the same bits (bfloat16 as ml_dtypes')."""
    if y.dtype == torch.bfloat16:
        return y.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return y.numpy()


def _fake_quantize(mod, cls: str, kw: dict, fit: np.ndarray, x: np.ndarray, asarray, *, nonfinite_kw: bool = False):
    obs = getattr(mod, cls)(**kw, **({"ignore_nonfinite": True} if nonfinite_kw else {}))
    obs(asarray(fit))
    return obs.fake_quantize(asarray(x))


def numpy_fq(cls, kw, fit, x, **opts):
    return _fake_quantize(npobs, cls, kw, fit, x, np.asarray, **opts)


def torch_fq(cls, kw, fit, x, **opts):
    return _torch_out(_fake_quantize(tobs, cls, kw, fit, x, to_torch, **opts))


def jax_fq(cls, kw, fit, x, **opts):
    return np.asarray(_fake_quantize(jobs, cls, kw, fit, x, jnp.asarray, **opts))


# ------------------------------------------------------------------------ ml_dtypes floats on NumPy


@pytest.mark.parametrize("cls, kw", _params(CASES))
def test_numpy_bfloat16_fake_quantize_keeps_the_dtype_with_torchs_bits(cls, kw):
    """A NumPy bfloat16 input gives bfloat16 (it gave float32), torch's bfloat16 result bit for bit: the
    integer formats round each operation to bfloat16 as torch does (casting a float32 result would differ
    in up to a third of the values), fp8/MX/BFP16 round their float32 result once."""
    rng = np.random.default_rng(sum(map(ord, repr((cls, kw)))))
    for trial in range(8):
        fit, x = _data(rng, nonfinite=trial % 4 == 3, decades=30, fit_values=[(), (np.inf,)][trial % 8 // 4])
        x = x.astype(ml_dtypes.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # NaN/Inf included, quietly
            y = numpy_fq(cls, kw, fit, x)
        assert y.dtype == ml_dtypes.bfloat16, y.dtype
        assert_same_bits(y, torch_fq(cls, kw, fit, x), f"numpy vs torch, trial {trial}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("cls, kw", _params(JAX_CASES))
def test_numpy_extension_float_fake_quantize_has_jaxs_bits(cls, kw, dtype):
    """NumPy's ml_dtypes bfloat16/float8 inputs give JAX's result for the same array, dtype and bits
    (float8: JAX computes the integer formats in float8 too). torch casts float8 inputs to float32 and
    returns float32: for fp8/MX/BFP16 that result rounded to the float8 dtype is NumPy's (and JAX's)."""
    dt = getattr(ml_dtypes, dtype)
    rng = np.random.default_rng(sum(map(ord, repr((cls, kw, dtype)))))
    for trial in range(4):
        fit, x = _data(rng, nonfinite=trial == 3, decades=30 if dtype == "bfloat16" else 3)
        x = x.astype(dt)
        y = numpy_fq(cls, kw, fit, x)
        assert y.dtype == dt, y.dtype
        assert_same_bits(y, jax_fq(cls, kw, fit, x), f"numpy vs jax, trial {trial}")
        if dtype != "bfloat16" and cls != "LowBitObserver":
            expected = _fake_quantize(tobs, cls, kw, fit, x.astype(np.float32), to_torch).numpy().astype(dt)
            assert_same_bits(y, expected, f"numpy vs torch's float32 result, trial {trial}")


def test_core_fake_quantize_takes_numpy_bfloat16_as_torch_takes_its_own():
    """``oc.fake_quantize`` on a NumPy bfloat16 array (it raised ``TypeError``): torch's bfloat16 result bit for
    bit, with integer and with floating zero points, per tensor and per channel."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        x = (rng.standard_normal((8, 32)) * 10.0 ** rng.uniform(-5, 5)).astype(ml_dtypes.bfloat16)
        per_channel = trial % 2 == 1
        n = 8 if per_channel else 1
        scale = (np.abs(x.astype(np.float32)).max() / 100 * rng.uniform(0.5, 2, n)).astype(np.float32)
        zero_point = rng.integers(-20, 20, n).astype(np.int32)
        if trial % 4 >= 2:
            zero_point = (zero_point + rng.uniform(-0.5, 0.5, n)).astype(np.float32)
        kw = dict(quant_min=-128, quant_max=127, axis=0 if per_channel else None)
        y = oc.fake_quantize(x, scale, zero_point, **kw)
        expected = oc.fake_quantize(to_torch(x), torch.from_numpy(scale), torch.from_numpy(zero_point), **kw)
        assert_same_bits(y, _torch_out(expected), f"trial {trial}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_core_block_fake_quantize_takes_numpy_extension_floats_as_the_observers_do(dtype):
    """``oc.mx_fake_quantize``/``oc.bfp_fake_quantize`` on a NumPy ml_dtypes array (they raised NumPy's
    ``TypeError``) keep its dtype and give JAX's result for the same array: computed in float32, rounded once."""
    dt = getattr(ml_dtypes, dtype)
    rng = np.random.default_rng(sum(map(ord, dtype)))
    for trial in range(6):
        x = (rng.standard_normal((4, 64)) * 10.0 ** rng.uniform(-3, 3)).astype(dt)
        if trial % 3 == 2:
            x[0, :3] = [np.nan, np.inf, -np.inf]
        x32 = x.astype(np.float32)
        finite = np.nan_to_num(x32, nan=0.0, posinf=1e3, neginf=-1e3)  # normal scales (XLA:CPU flushes subnormals)
        amax = np.abs(finite).reshape(4, 2, 32).max(-1)
        lo, hi = finite.reshape(4, 8, 8).min(-1), finite.reshape(4, 8, 8).max(-1)
        for fq, code, kw in ((oc.mx_fake_quantize, oc.mx_scale(amax).exponent, {}),
                             (oc.bfp_fake_quantize, oc.bfp_scale(lo, hi).exponent, {"block_size": 8})):
            y = fq(x, code, **kw)
            assert y.dtype == dt, (fq.__name__, y.dtype)
            assert_same_bits(y, np.asarray(fq(jnp.asarray(x), jnp.asarray(code), **kw)), f"{fq.__name__}, trial {trial}")


@pytest.mark.parametrize("call", ["aminmax", "block_aminmax", "mx_scale", "bfp_scale", "minmax_update"])
def test_core_statistics_name_a_numpy_extension_float_input(call):
    """The statistics functions take no ml_dtypes array (the observers cast it to float32 first): a
    ``TypeError`` naming the argument and the cast (it was NumPy's "dtype argument must be a NumPy dtype")."""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32).astype(ml_dtypes.bfloat16)
    calls = {
        "aminmax": (lambda: oc.aminmax(x), "x"),
        "block_aminmax": (lambda: oc.block_aminmax(x, axis=-1, block_size=32), "x"),
        "mx_scale": (lambda: oc.mx_scale(x[:, 0]), "amax"),
        "bfp_scale": (lambda: oc.bfp_scale(x[:, 0], x[:, 1]), "min_val"),
        "minmax_update": (lambda: oc.minmax_update(oc.minmax_init(xp=np), x), "x"),
    }
    fn, name = calls[call]
    with pytest.raises(TypeError, match=f"^{name} must hold real floating or integer values, got dtype bfloat16.*"
                                        f"cast {name} to float32"):
        fn()


# ------------------------------------------------------------------------------------- NaN inputs


@pytest.mark.parametrize("cls, kw", _params(CASES))
def test_nan_inputs_fake_quantize_quietly_with_torchs_result(cls, kw):
    """NaN/+-Inf inputs, and statistics that saw +-Inf (an infinite scale) or NaN too: NumPy's result is torch's
    (NaN in, NaN out) without a ``RuntimeWarning`` (``inf * 0``, ``inf / inf`` warned), with and without
    ``ignore_nonfinite`` (bfloat16 inputs: the test above)."""
    rng = np.random.default_rng(sum(map(ord, repr((cls, kw)))) + 1)
    fit_values = [(), (np.inf, -np.inf), (np.nan, np.inf, -np.inf), (np.inf,)]
    for trial in range(8):
        fit, x = _data(rng, nonfinite=True, fit_values=fit_values[trial % 4])
        opts = {"nonfinite_kw": trial >= 4 and cls != "PerBlockBFPObserver"}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = numpy_fq(cls, kw, fit, x, **opts)
        assert np.isnan(y.astype(np.float32)).any()
        assert_same_bits(y, torch_fq(cls, kw, fit, x, **opts), f"numpy vs torch, trial {trial}")


# ---------------------------------------------------------------------------------- signed zeros


@pytest.mark.parametrize("cls, kw", _params(SYMMETRIC_SIGNED))
def test_jax_symmetric_integers_give_positive_zero_as_torch_and_numpy(cls, kw):
    """Small negative inputs of the symmetric signed formats quantize to ``0.0`` on JAX as on torch and
    NumPy (JAX gave ``-0.0``: its compiled zero point is a constant zero, whose addition XLA drops); every
    value bit for bit."""
    rng = np.random.default_rng(sum(map(ord, repr((cls, kw)))) + 2)
    for trial in range(4):
        fit, x = _data(rng, nonfinite=trial == 3)
        y = jax_fq(cls, kw, fit, x)
        expected = torch_fq(cls, kw, fit, x)
        assert (np.signbit(expected) & (expected == 0)).sum() == 0  # torch never gives -0.0 here
        assert_same_bits(y, expected, f"jax vs torch, trial {trial}")
        assert_same_bits(numpy_fq(cls, kw, fit, x), expected, f"numpy vs torch, trial {trial}")


def test_core_fake_quantize_under_jit_keeps_the_sign_of_zero_of_an_eager_run():
    """``oc.fake_quantize`` under ``jax.jit`` with a zero point that is a compile-time zero: ``0.0``, as
    with the zero point as an argument and as NumPy and torch (it gave ``-0.0``); NaN stays NaN."""
    x = np.array([-0.001, 0.001, -0.0, 0.0, -0.3, np.nan, -np.inf], np.float32)
    kw = dict(quant_min=-128, quant_max=127)
    const = jax.jit(lambda v, s: oc.fake_quantize(v, s, jnp.zeros((), jnp.int32), **kw))
    traced = jax.jit(lambda v, s, z: oc.fake_quantize(v, s, z, **kw))
    expected = oc.fake_quantize(x, np.float32(0.0157), np.int32(0), **kw)
    assert not np.signbit(expected[:4]).any()
    assert_same_bits(np.asarray(const(jnp.asarray(x), jnp.float32(0.0157))), expected, "constant zero point")
    assert_same_bits(np.asarray(traced(jnp.asarray(x), jnp.float32(0.0157), jnp.int32(0))), expected, "argument")
    torch_y = oc.fake_quantize(torch.from_numpy(x), torch.tensor(0.0157), torch.tensor(0), **kw)
    assert_same_bits(torch_y.numpy(), expected, "torch")
