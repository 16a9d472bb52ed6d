"""Core min/max statistics and qparams against torch.ao.quantization.observer (the installed torch).

The core functions run on every backend of the ``xp`` fixture; torch's own observers see the same
batches and are the oracle: min/max bit-for-bit, scale bit-for-bit, zero point equal. On torch CUDA the
oracle runs on CUDA too (torch rounds some divisions differently there); on JAX GPU and CuPy the scale
is within ``GPU_DIVISION_ULPS`` and the zero point within one of torch's (docs/gpu.md "GPU arithmetic").
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch.ao.quantization import observer as tao

import observers_core as oc
from conftest import FLUSHING_BACKENDS, GPU_BACKENDS, GPU_DIVISION_ULPS, assert_same_on_device, to_numpy

QSCHEMES = [q.value for q in oc.QScheme]
CUSTOM_RANGE = {  # a valid custom range per dtype (torch checks the length only for 8- and 32-bit ints)
    "qint8": (-100, 120), "int8": (-127, 127), "quint8": (0, 100), "uint8": (0, 201),
    "quint4x2": (0, 7), "qint32": (-1000, 3000), "int32": (-(2**31), 2**31 - 1),
    "int16": (-1000, 1000), "uint16": (0, 1000), "float8_e4m3fn": (-448, 448), "float8_e5m2": (0, 255),
}
KINDS = ["normal", "constant", "negative", "positive", "subnormal", "huge", "float16", "bfloat16",
         "integer", "empty", "zeros", "mixed_scale"]


def _valid_configs():
    """Every (dtype, qscheme, reduce_range, custom) torch's observers accept."""
    for dtype, qscheme, reduce_range, custom in itertools.product(
        oc.QUANT_DTYPES, QSCHEMES, (False, True), (False, True)
    ):
        per_tensor = oc.QScheme(qscheme).is_per_tensor
        if per_tensor and qscheme == "per_tensor_symmetric" and reduce_range and dtype == "quint8":
            continue  # torch: NotImplementedError
        if not per_tensor and qscheme == "per_channel_symmetric" and reduce_range and dtype == "quint8":
            continue
        yield dtype, qscheme, reduce_range, custom


CONFIGS = list(_valid_configs())


def _batch(rng, kind, shape):
    """One batch of ``kind`` data as (numpy array, torch tensor); bfloat16 exists only as torch."""
    base = np.asarray(rng.standard_normal(shape))
    if kind == "normal":
        a = base * 10 ** rng.uniform(-3, 3) + rng.uniform(-2, 2)
    elif kind == "constant":
        a = np.full(shape, rng.uniform(-5, 5))
    elif kind == "negative":
        a = -np.abs(base) - 0.5
    elif kind == "positive":
        a = np.abs(base) + 0.5
    elif kind == "subnormal":
        a = base * 1e-41
    elif kind == "huge":
        a = np.clip(base, -1, 1) * 3.4e38
    elif kind == "zeros":
        a = np.zeros(shape)
    elif kind == "mixed_scale":
        a = base * 10.0 ** rng.integers(-30, 30, size=shape)
    elif kind == "integer":
        a = np.asarray(rng.integers(-300, 300, size=shape).astype(np.int32))
        return a, torch.from_numpy(np.array(a))
    elif kind == "empty":
        shape = (0,) + tuple(shape[1:]) if len(shape) else (0,)
        a = np.zeros(shape)
    elif kind == "float16":
        a = np.asarray((base * 100).astype(np.float16))
        return a, torch.from_numpy(np.array(a))
    elif kind == "bfloat16":
        t = torch.from_numpy(np.array(base * 50)).to(torch.bfloat16)
        return None, t
    a = np.asarray(a, dtype=np.float32)
    return a, torch.from_numpy(np.array(a))


def _to_backend(backend, np_arr, tensor):
    if np_arr is None:  # bfloat16: only torch and jax have it
        if backend.name.startswith("torch"):
            return tensor.to(backend.device)
        if backend.name.startswith("jax"):
            import ml_dtypes

            return backend.asarray(tensor.float().numpy().astype(ml_dtypes.bfloat16))
        return None
    if np_arr.dtype == np.float16 and backend.name == "array_api_strict":
        return None  # the standard has no float16
    return backend.asarray(np_arr)


