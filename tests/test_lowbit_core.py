"""Low-bit formats: per-group integers, fp8 scaling, OCP MX and BFP16.

Oracles: torchao (``choose_qparams_affine``, ``_fake_quantize_affine``, ``mx_formats.to_mx`` /
``to_dtype``) where it has the feature, torch's native float8 casts, and the float64 NumPy references
of ``_lowbit_reference`` (written from the formulas and the OCP MX v1.0 spec). The core runs on every
backend of the ``xp`` fixture, JAX under ``jax.jit``.
"""

from __future__ import annotations

import functools
import math
import warnings

import array_api_compat
import numpy as np
import pytest
import torch

import _lowbit_reference as ref
import observers_core as oc
from conftest import to_numpy

ELEMENTS = list(oc.MX_ELEMENTS)
ROUNDINGS = list(oc.MX_ROUNDINGS)
MAX_NORMAL = {name: fmt[4] for name, fmt in ref.FORMATS.items()}


@pytest.fixture(scope="module")
def torchao_mx():
    """torchao's MX reference code (``to_mx``, ``to_dtype``, scale modes), or a skip with the reason."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import get_fp_scale, to_dtype, to_mx
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"torchao.prototype.mx_formats does not import here: {exc!r}")
    elements = {
        "fp8_e4m3": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
        "fp6_e3m2": "fp6_e3m2",
        "fp6_e2m3": "fp6_e2m3",
        "fp4_e2m1": torch.float4_e2m1fn_x2,
    }
    modes = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
             "even": ScaleCalculationMode.EVEN, "rceil": ScaleCalculationMode.RCEIL}
    return dict(to_mx=to_mx, to_dtype=to_dtype, get_fp_scale=get_fp_scale, elements=elements, modes=modes)


@pytest.fixture(scope="module")
def torchao_affine():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization.quant_primitives import (
                MappingType,
                _fake_quantize_affine,
                choose_qparams_affine,
            )
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"torchao.quantization.quant_primitives does not import here: {exc!r}")
    return dict(choose=choose_qparams_affine, fake=_fake_quantize_affine, mapping=MappingType)


def call(backend, fn, *arrays, **config):
    """``fn(*arrays, **config)`` on ``backend`` (JAX: under ``jax.jit`` with the config static)."""
    args = [backend.asarray(a) for a in arrays]
    if backend.name.startswith("jax"):
        import jax

        return jax.jit(functools.partial(fn, **config))(*args)
    return fn(*args, **config)


def mx_pipeline(a, *, element="fp8_e4m3", rounding="floor", axis=-1, block_size=32):
    """Block amax -> shared exponent, as an observer does (jit-able: config is static)."""
    xp = array_api_compat.array_namespace(a)
    lo, hi = oc.block_aminmax(a, axis=axis, block_size=block_size)
    return oc.mx_scale(xp.maximum(-lo, hi), element=element, rounding=rounding)


def _same(a, b) -> bool:
    """Equal, with NaN == NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


# ------------------------------------------------------------------------------------------- data


