"""The generic array observers (``observers_core.adapters._array_observers``) on numpy and array_api_strict.

Oracle: the installed ``torch.ao.quantization.observer`` fed the same data. The helpers at the top
(case grid, torch runner, bitwise comparison) are also used by test_jax_adapter.py and
test_cupy_adapter.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

try:  # bfloat16 for numpy (installed with jax); without it the bfloat16 cases are left out
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

torch = pytest.importorskip("torch")
import torch.ao.quantization.observer as tao  # noqa: E402

from observers_core import QUANT_DTYPES, QScheme  # noqa: E402
from observers_core.adapters import _array_observers as base  # noqa: E402

from conftest import to_numpy  # noqa: E402

PER_TENSOR = ("MinMaxObserver", "MovingAverageMinMaxObserver")
PER_CHANNEL = ("PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver")
MINMAX_CLASSES = PER_TENSOR + PER_CHANNEL
PER_TENSOR_SCHEMES = ("per_tensor_affine", "per_tensor_symmetric")
PER_CHANNEL_SCHEMES = ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams")
SHAPES = ((), (7,), (3, 5), (2, 3, 4), (2, 3, 2, 3))
KINDS = (
    "normal", "constant", "negative", "positive", "subnormal", "huge",
    "float16", "bfloat16", "float64", "int32", "uint8", "int64",
)
if ml_dtypes is None:
    KINDS = tuple(k for k in KINDS if k != "bfloat16")
F32_TINY = float(np.finfo(np.float32).tiny)


# --------------------------------------------------------------------------- data and the torch oracle
def make_batch(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """One input of ``kind``: random data of the dtype the kind names (float32 unless said otherwise)."""
    normal = rng.standard_normal(shape)
    if kind == "normal":
        return (normal * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    if kind == "constant":
        return np.full(shape, rng.choice([0.0, 1.5, -2.25, 1e-3]), dtype=np.float32)
    if kind == "negative":
        return (-np.abs(normal) - 0.25).astype(np.float32)
    if kind == "positive":
        return (np.abs(normal) + 0.25).astype(np.float32)
    if kind == "subnormal":  # float32 subnormals around 1e-41, both signs
        return (normal * 1e-41).astype(np.float32)
    if kind == "huge":  # near float32 max: ranges overflow to inf
        return np.clip(normal * 2e38, -3.4e38, 3.4e38).astype(np.float32)
    if kind == "float16":
        return (normal * 100).astype(np.float16)
    if kind == "bfloat16":
        return (normal * 100).astype(ml_dtypes.bfloat16)
    if kind == "float64":
        return normal * 1e3
    if kind == "int32":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int32)
    if kind == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if kind == "int64":
        return rng.integers(-(2**30), 2**30, size=shape, dtype=np.int64)
    raise AssertionError(kind)


def to_torch(a: np.ndarray) -> "torch.Tensor":
    """A numpy array as a torch tensor with the same dtype (bfloat16 through its bits)."""
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def torch_kwargs(kwargs: dict) -> dict:
    """Our constructor kwargs with names turned into torch's dtype and qscheme objects."""
    out = dict(kwargs)
    out.pop("ignore_nonfinite", None)
    if "dtype" in out:
        out["dtype"] = getattr(torch, out["dtype"])
    if "qscheme" in out:
        out["qscheme"] = getattr(torch, QScheme.parse(out["qscheme"]).value)
    return out