def _torch_observer(kind, dtype, qscheme, reduce_range, custom, axis, c):
    kwargs = dict(dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme), reduce_range=reduce_range)
    if custom:
        kwargs.update(quant_min=CUSTOM_RANGE[dtype][0], quant_max=CUSTOM_RANGE[dtype][1])
    per_tensor = oc.QScheme(qscheme).is_per_tensor
    if kind == "minmax":
        return (tao.MinMaxObserver if per_tensor else tao.PerChannelMinMaxObserver)(
            **kwargs, **({} if per_tensor else {"ch_axis": axis}))
    cls = tao.MovingAverageMinMaxObserver if per_tensor else tao.MovingAveragePerChannelMinMaxObserver
    return cls(averaging_constant=c, **kwargs, **({} if per_tensor else {"ch_axis": axis}))


def _assert_same_bits(ours, theirs, what, flush_subnormals=False):
    """Equal bit for bit (NaN-aware, sign of zero included). ``flush_subnormals``: XLA flushes float32
    subnormals to zero (FTZ/DAZ), so on JAX a subnormal expected value is compared as zero of either sign."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    subnormal = np.zeros(theirs.shape, bool)
    if flush_subnormals and theirs.dtype.kind == "f":
        def is_subnormal(a):
            return (a != 0) & (np.abs(a) < np.finfo(a.dtype).tiny)

        subnormal = is_subnormal(theirs) | is_subnormal(ours)
        theirs = np.where(subnormal, np.zeros_like(theirs), theirs)
        ours = np.where(subnormal, np.zeros_like(ours), ours)
    same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all(), (what, ours, theirs)
    if ours.dtype.kind == "f":
        checked = ~np.isnan(ours) & ~subnormal
        assert (np.signbit(ours) == np.signbit(theirs))[checked].all(), (what, ours, theirs)


@pytest.mark.parametrize("grid", ["default", pytest.param("full", marks=pytest.mark.slow)])
@pytest.mark.parametrize("observer_kind", ["minmax", "moving_average"])
def test_core_matches_torch_observers(backend, observer_kind, grid):
    """Every config of the grid (the default run: every third, every ninth under JAX's jit)."""
    xp = backend.xp
    rng = np.random.default_rng(1234 if observer_kind == "minmax" else 4321)
    minmax_update, moving_average_update, minmax_qparams = oc.minmax_update, oc.moving_average_update, oc.minmax_qparams
    on_jax = backend.name.startswith("jax")
    flush = backend.name in FLUSHING_BACKENDS  # XLA and CuPy flush float32 subnormals
    oracle_device = "cuda" if backend.name == "torch-cuda" else "cpu"  # torch itself on the same device
    if on_jax:  # the whole update and qparams under jit, as the JAX adapter runs them
        import jax

        minmax_update = jax.jit(oc.minmax_update, static_argnames=("axis", "ignore_nonfinite"))
        moving_average_update = jax.jit(
            oc.moving_average_update, static_argnames=("axis", "ignore_nonfinite", "averaging_constant"))
        minmax_qparams = jax.jit(oc.minmax_qparams, static_argnames=("spec",))
    checked = 0
    configs = CONFIGS[::3] if on_jax else CONFIGS  # every config compiles afresh under jit: a third suffices
    if grid == "default":
        configs = configs[::3]
    for dtype, qscheme, reduce_range, custom in configs:
        per_tensor = oc.QScheme(qscheme).is_per_tensor
        ndim = int(rng.integers(0 if per_tensor else 2, 5))  # torch per channel needs ndim >= 2
        shape = tuple(int(s) for s in rng.integers(1, 5, size=ndim))
        axis = None if per_tensor else int(rng.integers(-ndim, ndim))
        c = float(rng.choice([0.01, 0.3, 1.0]))
        kinds = [str(k) for k in rng.choice(KINDS, size=3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = _torch_observer(observer_kind, dtype, qscheme, reduce_range, custom, axis, c).to(oracle_device)
        qmin, qmax = CUSTOM_RANGE[dtype] if custom else (None, None)
        spec = oc.quant_spec(dtype, qscheme, reduce_range=reduce_range, quant_min=qmin, quant_max=qmax)
        assert (spec.quant_min, spec.quant_max) == (theirs.quant_min, theirs.quant_max)
        state = oc.minmax_init(num_channels=None if per_tensor else shape[axis], xp=xp, device=backend.device)
        for kind in kinds:
            np_arr, tensor = _batch(rng, kind, shape)
            x = _to_backend(backend, np_arr, tensor)
            if x is None:
                continue
            if kind == "empty" and not per_tensor:
                continue  # per channel, an empty batch has a different channel count: covered elsewhere
            theirs(tensor.to(oracle_device))
            if observer_kind == "minmax":
                state = minmax_update(state, x, axis=axis)
            else:
                state = moving_average_update(state, x, axis=axis, averaging_constant=c)
            if theirs.min_val.numel():
                _assert_same_bits(to_numpy(state.min_val), to_numpy(theirs.min_val), "min_val", flush)
                _assert_same_bits(to_numpy(state.max_val), to_numpy(theirs.max_val), "max_val", flush)
        if not theirs.min_val.numel() or theirs.min_val.isinf().all() and theirs.max_val.isinf().all():
            continue  # never updated: the fallback is tested on its own
        scale, zp = minmax_qparams(state, spec)
        crossed = to_numpy(theirs.min_val > theirs.max_val)
        if crossed.any():  # the moving average's cancellation can cross min and max: torch raises
            with pytest.raises(AssertionError, match="should be less than max"):
                theirs.calculate_qparams()
            assert (to_numpy(scale)[np.reshape(crossed, (-1,))] == 1).all()
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scale_t, zp_t = theirs.calculate_qparams()
        scale_t, zp_t = to_numpy(scale_t), to_numpy(zp_t)
        zp_np = to_numpy(zp)
        finite = np.isfinite(to_numpy(theirs.min_val)) & np.isfinite(to_numpy(theirs.max_val))
        if backend.name in GPU_BACKENDS - {"torch-cuda"}:  # a GPU division: scale within its ulps,
            assert_same_on_device(to_numpy(scale), scale_t, backend.name, "scale")  # zero point within one
            if finite.all() and zp_np.dtype.kind == "f":  # -min / scale: one more division
                assert_same_on_device(zp_np, zp_t, backend.name, "zero_point", ulps=2 * GPU_DIVISION_ULPS)
            elif finite.all():
                assert np.all(np.abs(zp_np.astype(np.float64) - zp_t.astype(np.float64)) <= 1), (zp_np, zp_t)
        else:
            _assert_same_bits(to_numpy(scale), scale_t, "scale", flush)
            if finite.all() and zp_np.dtype.kind == "f":
                _assert_same_bits(zp_np, zp_t, "zero_point", flush)
            elif finite.all():
                np.testing.assert_array_equal(zp_np, zp_t)
        if not backend.name.startswith("jax"):  # JAX without x64 has no int64
            assert zp_np.dtype == zp_t.dtype, (zp_np.dtype, zp_t.dtype)
        checked += 1
    assert checked > len(configs) // 2


def test_qparams_fallback_for_unobserved_state(backend):
    xp = backend.xp
    spec = oc.quant_spec("quint8", "per_tensor_affine")
    scale, zp = oc.minmax_qparams(oc.minmax_init(xp=xp), spec)
    assert to_numpy(scale).tolist() == [1.0] and to_numpy(zp).tolist() == [0]
    spec_c = oc.quant_spec("qint8", "per_channel_symmetric")
    state = oc.minmax_init(num_channels=3, xp=xp)
    state = oc.MinMaxState(
        backend.asarray(np.array([-1.0, np.inf, 0.0], dtype=np.float32)),
        backend.asarray(np.array([2.0, -np.inf, 0.0], dtype=np.float32)),
    )
    scale, zp = oc.minmax_qparams(state, spec_c)
    assert to_numpy(scale)[1] == 1.0 and to_numpy(zp)[1] == 0
    assert_same_on_device(to_numpy(scale)[:1], np.float32([2.0]) / np.float32(127.5), backend.name, "scale")


@pytest.mark.parametrize("qscheme", ["per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"])
def test_qparams_of_nan_and_infinite_ranges_are_silent_and_torchs(backend, qscheme):
    """A NaN range (a state that saw NaN), an infinite one and one whose width overflows float32 give torch's
    qparams (NaN or infinite scales where torch's are) silently on every backend: NumPy's floating-point
    warnings (invalid cast, overflow) came from the numpy observers only, where torch and JAX say nothing."""
    spec = oc.quant_spec("quint8", qscheme)
    lo = np.array([np.nan, -np.inf, -3e38, -1.0], dtype=np.float32)
    hi = np.array([np.nan, np.inf, 3e38, 2.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale, zp = oc.calculate_qparams(backend.asarray(lo), backend.asarray(hi), spec)
    ref_scale, ref_zp = oc.calculate_qparams(torch.from_numpy(lo), torch.from_numpy(hi), spec)
    theirs = tao.PerChannelMinMaxObserver(ch_axis=0, qscheme=getattr(torch, qscheme))
    their_scale, their_zp = theirs._calculate_qparams(torch.from_numpy(lo), torch.from_numpy(hi))
    np.testing.assert_array_equal(ref_scale.numpy(), their_scale.numpy())  # the reference is torch.ao's (NaN == NaN)
    np.testing.assert_array_equal(ref_zp.numpy(), their_zp.numpy())
    np.testing.assert_array_equal(np.isfinite(to_numpy(scale)), np.isfinite(ref_scale.numpy()))
    assert_same_on_device(to_numpy(scale), ref_scale.numpy(), backend.name, "scale")  # a GPU's division: 2 ulp
    zp_got, zp_ref = to_numpy(zp)[3:], ref_zp.numpy()[3:]  # (NaN -> int: platform-defined)
    if zp_ref.dtype.kind == "f":  # float qparams: -min / scale, a second division on a GPU
        assert_same_on_device(zp_got, zp_ref, backend.name, "zero_point", ulps=2 * GPU_DIVISION_ULPS)
    else:
        np.testing.assert_array_equal(zp_got, zp_ref)


def test_zero_point_of_a_nan_range_is_the_platforms_as_the_readme_says():
    """docs/exactness.md: a NaN range's zero point is the platform's NaN-to-integer conversion,
    clamped: qint8 affine 127 on NumPy and torch (torch.ao's), -128 on JAX; quint8 0 everywhere."""
    jnp = pytest.importorskip("jax.numpy")
    nan, one = np.float32(np.nan), np.float32(1.0)
    for dtype, want in (("qint8", {"numpy": 127, "torch": 127, "jax": -128}), ("quint8", dict.fromkeys(("numpy", "torch", "jax"), 0))):
        spec = oc.quant_spec(dtype, "per_tensor_affine")
        theirs = tao.MinMaxObserver(dtype=getattr(torch, dtype))._calculate_qparams(torch.tensor(nan), torch.tensor(one))
        assert int(theirs[1]) == want["torch"]
        for name, asarray in (("numpy", np.asarray), ("torch", torch.tensor), ("jax", jnp.asarray)):
            scale, zero_point = oc.calculate_qparams(asarray(nan), asarray(one), spec)
            assert np.isnan(to_numpy(scale)).all() and to_numpy(zero_point).tolist() == [want[name]], (dtype, name)


FLOAT32_EPS = float(np.finfo(np.float32).eps)
# (dtype of the range, quantized dtype, custom range, eps): each case one of the probe's (found against torch.ao)
PRECISION_CASES = [
    ("float16", "int16", None, FLOAT32_EPS),  # 65535 is inf in float16
    ("float16", "uint16", None, FLOAT32_EPS),
    ("float16", "quint8", (0, 4095), FLOAT32_EPS),  # not a float16 integer either (4095 -> 4096)
    ("bfloat16", "int16", None, FLOAT32_EPS),
    ("float16", "qint8", None, 1 + 2**-11 + 2**-30),  # eps rounded to float32, then float16, as torch's buffer
    ("float64", "qint8", None, 1e-5),  # eps is torch's float32 buffer widened, not the float 1e-5
    ("float64", "qint32", None, 1e-5),
]


@pytest.mark.parametrize("qscheme", ["per_tensor_affine", "per_tensor_symmetric"])
@pytest.mark.parametrize("range_dtype, dtype, custom, eps", PRECISION_CASES)
def test_qparams_of_float16_bfloat16_and_float64_ranges_are_torchs(backend, range_dtype, dtype, custom, eps, qscheme):
    """torch.ao's observer converted by ``.half()``/``.bfloat16()``/``.double()`` is the oracle. NumPy and JAX
    rounded the Python divisor ``Q_max - Q_min`` to float16 (torch divides half precision in float32), and every
    backend took ``eps`` as the Python float (torch's buffer holds its float32 value)."""
    if range_dtype != "float64" and not hasattr(backend.xp, range_dtype):
        pytest.skip(f"no {range_dtype} in this namespace")
    if range_dtype == "float64" and backend.name in ("jax", "jax-gpu"):
        pytest.skip("float64 needs jax_enable_x64 (tests/test_jax_x64.py)")
    quant_min, quant_max = custom or (None, None)
    spec = oc.quant_spec(dtype, qscheme, quant_min=quant_min, quant_max=quant_max, eps=eps)
    theirs = tao.MinMaxObserver(dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme), quant_min=quant_min,
                                quant_max=quant_max, eps=eps).to(getattr(torch, range_dtype))
    rng = np.random.default_rng(7)
    pairs = [np.sort(rng.standard_normal(2) * 10.0 ** rng.integers(-5, 3)) for _ in range(40)] + [np.zeros(2)]
    for lo, hi in pairs:
        t_lo, t_hi = (torch.tensor(v, dtype=getattr(torch, range_dtype)) for v in (lo, hi))
        want_scale, want_zp = theirs._calculate_qparams(t_lo, t_hi)
        if range_dtype == "bfloat16":
            ours = [backend.xp.asarray(backend.asarray(np.float32(t.float().item())), dtype=backend.xp.bfloat16)
                    for t in (t_lo, t_hi)]
        else:
            ours = [backend.asarray(t.numpy()) for t in (t_lo, t_hi)]
        scale, zp = oc.calculate_qparams(*ours, spec)
        got_scale = to_numpy(backend.xp.astype(scale, backend.xp.float32) if range_dtype == "bfloat16" else scale)
        assert_same_on_device(got_scale.astype(np.float64), want_scale.double().numpy(), backend.name, "scale")
        if backend.name not in GPU_BACKENDS:
            np.testing.assert_array_equal(to_numpy(zp).astype(np.int64), want_zp.long().numpy())


def test_fake_quantize_with_float_zero_points_is_torchs(backend):
    """``per_channel_affine_float_qparams`` zero points are floats: torch's per-channel fake quantization adds
    them before rounding and rounds ``(q - z) * s`` once (ours added them after rounding, as integer zero
    points: other levels). Bit for bit with torch where the namespace has float64; JAX without x64 within
    an ulp; random rows and rows of exact ties."""
    rng = np.random.default_rng(3)
    for case in range(40):
        scale = rng.uniform(0.01, 0.5, 4).astype(np.float32)
        zero_point = rng.uniform(-20, 200, 4).astype(np.float32)
        x = (rng.standard_normal((4, 50)) * rng.uniform(0.1, 10)).astype(np.float32)
        if case % 2:  # ties: x / s an odd multiple of one half
            x = ((np.round(x / scale[:, None]) + 0.5) * scale[:, None]).astype(np.float32)
        want = torch.fake_quantize_per_channel_affine(
            torch.from_numpy(x), torch.from_numpy(scale), torch.from_numpy(zero_point), 0, 0, 255).numpy()
        got = to_numpy(oc.fake_quantize(*(backend.asarray(a) for a in (x, scale, zero_point)), quant_min=0,
                                        quant_max=255, axis=0))
        if backend.name in ("numpy", "array_api_strict", "torch"):
            np.testing.assert_array_equal(got, want)
        else:  # float32 only (or a GPU's division): the product q - z rounded first
            np.testing.assert_allclose(got, want, rtol=2 * np.finfo(np.float32).eps, atol=0)


@pytest.mark.parametrize("int_dtype", ["int8", "int16", "int32", "int64"])
def test_qparams_of_integer_ranges_are_float32(backend, int_dtype):
    """An integer range is computed in float32 on every backend, as torch.ao's ``_calculate_qparams`` of the
    same values (NumPy gave float64 scales; JAX squeezed the divisor 255 into int8, giving 10/127)."""
    if int_dtype == "int64" and backend.name in ("jax", "jax-gpu"):
        pytest.skip("int64 needs jax_enable_x64")
    spec = oc.quant_spec("quint8")
    lo, hi = np.array(-3, int_dtype), np.array(7, int_dtype)
    scale, zp = oc.calculate_qparams(backend.asarray(lo), backend.asarray(hi), spec)
    want_scale, want_zp = tao.MinMaxObserver()._calculate_qparams(torch.tensor(-3.0), torch.tensor(7.0))
    assert to_numpy(scale).dtype == np.float32
    assert_same_on_device(to_numpy(scale), want_scale.numpy(), backend.name, "scale")
    # -3 / scale is the rounding tie -76.5 (scale = 10 / 255), which torch rounds to even (zero point 76).
    # XLA's GPU division is not correctly rounded (docs/gpu.md "GPU arithmetic"): there it may land on either side.
    allowed = [want_zp.item(), want_zp.item() + 1] if backend.name == "jax-gpu" else [want_zp.item()]
    assert to_numpy(zp).tolist() in ([z] for z in allowed), (to_numpy(zp), allowed)


@pytest.mark.parametrize("spec", [None, "qint8", ("qint8", "per_tensor_affine"), 0.5])
def test_calculate_qparams_names_a_spec_that_is_not_a_quant_spec(spec):
    """Anything but a ``QuantSpec`` is a ``TypeError`` naming ``spec`` (was an ``AttributeError`` on ``.eps``)."""
    with pytest.raises(TypeError, match="spec must be a QuantSpec"):
        oc.calculate_qparams(np.float32(-1.0), np.float32(1.0), spec)


def test_nan_propagates_by_default_like_torch(xp):
    x = np.array([1.0, np.nan, -2.0], dtype=np.float32)
    theirs = tao.MinMaxObserver()
    theirs(torch.from_numpy(x))
    state = oc.minmax_update(oc.minmax_init(xp=xp), xp.asarray(x))
    assert np.isnan(to_numpy(state.min_val)) and np.isnan(theirs.min_val.numpy())
    state = oc.minmax_update(state, xp.asarray(np.array([5.0], dtype=np.float32)))
    assert np.isnan(to_numpy(state.max_val)), "NaN stays for good, as in torch"


@pytest.mark.parametrize("update", ["minmax", "moving_average"])
def test_ignore_nonfinite_equals_observing_the_finite_values(xp, update):
    rng = np.random.default_rng(7)
    clean_state = oc.minmax_init(num_channels=4, xp=xp)
    state = oc.minmax_init(num_channels=4, xp=xp)
    for step in range(4):
        x = rng.standard_normal((3, 4, 5)).astype(np.float32)
        dirty = x.copy()
        dirty[rng.random(x.shape) < 0.2] = rng.choice([np.nan, np.inf, -np.inf])
        if step == 1:
            dirty[:, 2, :] = np.nan  # a channel with no finite value in this batch keeps its state
        kw = {} if update == "minmax" else {"averaging_constant": 0.25}
        fn = oc.minmax_update if update == "minmax" else oc.moving_average_update
        state = fn(state, xp.asarray(dirty), axis=1, ignore_nonfinite=True, **kw)
        finite = np.where(np.isfinite(dirty), dirty, np.nan)
        lo, hi = np.nanmin(finite, axis=(0, 2)), np.nanmax(finite, axis=(0, 2))
        clean_prev = to_numpy(clean_state.min_val), to_numpy(clean_state.max_val)
        clean_state = fn(clean_state, xp.asarray(np.stack([lo, hi]).astype(np.float32)), axis=1, **kw)
        if step == 1:  # channel 2 unseen this step: restore the previous values for the oracle
            cmin, cmax = to_numpy(clean_state.min_val).copy(), to_numpy(clean_state.max_val).copy()
            cmin[2], cmax[2] = clean_prev[0][2], clean_prev[1][2]
            clean_state = oc.MinMaxState(xp.asarray(cmin), xp.asarray(cmax))
        np.testing.assert_array_equal(to_numpy(state.min_val), to_numpy(clean_state.min_val))
        np.testing.assert_array_equal(to_numpy(state.max_val), to_numpy(clean_state.max_val))
        assert np.isfinite(to_numpy(state.min_val)).all()


def test_ignore_nonfinite_all_nonfinite_batch_is_nothing_seen(xp):
    x = xp.asarray(np.array([np.nan, np.inf, -np.inf], dtype=np.float32))
    state = oc.minmax_update(oc.minmax_init(xp=xp), x, ignore_nonfinite=True)
    assert to_numpy(state.min_val) == np.inf and to_numpy(state.max_val) == -np.inf
    scale, zp = oc.minmax_qparams(state, oc.quant_spec())
    assert to_numpy(scale).tolist() == [1.0] and to_numpy(zp).tolist() == [0]


def test_empty_input_is_a_no_op(xp):
    state = oc.minmax_update(oc.minmax_init(xp=xp), xp.asarray(np.array([1.0, 2.0], dtype=np.float32)))
    for fn, kw in ((oc.minmax_update, {}), (oc.moving_average_update, {"averaging_constant": 0.5})):
        after = fn(state, xp.asarray(np.zeros((0, 3), dtype=np.float32)), **kw)
        assert after is state


def test_merge_is_the_range_of_the_concatenation(xp):
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((5, 3)).astype(np.float32) * s for s in (0.1, 10.0, 1.0)]
    states = [oc.minmax_update(oc.minmax_init(num_channels=3, xp=xp), xp.asarray(p), axis=1) for p in parts]
    a, b, c = states
    left = oc.minmax_merge(oc.minmax_merge(a, b), c)
    right = oc.minmax_merge(a, oc.minmax_merge(b, c))
    whole = oc.minmax_update(oc.minmax_init(num_channels=3, xp=xp), xp.asarray(np.concatenate(parts)), axis=1)
    empty = oc.minmax_init(num_channels=3, xp=xp)
    for s in (left, right, oc.minmax_merge(whole, empty), oc.minmax_merge(empty, whole)):
        np.testing.assert_array_equal(to_numpy(s.min_val), to_numpy(whole.min_val))
        np.testing.assert_array_equal(to_numpy(s.max_val), to_numpy(whole.max_val))
    spec = oc.quant_spec("qint8", "per_channel_symmetric")
    for got, want in zip(oc.minmax_qparams(left, spec), oc.minmax_qparams(whole, spec)):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def test_moving_average_merge_averages_replicas(xp):
    a = oc.MinMaxState(xp.asarray([-1.0, -4.0, float("inf")]), xp.asarray([1.0, 2.0, -float("inf")]))
    b = oc.MinMaxState(xp.asarray([-3.0, float("inf"), -2.0]), xp.asarray([5.0, -float("inf"), 6.0]))
    m = oc.moving_average_merge(a, b)
    assert to_numpy(m.min_val).tolist() == [-2.0, -4.0, -2.0]
    assert to_numpy(m.max_val).tolist() == [3.0, 2.0, 6.0]


def test_per_channel_shape_checks_leave_state_untouched(xp):
    state = oc.minmax_init(num_channels=3, xp=xp)
    x = xp.asarray(np.ones((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="channels"):
        oc.minmax_update(state, x, axis=1)
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        oc.minmax_update(state, x, axis=2)
    with pytest.raises(ValueError, match="per-channel state"):
        oc.minmax_update(state, x)
    assert to_numpy(state.min_val).tolist() == [np.inf] * 3


def test_rejects_complex_and_bool(xp):
    state = oc.minmax_init(xp=xp)
    with pytest.raises(TypeError, match="x must hold real"):
        oc.minmax_update(state, xp.asarray(np.array([True, False])))


def test_bad_arguments_of_the_pure_functions_are_named(backend):
    """What the probe of the pure functions found (AttributeError, silent wrap-around, complex scales, bare
    reshape errors): each a ``TypeError``/``ValueError`` naming the argument and what is allowed."""
    xp = backend.xp
    x = backend.asarray(np.array([1.0, -2.0], np.float32))
    state = oc.minmax_init(device=backend.device, xp=xp)  # on x's device: a CPU state refuses a CUDA x first
    other = np if backend.name != "numpy" else torch
    with pytest.raises(TypeError, match="one namespace"):
        oc.minmax_update(state, other.asarray(np.array([1.0], np.float32)))
    with pytest.raises(TypeError, match="dtype must be a real floating dtype"):  # +inf would wrap to an integer
        oc.minmax_init(dtype=xp.int32, xp=xp)
    for constant in (None, "0.5", True):
        with pytest.raises(TypeError, match="averaging_constant must be a real number"):
            oc.moving_average_update(state, x, averaging_constant=constant)
    if hasattr(xp, "complex64"):
        with pytest.raises(TypeError, match="min_val must hold real"):
            oc.calculate_qparams(xp.asarray(np.complex64(1)), xp.asarray(np.complex64(2)), oc.quant_spec("quint8"))
    scale, zero_point = backend.asarray(np.float32([0.1])), backend.asarray(np.int32([3]))
    for bad in (None, "0", 0.5):
        with pytest.raises(TypeError, match="quant_min must be an int"):
            oc.fake_quantize(x, scale, zero_point, quant_min=bad, quant_max=255)
    rows = backend.asarray(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="scale must hold one value per channel along axis=0"):
        oc.fake_quantize(rows, backend.asarray(np.float32([0.1, 0.2])), backend.asarray(np.int32([1, 2, 3])),
                         quant_min=0, quant_max=255, axis=0)


def test_ignore_nonfinite_of_the_pure_functions_must_be_a_bool(backend):
    """Every pure function with ``ignore_nonfinite`` refuses a non-bool naming it (they took ``"yes"`` as
    ``True`` and ``0``/``None`` as ``False``); ``True``/``False``/``np.bool_`` run."""
    xp = backend.xp
    x = backend.asarray(np.arange(-8.0, 8.0, dtype=np.float32).reshape(2, 8))
    calls = [
        lambda v: oc.aminmax(x, ignore_nonfinite=v),
        lambda v: oc.minmax_update(oc.minmax_init(device=backend.device, xp=xp), x, ignore_nonfinite=v),
        lambda v: oc.moving_average_update(oc.minmax_init(device=backend.device, xp=xp), x, averaging_constant=0.5,
                                           ignore_nonfinite=v),
        lambda v: oc.histogram_update(oc.histogram_init(bins=8, device=backend.device, xp=xp), x, ignore_nonfinite=v),
        lambda v: oc.block_aminmax(x, block_size=4, ignore_nonfinite=v),
        lambda v: oc.group_aminmax(x, group_size=4, ignore_nonfinite=v),
        lambda v: oc.lowbit_stats(x, oc.lowbit_spec("int4"), ignore_nonfinite=v),
    ]
    for call in calls:
        for ok in (True, False, np.True_):
            call(ok)
        for bad in ("yes", 0, None):
            with pytest.raises(TypeError, match="ignore_nonfinite must be a bool"):
                call(bad)


def test_init_and_merge_name_their_arguments(backend):
    """``minmax_init``'s ``num_channels``/``dtype`` and the merges' state shapes are checked, naming them, the same
    on every backend (-1 channels gave three backends' own errors, 2.7 was taken as 2, ``dtype=True`` raised
    AttributeError; merging 4 with 8 channels raised the backend's broadcast error, and a per-tensor state
    merged with a per-channel one broadcast silently)."""
    xp, device = backend.xp, backend.device
    for bad, error, match in ((-1, ValueError, "num_channels=-1 is out of range"), (2.7, TypeError, "num_channels must be an int"),
                              (True, TypeError, "num_channels must be an int")):
        with pytest.raises(error, match=match):
            oc.minmax_init(num_channels=bad, device=device, xp=xp)
    for bad in (True, [1], xp.int32):
        with pytest.raises(TypeError, match="dtype must be a real floating dtype"):
            oc.minmax_init(dtype=bad, device=device, xp=xp)
    four, eight, tensor = (oc.minmax_init(num_channels=c, device=device, xp=xp) for c in (4, 8, None))
    for merge in (oc.minmax_merge, oc.moving_average_merge):
        for a, b in ((four, eight), (tensor, four), (four, tensor)):
            with pytest.raises(ValueError, match="a and b must hold min_val/max_val of one shape"):
                merge(a, b)
        assert tuple(merge(four, four).min_val.shape) == (4,)


def test_aminmax_per_channel_any_axis(xp):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for axis in range(-4, 4):
        lo, hi = oc.aminmax(xp.asarray(x), axis=axis)
        others = tuple(i for i in range(4) if i != axis % 4)
        np.testing.assert_array_equal(to_numpy(lo), x.min(axis=others))
        np.testing.assert_array_equal(to_numpy(hi), x.max(axis=others))


@pytest.mark.parametrize("n", [7, 4096, 100_003])
def test_nan_propagates_on_large_inputs(xp, n):
    """XLA:CPU's reductions drop NaN past 4096 elements; the core restores torch's propagation."""
    x = np.ones((n,), dtype=np.float32)
    x[n // 2] = np.nan
    lo, hi = oc.aminmax(xp.asarray(x))
    assert np.isnan(to_numpy(lo)) and np.isnan(to_numpy(hi))
    x2 = np.ones((3, n), dtype=np.float32)
    x2[1, -1] = np.nan
    lo, hi = oc.aminmax(xp.asarray(x2), axis=0)
    assert np.isnan(to_numpy(lo)).tolist() == [False, True, False]
    assert np.isnan(to_numpy(hi)).tolist() == [False, True, False]


def test_moving_average_overflowed_to_inf_keeps_averaging_like_torch(backend):
    """An average that overflows to ``min = +inf`` (with a finite max) is not a fresh state: torch keeps
    averaging (``inf + c * (0 - inf)`` is NaN), it does not restart from the batch (found by hypothesis in
    test_torch_parity)."""
    batches = [np.array([[-3.4e38, 0.0]], np.float32), np.array([[3.4e38]], np.float32), np.array([[0.0]], np.float32)]
    theirs = tao.MovingAverageMinMaxObserver()
    update = oc.moving_average_update
    if backend.name.startswith("jax"):
        import jax

        update = jax.jit(oc.moving_average_update, static_argnames=("averaging_constant",))
    state = oc.minmax_init(xp=backend.xp, device=backend.device)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for b in batches:
            theirs(torch.from_numpy(b))
            state = update(state, backend.asarray(b), averaging_constant=0.01)
    assert np.isnan(to_numpy(state.min_val)) and np.isnan(theirs.min_val.item())
    _assert_same_bits(to_numpy(state.max_val), to_numpy(theirs.max_val), "max_val")