def mx_rows(rng, *, subnormals: bool, nonfinite: bool = True) -> np.ndarray:
    """Float32 blocks of 32 whose largest magnitude is a hard case for the shared exponent: random
    scales, exact powers of two, one ulp below / above them, ``max_normal * 2**k`` (+/- one ulp, the
    rceil boundary), the ``even`` thresholds ``(2 - 2**-(m + 1)) * 2**k``, zeros, tiny normals, float32's
    largest values, and (optionally) subnormals, NaN and Inf."""
    f32 = np.float32
    peaks = []
    for k in (-100, -20, -1, 0, 3, 9, 40):
        p = f32(2.0**k)
        peaks += [p, np.nextafter(p, f32(0)), np.nextafter(p, f32(np.inf))]
    for k in (-30, 0, 7):
        for mx in (448.0, 57344.0, 28.0, 7.5, 6.0, 127 / 64):
            p = f32(mx * 2.0**k)
            peaks += [p, np.nextafter(p, f32(0)), np.nextafter(p, f32(np.inf))]
        for m in (1, 2, 3, 6):
            p = f32((2 - 2.0 ** -(m + 1)) * 2.0**k)
            peaks += [p, np.nextafter(p, f32(0))]
    peaks += [f32(3.0e38), np.finfo(np.float32).max]
    rows = []
    for peak in peaks:
        row = rng.uniform(-1, 1, 32).astype(np.float32) * peak * f32(0.9)
        row[rng.integers(32)] = peak * rng.choice([-1, 1])
        rows.append(row)
    for _ in range(6):
        rows.append((rng.standard_normal(32) * 2.0 ** rng.integers(-30, 30)).astype(np.float32))
    rows.append(np.zeros(32, np.float32))
    tiny = (2.0 ** rng.uniform(-125, -119, 32) * rng.choice([-1, 1], 32)).astype(np.float32)
    tiny[::5] = 0
    rows.append(tiny)
    if subnormals:
        rows.append((2.0 ** rng.integers(-149, -127, 32) * rng.choice([-1, 1], 32)).astype(np.float32))
        rows.append(np.concatenate([np.full(16, 2.0**-130), np.full(16, -(2.0**-127) * 1.5)]).astype(np.float32))
    if nonfinite:
        row = rng.standard_normal(32).astype(np.float32)
        row[3] = np.nan
        rows.append(row)
        row = rng.standard_normal(32).astype(np.float32)
        row[7] = -np.inf
        rows.append(row)
    return np.stack(rows)


def _rceil_boundary(x: np.ndarray, element: str) -> np.ndarray:
    """Blocks whose float32 quotient ``amax / max_normal`` lies just above a power of two (within
    2**-20), where torchao's eager rceil takes ``ceil(log2(q))`` in float32 and rounds it down."""
    with np.errstate(all="ignore"):
        q = np.max(np.abs(x), axis=-1) / np.float32(MAX_NORMAL[element])
        _, e = np.frexp(q.astype(np.float64))
        rel = q.astype(np.float64) / np.ldexp(0.5, e) - 1
    return np.isfinite(q) & (q > 0) & (rel > 0) & (rel < 2.0**-20)


# -------------------------------------------------------------------------------- MX vs torchao


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("element", ELEMENTS[:5])
def test_mx_exponent_matches_torchao(torchao_mx, element, rounding):
    """Shared exponents (E8M0 codes) and float scales equal torchao's ``to_mx`` on zeros, subnormals,
    powers of two and one ulp around them; Inf blocks are left out (torchao reads the float32 exponent
    of Inf, 128, and gives ``128 - emax``; we saturate to 254) and, for rceil, the blocks just above a
    ``max_normal * 2**k`` boundary (torchao's eager rceil rounds ``log2`` in float32; see
    ``test_mx_rceil_rounds_the_float32_quotient_up``)."""
    x = mx_rows(np.random.default_rng(0), subnormals=True)
    keep = ~np.isinf(x).any(axis=1)
    if rounding == "rceil":
        boundary = _rceil_boundary(x, element)
        assert boundary.sum() >= 3  # the data does reach the boundary
        keep &= ~boundary
    x = np.ascontiguousarray(x[keep])
    scale_t, _ = torchao_mx["to_mx"](torch.from_numpy(x), torchao_mx["elements"][element], 32, torchao_mx["modes"][rounding])
    ours = oc.mx_scale(np.max(np.abs(x), axis=-1, keepdims=True), element=element, rounding=rounding)
    np.testing.assert_array_equal(ours.exponent, scale_t.view(torch.uint8).numpy())
    assert _same(ours.scale, torchao_mx["get_fp_scale"](scale_t).numpy())
    np.testing.assert_array_equal(ours.exponent, ref.mx_codes(x, element, rounding))