def run_torch(cls_name: str, kwargs: dict, batches) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """torch.ao's observer over ``batches``: its state_dict and qparams as numpy arrays."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obs = getattr(tao, cls_name)(**torch_kwargs(kwargs))
        for b in batches:
            obs(to_torch(b))
        scale, zp = obs.calculate_qparams()
    sd = {k: v.numpy() for k, v in obs.state_dict().items()}
    return sd, (scale.numpy(), zp.numpy())


def run_ours(obs, batches, asarray) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """Our observer over ``batches`` (each converted by ``asarray``): state_dict and qparams as numpy."""
    for b in batches:
        x = asarray(b)
        assert obs(x) is x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "must run observer before..." for all-empty inputs, as torch
        scale, zp = obs.calculate_qparams()
    sd = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    return sd, (to_numpy(scale), to_numpy(zp))


def ftz(a: np.ndarray) -> np.ndarray:
    """float32 values with subnormals flushed to (signed) zero, as XLA:CPU computes."""
    a = np.asarray(a, dtype=np.float32)
    return np.where(np.abs(a) < F32_TINY, np.copysign(np.float32(0), a), a).astype(np.float32)


def assert_same_bits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Same shape, NaN at the same places, every other float32 equal bit for bit."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != torch {ref.shape}"
    ours32, ref32 = ours.astype(np.float32), ref.astype(np.float32)
    nan_o, nan_r = np.isnan(ours32), np.isnan(ref32)
    assert np.array_equal(nan_o, nan_r), f"{what}: NaN at different places: {ours32} vs torch {ref32}"
    keep = ~nan_r
    assert np.array_equal(ours32[keep].view(np.uint32), ref32[keep].view(np.uint32)), (
        f"{what}: {ours32[keep].tolist()} != torch {ref32[keep].tolist()}"
    )


def assert_parity(ours, ref, *, flush_subnormals: bool = False) -> None:
    """min/max and scale bit for bit, zero point equal in value (dtypes differ, see the adapters' docs).

    ``flush_subnormals``: compare against torch's min/max (and float zero point) with subnormals
    flushed to zero on both sides (XLA:CPU and CuPy flush them, in some operations); -0.0 and +0.0 then
    count as equal.
    """
    (sd, (scale, zp)), (ref_sd, (ref_scale, ref_zp)) = ours, ref
    assert list(sd) == list(ref_sd)
    assert_same_bits(sd["eps"], ref_sd["eps"], "eps")
    for key in ("min_val", "max_val"):
        if flush_subnormals:
            np.testing.assert_array_equal(ftz(sd[key]), ftz(ref_sd[key]), err_msg=key)
        else:
            assert_same_bits(sd[key], ref_sd[key], key)
    assert_same_bits(scale, ref_scale, "scale")
    assert zp.shape == ref_zp.shape
    if ref_zp.dtype.kind == "f":  # per_channel_affine_float_qparams: a float zero point
        assert zp.dtype.kind == "f"
        if flush_subnormals:
            np.testing.assert_array_equal(ftz(zp), ftz(ref_zp), err_msg="zero_point")
        else:
            assert_same_bits(zp, ref_zp, "zero_point")
    else:
        assert zp.dtype.kind == "i"
        keep = ~np.isnan(ref_scale) if ref_scale.shape == ref_zp.shape else slice(None)
        np.testing.assert_array_equal(zp.astype(np.int64)[keep], ref_zp.astype(np.int64)[keep], err_msg="zero_point")


CUSTOM_RANGES = ((0, 15), (-8, 7), (-3, 100), (0, 255))


def parity_cases(seed: int, n: int, *, kinds=KINDS, averaging_constants=(0.01, 0.3, 1.0)) -> list:
    """``n`` seeded random cases ``(id, cls_name, kwargs, batches)`` over dtype x qscheme x reduce_range x
    custom range x shape x ch_axis (every one, negative too) x input kind x number of batches."""
    rng = np.random.default_rng(seed)
    kind_cycle = []  # every kind once per cycle, in a random order: all kinds are covered, paired with varied classes
    cases = []
    while len(cases) < n:
        cls_name = MINMAX_CLASSES[len(cases) % len(MINMAX_CLASSES)]
        per_channel = cls_name in PER_CHANNEL
        kwargs = {"dtype": str(rng.choice(QUANT_DTYPES))}
        kwargs["qscheme"] = str(rng.choice(PER_CHANNEL_SCHEMES if per_channel else PER_TENSOR_SCHEMES))
        kwargs["reduce_range"] = bool(rng.random() < 0.3)
        if kwargs["reduce_range"] and kwargs["dtype"] == "quint8" and "symmetric" in kwargs["qscheme"]:
            kwargs["reduce_range"] = False  # rejected by torch and by us (tested separately)
        if rng.random() < 0.3:
            kwargs["quant_min"], kwargs["quant_max"] = CUSTOM_RANGES[rng.integers(len(CUSTOM_RANGES))]
        if rng.random() < 0.15:
            kwargs["eps"] = 1e-3
        if "MovingAverage" in cls_name:
            kwargs["averaging_constant"] = float(rng.choice(averaging_constants))
        shapes = SHAPES[2:] if per_channel else SHAPES  # torch's per-channel observers need ndim >= 2
        shape = shapes[rng.integers(len(shapes))]
        if per_channel:
            kwargs["ch_axis"] = int(rng.integers(-len(shape), len(shape)))
        if not kind_cycle:
            kind_cycle = [str(k) for k in rng.permutation(kinds)]
        kind = kind_cycle.pop()
        batches = [make_batch(rng, kind, shape) for _ in range(int(rng.integers(1, 4)))]
        if rng.random() < 0.2:  # an empty input in between: a no-op
            empty_shape = (0,) + shape[1:] if shape else (0,)
            if per_channel:
                empty_shape = tuple(0 if i != kwargs["ch_axis"] % len(shape) else s for i, s in enumerate(shape))
            batches.insert(int(rng.integers(0, len(batches) + 1)), np.zeros(empty_shape, np.float32))
        case_id = f"{len(cases)}-{cls_name}-{kwargs['dtype']}-{kwargs['qscheme']}-{kind}-{shape}"
        cases.append(pytest.param(cls_name, kwargs, batches, kind, id=case_id))
    return cases


# --------------------------------------------------------------------------- backends for this file
def _numpy_backend():
    return {"xp": None, "asarray": np.asarray, "kinds": KINDS}


def _strict_backend():
    import array_api_strict as xps

    def asarray(a):
        return xps.asarray(a)

    # array_api_strict has no float16/bfloat16
    return {"xp": xps, "asarray": asarray, "kinds": tuple(k for k in KINDS if k not in ("float16", "bfloat16"))}


BACKENDS = {"numpy": _numpy_backend, "array_api_strict": _strict_backend}


@pytest.fixture(params=list(BACKENDS))
def generic(request):
    if request.param == "array_api_strict":
        pytest.importorskip("array_api_strict")
    return BACKENDS[request.param]()


def make(cls_name: str, generic: dict, **kwargs):
    return getattr(base, cls_name)(xp=generic["xp"], **kwargs)


# --------------------------------------------------------------------------- parity with torch.ao
@pytest.mark.parametrize("cls_name, kwargs, batches, kind", parity_cases(seed=1234, n=160))
def test_parity_with_torch(generic, cls_name, kwargs, batches, kind):
    if kind not in generic["kinds"]:
        pytest.skip(f"{kind} input does not exist in this namespace")
    ours = run_ours(make(cls_name, generic, **kwargs), batches, generic["asarray"])
    assert_parity(ours, run_torch(cls_name, kwargs, batches))


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
@pytest.mark.parametrize("where", ["first", "later"])
def test_nan_poisons_by_default_like_torch(generic, cls_name, where):
    rng = np.random.default_rng(5)
    kwargs = {"ch_axis": 1} if cls_name in PER_CHANNEL else {}
    batches = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(2)]
    batches[0 if where == "first" else 1][1, 2, 3] = np.nan
    ours = run_ours(make(cls_name, generic, **kwargs), batches, generic["asarray"])
    ref = run_torch(cls_name, kwargs, batches)
    assert_same_bits(ours[0]["min_val"], ref[0]["min_val"], "min_val")
    assert_same_bits(ours[0]["max_val"], ref[0]["max_val"], "max_val")
    assert np.isnan(ours[0]["min_val"]).any()
    assert_same_bits(ours[1][0], ref[1][0], "scale")


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_ignore_nonfinite_skips_nan_and_inf(generic, cls_name):
    rng = np.random.default_rng(6)
    per_channel = cls_name in PER_CHANNEL
    kwargs = {"ch_axis": 0} if per_channel else {}
    batches = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(3)]
    batches[0][1, 2], batches[1][2, 0], batches[2][3, 5] = np.nan, np.inf, -np.inf
    batches[1][3, :] = np.nan  # channel 3 of batch 1 has no finite value
    obs = make(cls_name, generic, ignore_nonfinite=True, **kwargs)
    sd, _ = run_ours(obs, batches, generic["asarray"])
    # float64 reference, written out: the same update over the finite values only
    c = getattr(obs, "averaging_constant", None)
    lo = hi = None
    for b in batches:
        f = np.where(np.isfinite(b), b.astype(np.float64), np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN channel
            b_lo, b_hi = (np.nanmin(f, axis=1), np.nanmax(f, axis=1)) if per_channel else (np.nanmin(f), np.nanmax(f))
        if lo is None:
            lo, hi = b_lo, b_hi
        elif c is None:
            lo, hi = np.fmin(lo, b_lo), np.fmax(hi, b_hi)
        else:
            seen = ~np.isnan(b_lo)
            lo = np.where(seen, lo + c * (np.nan_to_num(b_lo) - lo), lo)
            hi = np.where(seen, hi + c * (np.nan_to_num(b_hi) - hi), hi)
    np.testing.assert_allclose(sd["min_val"], lo, rtol=1e-6)
    np.testing.assert_allclose(sd["max_val"], hi, rtol=1e-6)
    assert np.isfinite(sd["min_val"]).all() and np.isfinite(sd["max_val"]).all()


def test_ignore_nonfinite_channel_without_finite_values(generic):
    x = np.array([[1.0, -2.0], [np.nan, np.inf]], dtype=np.float32)
    obs = make("PerChannelMinMaxObserver", generic, ch_axis=0, ignore_nonfinite=True)
    obs(generic["asarray"](x))
    sd = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    np.testing.assert_array_equal(sd["min_val"], [-2.0, np.inf])
    np.testing.assert_array_equal(sd["max_val"], [1.0, -np.inf])
    scale, zp = (to_numpy(a) for a in obs.calculate_qparams())
    assert scale[1] == 1.0 and zp[1] == 0  # the "nothing seen" default for that channel
    ref = base.PerChannelMinMaxObserver(ch_axis=0)  # channel 0 as if alone
    ref(np.array([[1.0, -2.0]], np.float32))
    assert scale[0] == to_numpy(ref.calculate_qparams()[0])[0]


# --------------------------------------------------------------------------- state dict
@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_state_dict_of_a_fresh_observer_matches_torch(generic, cls_name):
    sd = {k: to_numpy(v) for k, v in make(cls_name, generic).state_dict().items()}
    ref = {k: v.numpy() for k, v in getattr(tao, cls_name)().state_dict().items()}
    assert list(sd) == list(ref)
    for k in ref:
        assert sd[k].shape == ref[k].shape and sd[k].dtype == ref[k].dtype, k
        assert_same_bits(sd[k], ref[k], k)


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_calculate_qparams_before_any_input_warns_and_matches_torch(generic, cls_name):
    with pytest.warns(UserWarning, match="must run observer"):
        scale, zp = make(cls_name, generic).calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_scale, ref_zp = getattr(tao, cls_name)().calculate_qparams()
    assert_same_bits(to_numpy(scale), ref_scale.numpy(), "scale")
    np.testing.assert_array_equal(to_numpy(zp), ref_zp.numpy())


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_state_dict_round_trip_and_torch_interop(generic, cls_name):
    rng = np.random.default_rng(7)
    kwargs = {"ch_axis": -1, "qscheme": "per_channel_symmetric", "dtype": "qint8"} if cls_name in PER_CHANNEL else {}
    batches = [rng.standard_normal((3, 5)).astype(np.float32) * 3 for _ in range(2)]
    obs = make(cls_name, generic, eps=1e-4, **kwargs)
    ours = run_ours(obs, batches, generic["asarray"])

    # ours -> ours (framework arrays and numpy arrays)
    for sd in (obs.state_dict(), ours[0]):
        other = make(cls_name, generic, **kwargs)
        other.load_state_dict(sd)
        assert_parity(run_ours(other, [], generic["asarray"]), ours)

    # torch -> ours: a torch.ao observer's state_dict, tensors as they are and as numpy arrays
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_obs = getattr(tao, cls_name)(eps=1e-4, **torch_kwargs(kwargs))
        for b in batches:
            t_obs(to_torch(b))
    for sd in (t_obs.state_dict(), {k: v.numpy() for k, v in t_obs.state_dict().items()}):
        other = make(cls_name, generic, **kwargs)
        other.load_state_dict(sd)
        assert_parity(run_ours(other, [], generic["asarray"]), ours)

    # ours -> torch
    t_new = getattr(tao, cls_name)(**torch_kwargs(kwargs))
    t_new.load_state_dict({k: torch.from_numpy(v) for k, v in ours[0].items()})
    scale, zp = t_new.calculate_qparams()
    assert_same_bits(ours[1][0], scale.numpy(), "scale")
    np.testing.assert_array_equal(ours[1][1], zp.numpy())


def test_uninitialised_per_channel_state_dict_loads_both_ways(generic):
    obs = make("PerChannelMinMaxObserver", generic)
    obs(generic["asarray"](np.ones((2, 3), np.float32)))
    obs.load_state_dict(tao.PerChannelMinMaxObserver().state_dict())  # shape (0,): back to "nothing seen"
    assert obs.state is None and to_numpy(obs.state_dict()["min_val"]).shape == (0,)
    t = tao.PerChannelMinMaxObserver()
    t.load_state_dict({k: torch.from_numpy(to_numpy(v)) for k, v in obs.state_dict().items()})
    assert t.min_val.shape == (0,)


@pytest.mark.parametrize(
    "cls_name, patch, error, match",
    [
        ("MinMaxObserver", {"extra": np.zeros(())}, ValueError, "unexpected: \\['extra'\\]"),
        ("MinMaxObserver", {"min_val": None}, ValueError, "missing: \\['min_val'\\]"),
        ("MinMaxObserver", {"min_val": np.zeros((2,), np.float32)}, ValueError, "min_val.*shape \\(\\)"),
        ("MinMaxObserver", {"eps": np.zeros((), np.float32)}, ValueError, "eps.*shape \\(1,\\)"),
        ("MinMaxObserver", {"eps": np.zeros((1,), np.float32)}, ValueError, "eps.*positive"),
        ("MinMaxObserver", {"min_val": np.array(5.0, np.float32)}, ValueError, "min_val > max_val"),
        ("MinMaxObserver", {"max_val": np.array(True)}, TypeError, "max_val.*real numbers"),
        ("MinMaxObserver", {"max_val": "big"}, TypeError, "max_val.*real numbers"),
        ("PerChannelMinMaxObserver", {"min_val": np.zeros((3,), np.float32)}, ValueError, "\\(C,\\)"),
        ("PerChannelMinMaxObserver", {"min_val": np.zeros((2, 1), np.float32)}, ValueError, "\\(C,\\)"),
        ("PerChannelMinMaxObserver", {"min_val": np.array([0.0, 3.0], np.float32)}, ValueError, "min_val > max_val"),
    ],
)
def test_load_state_dict_rejects_bad_dicts_and_keeps_state(generic, cls_name, patch, error, match):
    kwargs = {"ch_axis": 0} if cls_name in PER_CHANNEL else {}
    obs = make(cls_name, generic, **kwargs)
    obs(generic["asarray"](np.array([[-1.0, 2.0], [0.5, 1.0]], np.float32)))
    before = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    good = {k: v.copy() for k, v in before.items()}
    good.update(patch)
    bad = {k: v for k, v in good.items() if v is not None}
    with pytest.raises(error, match=match):
        obs.load_state_dict(bad)
    after = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_load_state_dict_accepts_nan_and_never_updated_entries(generic):
    obs = make("PerChannelMinMaxObserver", generic)
    sd = {
        "eps": np.array([1e-5], np.float32),
        "min_val": np.array([np.nan, np.inf, -1.0], np.float32),
        "max_val": np.array([1.0, -np.inf, 2.0], np.float32),
    }
    obs.load_state_dict(sd)
    got = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    for k in sd:
        assert_same_bits(got[k], sd[k], k)
    assert obs.eps == float(np.float32(1e-5))


# --------------------------------------------------------------------------- configuration errors
@pytest.mark.parametrize(
    "cls_name, kwargs, error, match",
    [
        ("MinMaxObserver", {"dtype": "qint7"}, ValueError, "dtype='qint7'"),
        ("MinMaxObserver", {"qscheme": "per_tensor_magic"}, ValueError, "qscheme='per_tensor_magic'"),
        ("MinMaxObserver", {"qscheme": "per_channel_affine"}, ValueError, "qscheme='per_channel_affine'.*MinMaxObserver"),
        ("PerChannelMinMaxObserver", {"qscheme": "per_tensor_affine"}, ValueError, "qscheme='per_tensor_affine'"),
        ("MinMaxObserver", {"quant_min": 5, "quant_max": 2}, ValueError, "quant_min"),
        ("MinMaxObserver", {"quant_min": 1, "quant_max": 10}, ValueError, "must include 0"),
        ("MinMaxObserver", {"quant_min": -200, "quant_max": 200, "dtype": "qint8"}, ValueError, "8-bit"),
        ("MinMaxObserver", {"quant_min": 0.0, "quant_max": 10}, TypeError, "quant_min must be an int"),
        ("MinMaxObserver", {"reduce_range": 1}, TypeError, "reduce_range must be a bool"),
        ("MinMaxObserver", {"eps": -1.0}, ValueError, "eps"),
        ("MinMaxObserver", {"eps": "tiny"}, TypeError, "eps"),
        ("MinMaxObserver", {"qscheme": "per_tensor_symmetric", "reduce_range": True}, ValueError, "reduce_range"),
        ("MinMaxObserver", {"ignore_nonfinite": "yes"}, TypeError, "ignore_nonfinite must be a bool"),
        ("MinMaxObserver", {"factory_kwargs": {"dtype": "float64"}}, ValueError, "factory_kwargs"),
        ("MovingAverageMinMaxObserver", {"averaging_constant": 1.5}, ValueError, "averaging_constant=1.5"),
        ("MovingAverageMinMaxObserver", {"averaging_constant": -0.1}, ValueError, "averaging_constant=-0.1"),
        ("MovingAverageMinMaxObserver", {"averaging_constant": float("nan")}, ValueError, "averaging_constant=nan"),
        ("MovingAverageMinMaxObserver", {"averaging_constant": "0.1"}, TypeError, "averaging_constant must be"),
        ("MovingAverageMinMaxObserver", {"averaging_constant": 0.5, "is_dynamic": True}, ValueError, "is_dynamic"),
        ("MovingAveragePerChannelMinMaxObserver", {"averaging_constant": 2}, ValueError, "averaging_constant=2"),
        ("PerChannelMinMaxObserver", {"ch_axis": 1.0}, TypeError, "ch_axis must be an int"),
        ("PerChannelMinMaxObserver", {"ch_axis": True}, TypeError, "ch_axis must be an int"),
        ("PerChannelMinMaxObserver", {"is_dynamic": True}, ValueError, "is_dynamic"),
    ],
)
def test_invalid_configuration(generic, cls_name, kwargs, error, match):
    with pytest.raises(error, match=match):
        make(cls_name, generic, **kwargs)


def test_configuration_is_resolved_like_torch(generic):
    for dtype in QUANT_DTYPES:
        for reduce_range in (False, True):
            for rng_kwargs in ({}, {"quant_min": -3, "quant_max": 100}):
                ours = make("MinMaxObserver", generic, dtype=dtype, reduce_range=reduce_range, **rng_kwargs)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ref = tao.MinMaxObserver(dtype=getattr(torch, dtype), reduce_range=reduce_range, **rng_kwargs)
                assert (ours.quant_min, ours.quant_max) == (ref.quant_min, ref.quant_max)
                assert ours.has_customized_qrange == ref.has_customized_qrange


# --------------------------------------------------------------------------- the pure API, devices
# (bad inputs, empty inputs and reset on every backend: tests/test_contract.py)
def test_update_is_pure_and_state_setter_validates(generic):
    obs = make("PerChannelMinMaxObserver", generic, ch_axis=0)
    x = generic["asarray"](np.array([[1.0, -1.0], [2.0, 5.0]], np.float32))
    s0 = obs.init_state(2)
    s1 = obs.update(s0, x)
    assert obs.state is None and np.isinf(to_numpy(s0.min_val)).all()
    np.testing.assert_array_equal(to_numpy(s1.min_val), [-1.0, 2.0])
    obs.state = s1
    np.testing.assert_array_equal(to_numpy(obs.calculate_qparams()[0]), to_numpy(obs.qparams(s1)[0]))
    with pytest.raises(ValueError, match="shape \\(C,\\)"):
        obs.state = obs.init_state(2)._replace(max_val=generic["asarray"](np.zeros((3,), np.float32)))
    with pytest.raises(TypeError, match="MinMaxState"):
        obs.state = "not a state"


def test_device_mismatch_raises():
    """array_api_strict has several (simulated) devices: the generic device check, without a GPU."""
    xps = pytest.importorskip("array_api_strict")
    devices = xps.__array_namespace_info__().devices()
    obs = base.MinMaxObserver(xp=xps)
    obs(xps.asarray([1.0, 2.0], device=devices[0]))
    with pytest.raises(ValueError, match="x is on device"):
        obs(xps.asarray([3.0], device=devices[1]))
    np.testing.assert_array_equal(to_numpy(obs.state_dict()["max_val"]), 2.0)
    fresh = base.PerChannelMinMaxObserver(xp=xps)
    fresh(xps.asarray([[1.0, 2.0]], device=devices[1]))  # the state goes where the first input is
    assert fresh.state.min_val.device == devices[1]


def test_jax_loaded_state_is_placed_as_the_state_it_replaces():
    """JAX: a loaded state is committed to a device only where the state it replaces was (so a
    ``state_dict`` round trip before the first batch does not pin the observer to the default device)."""
    jax = pytest.importorskip("jax")
    from observers_core.adapters import jax as jobs

    obs = jobs.MinMaxObserver()
    for _ in range(2):  # the second load replaces the first one's (uncommitted) state
        obs.load_state_dict(obs.state_dict())
        assert not obs.state.min_val.committed
    obs(jax.device_put(np.array([1.0, 2.0], np.float32), jax.devices()[0]))
    obs.load_state_dict(obs.state_dict())
    assert obs.state.min_val.committed and obs.state.min_val.devices() == {jax.devices()[0]}


# --------------------------------------------------------------------------- the other observers
def test_fixed_qparams_observer(generic):
    obs = make("FixedQParamsObserver", generic, scale=1.0 / 256.0, zero_point=128)
    ref = tao.FixedQParamsObserver(scale=1.0 / 256.0, zero_point=128)
    x = generic["asarray"](np.ones(3, np.float32))
    assert obs(x) is x
    for ours, theirs in zip(obs.calculate_qparams(), ref.calculate_qparams()):
        np.testing.assert_array_equal(to_numpy(ours), theirs.numpy())
        assert to_numpy(ours).dtype == theirs.numpy().dtype
    other = make("FixedQParamsObserver", generic, scale=0.5, zero_point=0)
    other.load_state_dict(ref.state_dict())
    assert to_numpy(other.calculate_qparams()[1])[0] == 128
    with pytest.raises(ValueError, match="scale"):
        make("FixedQParamsObserver", generic, scale=0.0, zero_point=0)
    with pytest.raises(ValueError, match="zero_point=300"):
        make("FixedQParamsObserver", generic, scale=1.0, zero_point=300)
    with pytest.raises(ValueError, match="zero_point"):
        other.load_state_dict({"scale": np.array([1.0], np.float32), "zero_point": np.array([-1], np.int32)})
    assert to_numpy(other.calculate_qparams()[1])[0] == 128


@pytest.mark.parametrize("cls_name", ["PlaceholderObserver", "NoopObserver"])
def test_placeholder_and_noop(generic, cls_name):
    obs = make(cls_name, generic)
    x = generic["asarray"](np.ones(3, np.float32))
    assert obs(x) is x
    assert obs.state_dict() == {} == getattr(tao, cls_name)().state_dict()
    with pytest.raises(RuntimeError, match="should not be called"):
        obs.calculate_qparams()


def test_axis_name_is_refused_outside_jax():
    """``axis_name=`` binds a JAX mesh axis; the NumPy observers refuse it with a TypeError naming
    ``collective=`` and leave the state as it was."""
    obs = base.MovingAverageMinMaxObserver(averaging_constant=0.5)
    obs(np.arange(4, dtype=np.float32))
    before = obs.state
    with pytest.raises(TypeError, match="collective="):
        obs.update(before, np.ones(3, np.float32), axis_name="data")
    assert obs.state is before


@pytest.mark.parametrize("cls_name", ["MinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "HistogramObserver",
                                      "KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"])
def test_an_unknown_keyword_is_a_type_error_naming_the_class(cls_name):
    """The array observers' constructors forward their keywords to ``_setup``; an unknown one is named
    with the class (as Python names a constructor), on numpy and JAX alike."""
    from observers_core.adapters import _array_calibration, _array_histogram

    jax_adapter = pytest.importorskip("observers_core.adapters.jax")
    classes = [getattr(m, cls_name) for m in (base, _array_histogram, _array_calibration, jax_adapter)
               if hasattr(m, cls_name)]
    assert len(classes) == 2  # numpy's and JAX's
    for cls in classes:
        with pytest.raises(TypeError, match=rf"^{cls_name}\(\) got an unexpected keyword argument 'bogus'$"):
            cls(bogus=1)


# --------------------------------------------------------------------------- read-only configuration
_UNIFORM_RO = ("qscheme", "quant_min", "quant_max", "has_customized_qrange", "eps", "averaging_constant", "spec",
               "min_val", "max_val")
_LOWBIT_RO = ("config", "spec", "min_val", "max_val")
#: every public generic class and the attributes that were read-only (``read_only`` properties, getter-only
#: properties) before the one-class-per-observer refactor (commit 20998e9), found by introspecting that tree;
#: FixedQParams/Placeholder/Noop had none (their attributes are plain, as torch.ao's)
READ_ONLY = {
    "UniformQuantizationObserverBase": _UNIFORM_RO,
    "MinMaxObserver": _UNIFORM_RO,
    "MovingAverageMinMaxObserver": _UNIFORM_RO,
    "PerChannelMinMaxObserver": _UNIFORM_RO,
    "MovingAveragePerChannelMinMaxObserver": _UNIFORM_RO,
    "HistogramObserver": _UNIFORM_RO + ("bins", "upsample_rate", "dst_nbins", "config", "update_config", "histogram"),
    "PercentileObserver": _UNIFORM_RO + ("config",),
    "MSEObserver": _UNIFORM_RO + ("config",),
    "MixObserver": _UNIFORM_RO + ("config",),
    "KLObserver": _UNIFORM_RO + ("config", "update_interval", "accumulator"),
    "LowBitObserver": _LOWBIT_RO,
    "PerGroupMinMaxObserver": _LOWBIT_RO,
    "FP8Observer": _LOWBIT_RO,
    "PerBlockMXObserver": _LOWBIT_RO,
    "PerBlockBFPObserver": _LOWBIT_RO,
}
_NONE_READ_ONLY = {"ObserverBase", "FixedQParamsObserver", "PlaceholderObserver", "NoopObserver"}
_RO_KWARGS = {"LowBitObserver": {"dtype": "int8"}, "PerGroupMinMaxObserver": {"group_size": 4},
              "PerBlockMXObserver": {"block_size": 8}}


def _generic_modules():
    from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit

    return (base, _array_histogram, _array_calibration, _array_lowbit)


def test_the_read_only_table_covers_every_public_generic_class():
    public = {name for module in _generic_modules() for name in module.__all__}
    assert public == set(READ_ONLY) | _NONE_READ_ONLY


def _same(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape"):
        return np.array_equal(to_numpy(a), to_numpy(b), equal_nan=True)
    return type(a) is type(b) and (a == b or (a != a and b != b))


@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize(("cls_name", "attr"), [(c, a) for c, attrs in READ_ONLY.items() for a in attrs])
def test_configuration_attributes_are_read_only(framework, cls_name, attr):
    """The array observers compute with the configuration validated at construction: assigning or deleting
    one of its attributes raises ``AttributeError`` (as before the refactor) instead of being silently
    ignored, and the attribute, the state and the qparams stay as they were. (The torch observers'
    attributes stay assignable, as torch.ao's: torch re-reads them.)"""
    if framework == "jax":
        module = pytest.importorskip("observers_core.adapters.jax")
        cls = getattr(module, cls_name, None) or next(getattr(m, cls_name) for m in _generic_modules()
                                                     if hasattr(m, cls_name))
        if cls_name == "UniformQuantizationObserverBase":
            pytest.skip("the JAX adapter exports no UniformQuantizationObserverBase")
    else:
        cls = next(getattr(m, cls_name) for m in _generic_modules() if hasattr(m, cls_name))
    batch = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    stateful = cls_name != "UniformQuantizationObserverBase"
    obs, twin = cls(**_RO_KWARGS.get(cls_name, {})), cls(**_RO_KWARGS.get(cls_name, {}))
    if stateful:
        obs(batch)
        twin(batch)
    missing = object()
    before = getattr(obs, attr, missing)
    state_before = obs.state_dict() if stateful else None
    for value in (5, 0.5, None, before):
        with pytest.raises(AttributeError):
            setattr(obs, attr, value)
    with pytest.raises(AttributeError):
        delattr(obs, attr)
    after = getattr(obs, attr, missing)
    assert after is before or _same(after, before)
    if stateful:
        assert obs.state_dict().keys() == state_before.keys()
        assert all(_same(obs.state_dict()[k], state_before[k]) for k in state_before)
        obs(batch * 3)
        twin(batch * 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _same(tuple(obs.calculate_qparams()), tuple(twin.calculate_qparams()))