@pytest.mark.parametrize("element", ELEMENTS[:5])
def test_mx_fake_quantize_matches_torchao(torchao_mx, element):
    """Quantize-dequantize equals torchao's ``to_dtype(to_mx(x))`` (floor) on every block with a
    nonzero exponent code. For code 0 torchao divides by ``2**-126`` (it clamps the scale to the
    smallest normal) but multiplies back by ``2**-127``, halving the block; we use ``2**-127`` both ways."""
    x = mx_rows(np.random.default_rng(1), subnormals=True)
    x = np.ascontiguousarray(x[~np.isinf(x).any(axis=1)])
    tel = torchao_mx["elements"][element]
    scale_t, data_t = torchao_mx["to_mx"](torch.from_numpy(x), tel, 32)
    y_t = torchao_mx["to_dtype"](data_t, scale_t, tel, 32, torch.float32).numpy()
    code = oc.mx_scale(np.max(np.abs(x), axis=-1, keepdims=True), element=element).exponent
    y = oc.mx_fake_quantize(x, code, element=element)
    nonzero_code = code[:, 0] > 0
    assert nonzero_code.sum() >= 40 and (~nonzero_code).sum() >= 3
    assert _same(y[nonzero_code], y_t[nonzero_code])
    assert _same(y, ref.mx_fake_quantize(x, code, element))


def test_mx_rceil_rounds_the_float32_quotient_up():
    """rceil is ``ceil(log2(fl32(amax / max_normal)))`` exactly (``cvt.rp.satfinite.ue8m0``): one ulp
    above ``448 * 2**k`` already takes the next exponent."""
    k = np.arange(-20, 21)
    amax = np.nextafter((448.0 * 2.0**k).astype(np.float32), np.float32(np.inf))[:, None]
    codes = oc.mx_scale(amax, element="fp8_e4m3", rounding="rceil").exponent[:, 0]
    q = (amax[:, 0] / np.float32(448)).astype(np.float64)
    expected = np.array([min(max(ref.floor_log2(v) + (v != 2.0 ** ref.floor_log2(v)), -127), 127) + 127 for v in q])
    np.testing.assert_array_equal(codes, expected)
    assert (codes[q > 2.0**k] == k[q > 2.0**k] + 128).all()


# ------------------------------------------------------------------------- MX on every backend


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("element", ELEMENTS)
def test_mx_exponent_reference(backend, element, rounding):
    """E8M0 codes equal the float64 reference on every backend (no subnormal inputs: XLA on CPU
    flushes them to zero, see ``test_mx_subnormal_inputs``), including NaN, Inf and zero blocks."""
    x = mx_rows(np.random.default_rng(2), subnormals=False)

    out = call(backend, mx_pipeline, x, element=element, rounding=rounding)
    np.testing.assert_array_equal(to_numpy(out.exponent), ref.mx_codes(x, element, rounding))
    expected_scale = np.where(to_numpy(out.exponent) == 255, np.nan, np.ldexp(1.0, to_numpy(out.exponent).astype(int) - 127))
    assert _same(to_numpy(out.scale), expected_scale)
    assert to_numpy(out.exponent).dtype == np.uint8


@pytest.mark.parametrize("element", ELEMENTS)
def test_mx_fake_quantize_reference(backend, element):
    """Fake-quantized values of every element type equal the float64 reference (nearest, ties to even,
    saturating) on every backend; NaN blocks are all NaN; an Inf block (code 254) keeps +/-Inf and
    flushes its finite values."""
    x = mx_rows(np.random.default_rng(3), subnormals=False)
    codes = ref.mx_codes(x, element, "floor").astype(np.uint8)
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, codes, element=element))
    with np.errstate(over="ignore"):
        expected = ref.mx_fake_quantize(x, codes, element).astype(np.float32)  # exact, or inf past float32
    assert y.dtype == np.float32
    assert _same(y, expected)
    nan_row = np.isnan(x).any(axis=1)
    assert np.isnan(y[nan_row]).all()
    inf_row = np.isinf(x).any(axis=1) & ~nan_row
    assert (codes[inf_row] == 254).all()
    with np.errstate(over="ignore"):  # max_normal * 2**127 > float32 max except for int8 (127/64 * 2**127)
        assert (np.abs(y[inf_row][np.isinf(x[inf_row])]) == np.float32(MAX_NORMAL[element] * 2.0**127)).all()
    assert (y[inf_row][np.isfinite(x[inf_row])] == 0).all()


def test_mx_fp4_takes_exactly_the_spec_values(backend):
    """fp4 e2m1 yields ``{0, 0.5, 1, 1.5, 2, 3, 4, 6} * X`` with sign; ties go to the even mantissa
    (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4) and |v| > 6 saturates."""
    X = 2.0**-3
    v = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, 0.1, 0.26, 0.5, 1.5, 3.0, 6.0, 4.2], np.float32)
    expected = np.array([0, 1, 1, 2, 2, 4, 4, 6, 6, 0, 0.5, 0.5, 1.5, 3, 6, 4], np.float32)
    x = np.concatenate([v, -v, np.zeros(32, np.float32)]) * np.float32(X)
    code = np.array([127 - 3, 127 - 3], np.uint8)
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, code, element="fp4_e2m1"))
    np.testing.assert_array_equal(y[:32], np.concatenate([expected, -expected]) * np.float32(X))
    assert set(np.abs(y).tolist()) <= {v * X for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)}


def test_mx_special_blocks(backend):
    """All-zero block -> code 0 and zeros; a NaN anywhere -> code 255 and a NaN block; Inf -> code
    254; the last partial block (40 = 32 + 8) is zero-padded; int8 elements are ``k / 64``, ``|k| <= 127``."""
    rng = np.random.default_rng(4)
    x = np.concatenate([np.zeros(32), rng.standard_normal(32), [np.inf] + [1.0] * 31, rng.standard_normal(8)])
    x = np.stack([x, x]).astype(np.float32)
    x[1, 40] = np.nan
    lo, hi = call(backend, oc.block_aminmax, x, block_size=32)
    amax = np.maximum(-to_numpy(lo), to_numpy(hi))
    assert amax.shape == (2, 4)
    bs = call(backend, oc.mx_scale, amax, element="int8", rounding="even")
    code = to_numpy(bs.exponent)
    assert code[0, 0] == 0 and code[0, 2] == 254 and code[1, 1] == 255
    np.testing.assert_array_equal(code[:, 3:], ref.mx_codes(x[:, 96:], "int8", "even"))
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, code, element="int8"))
    assert y.shape == x.shape
    assert (y[0, :32] == 0).all() and np.isnan(y[1, 32:64]).all()
    ok = np.isfinite(y[0])
    steps = y[0, ok] / np.ldexp(1.0, np.repeat(code[0].astype(int) - 127, 32)[:104][ok] - 6)
    assert (steps == np.round(steps)).all() and (np.abs(steps) <= 127).all()
    assert _same(y, ref.mx_fake_quantize(x, code, "int8"))


def test_mx_axis_block_size_and_dtypes(backend):
    """Blocks along axis 0 with block size 16 and a partial block; float16 / bfloat16 / integer inputs
    compute in float32 and return the input's floating dtype (float32 for integers)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 3)) * 8).astype(np.float32)
    lo, hi = call(backend, oc.block_aminmax, x, axis=0, block_size=16)
    code = to_numpy(call(backend, oc.mx_scale, np.maximum(-to_numpy(lo), to_numpy(hi)), element="fp6_e3m2", rounding="ceil").exponent)
    assert code.shape == (3, 3)
    np.testing.assert_array_equal(code, ref.mx_codes(x, "fp6_e3m2", "ceil", axis=0, size=16))
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, code, element="fp6_e3m2", axis=0, block_size=16))
    assert _same(y, ref.mx_fake_quantize(x, code, "fp6_e3m2", axis=0, size=16))

    xi = rng.integers(-300, 300, (2, 32)).astype(np.int32)
    ci = ref.mx_codes(xi.astype(np.float32), "fp8_e4m3", "floor").astype(np.uint8)
    yi = to_numpy(call(backend, oc.mx_fake_quantize, xi, ci))
    assert yi.dtype == np.float32 and _same(yi, ref.mx_fake_quantize(xi, ci, "fp8_e4m3"))
    if backend.name == "array_api_strict":
        return  # no float16 -> numpy round trip needed here; numpy covers float16
    xh = x.astype(np.float16)
    ch = ref.mx_codes(xh.astype(np.float32), "fp4_e2m1", "floor", axis=0, size=16).astype(np.uint8)
    yh = call(backend, oc.mx_fake_quantize, xh, ch, element="fp4_e2m1", axis=0, block_size=16)
    assert to_numpy(yh).dtype == np.float16
    assert _same(to_numpy(yh), ref.mx_fake_quantize(xh, ch, "fp4_e2m1", axis=0, size=16).astype(np.float16))


def test_mx_bfloat16_torch():
    """bfloat16 input (torch): same codes as its float32 upcast, output bfloat16."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) * 100
    lo, hi = oc.block_aminmax(x)
    code = oc.mx_scale(torch.maximum(-lo, hi), element="fp8_e5m2", rounding="even").exponent
    xf = x.float().numpy()
    np.testing.assert_array_equal(code.numpy(), ref.mx_codes(xf, "fp8_e5m2", "even"))
    y = oc.mx_fake_quantize(x, code, element="fp8_e5m2")
    assert y.dtype == torch.bfloat16
    assert _same(y.float().numpy(), torch.from_numpy(ref.mx_fake_quantize(xf, code.numpy(), "fp8_e5m2")).to(torch.bfloat16).float().numpy())


def test_mx_subnormal_inputs(backend):
    """Subnormal float32 blocks get code 0 (``X = 2**-127``) and are reproduced where representable
    (numpy, array_api_strict, torch). XLA on CPU treats subnormal operands as zero: JAX gives zeros."""
    x = mx_rows(np.random.default_rng(6), subnormals=True, nonfinite=False)[-2:]
    code = to_numpy(call(backend, mx_pipeline, x).exponent)
    if not (backend.name.startswith("jax") and jax_flushes_subnormals()):
        np.testing.assert_array_equal(code, 0)
    code = np.zeros_like(code)
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, code))
    expected = ref.mx_fake_quantize(x, code, "fp8_e4m3").astype(np.float32)
    if backend.name.startswith("jax") and jax_flushes_subnormals():
        assert (y == 0).all()
    else:
        assert _same(y, expected) and (expected != 0).any()


@functools.lru_cache(maxsize=None)
def jax_flushes_subnormals() -> bool:
    import jax
    import jax.numpy as jnp

    return float(jax.jit(lambda a: a * 2)(jnp.float32(2.0**-140))) == 0.0


def test_mx_float64_and_e8m0_clamp():
    """float64 amax outside the E8M0 range clamps: ``1e300`` -> 254, ``1e-300`` -> 0 (numpy, torch)."""
    for xp_arr in (np.asarray, torch.as_tensor):
        amax = xp_arr(np.array([[1e300], [1e-300], [3.0], [2.0**-140]]))
        code = to_numpy(oc.mx_scale(amax, element="fp8_e4m3").exponent)[:, 0]
        np.testing.assert_array_equal(code, [254, 0, 128 - 8, 0])
        x = xp_arr(np.full((1, 32), 1e300))
        y = to_numpy(oc.mx_fake_quantize(x, xp_arr(np.array([[254]], np.uint8))))
        assert (y == 448 * 2.0**127).all()
