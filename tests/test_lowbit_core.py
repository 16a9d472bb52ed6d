"""Low-bit formats: per-group integers, fp8 scaling, OCP MX and BFP16.

Oracles: torchao (``choose_qparams_affine``, ``_fake_quantize_affine``, ``mx_formats.to_mx`` /
``to_dtype``) where it has the feature, torch's native float8 casts, and the float64 NumPy references
of ``_lowbit_reference`` (written from the formulas and the OCP MX v1.0 spec). The core runs on every
backend of the ``xp`` fixture, JAX under ``jax.jit``.
"""

from __future__ import annotations

import functools
import warnings

import array_api_compat
import numpy as np
import pytest
import torch

import _lowbit_reference as ref
import observers_core as oc
from conftest import FLUSHING_BACKENDS, GPU_BACKENDS, GPU_DIVISION_ULPS, assert_same_on_device, flushed, to_numpy

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


#: How far, relative, a GPU's quotient can be from the exact one (docs/gpu.md "GPU arithmetic"):
#: GPU_DIVISION_ULPS ulp of its division (an ulp is at most 2**-23 of the value) and one more for the
#: roundings next to it (of ``1 / s`` and of ``x * (1 / s)``).
NEAR_TIE = (GPU_DIVISION_ULPS + 1) * 2.0**-23


def assert_levels_near_ties(actual, expected, level_of, arg, backend_name: str, what: str = "") -> None:
    """Discrete results of a division (quantization levels, fp8 values, E8M0 codes): ``actual`` equals
    ``expected`` (NaN == NaN) on CPU backends. On a GPU backend an element may instead take the level
    of ``arg * (1 -/+ NEAR_TIE)``: ``level_of`` maps the float64 ``arg`` (to which the rounded quotient
    is proportional) to the reference's level, so only an element whose exact quotient lies within the
    GPU's division error of a rounding boundary can land on the next level. On CPU backends ``expected``
    must lie among those levels too (the model ``level_of`` is checked where it can be)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    arg = np.asarray(arg, dtype=np.float64)
    with np.errstate(all="ignore"):
        low, mid, high = (
            np.broadcast_to(np.asarray(level_of(arg * f)).astype(actual.dtype), actual.shape)
            for f in (1 - NEAR_TIE, 1, 1 + NEAR_TIE)
        )

    def eq(a, b):
        return (a == b) | (np.isnan(a) & np.isnan(b))

    if backend_name in GPU_BACKENDS:
        ok = eq(actual, expected) | eq(actual, low) | eq(actual, high)
    else:
        assert (eq(expected, low) | eq(expected, mid) | eq(expected, high)).all(), (what, "level_of disagrees")
        ok = eq(actual, expected)
    assert ok.all(), (what, actual[~ok][:8], expected[~ok][:8])


def int_zero_point(m, s, dtype: str):
    """Asymmetric zero point ``clip(Q_min - round(min(m, 0) / s), Q_min, Q_max)`` in float64."""
    qmin, qmax = oc.INT_RANGES[dtype]
    return np.clip(qmin - np.round(np.minimum(m, 0) / np.asarray(s, np.float64)), qmin, qmax)


def rceil_codes(amax, element: str) -> np.ndarray:
    """The reference's rceil E8M0 codes of blocks whose largest magnitude is ``amax`` (float64: the
    quotient ``amax / max_normal`` in float64)."""
    return np.vectorize(lambda a: ref.mx_code(np.array([a]), element, "rceil"))(amax)


#: GPU backends that flush float32 subnormals (CuPy, compiled with -ftz=true); the core scales MX blocks
#: there by two normal factors, as on JAX, so only subnormal results differ from the reference.
FLUSHING_GPU = FLUSHING_BACKENDS & GPU_BACKENDS


def mx_on_device(y, expected, backend_name: str):
    """``(y, expected)`` to compare: unchanged on most backends; on ``FLUSHING_GPU`` both with subnormal
    results as zeros."""
    if backend_name not in FLUSHING_GPU:
        return y, expected
    return flushed(np.asarray(y, np.float32)), flushed(np.asarray(expected, np.float32))


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


def _mx_all_roundings(a, *, element):
    return tuple(mx_pipeline(a, element=element, rounding=r) for r in ROUNDINGS)


@pytest.mark.parametrize("element", ELEMENTS)
def test_mx_exponent_reference(backend, element):
    """E8M0 codes for floor, ceil, even and rceil equal the float64 reference on every backend (no
    subnormal inputs: XLA on CPU flushes them to zero, see ``test_mx_subnormal_inputs``), including
    NaN, Inf and zero blocks; ``scale`` is ``2**(c - 127)`` (NaN for 255)."""
    x = mx_rows(np.random.default_rng(2), subnormals=False)
    outs = call(backend, _mx_all_roundings, x, element=element)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    for rounding, out in zip(ROUNDINGS, outs):
        code = to_numpy(out.exponent)
        assert code.dtype == np.uint8
        if rounding == "rceil":  # amax / max_normal: a division (GPU: docs/gpu.md "GPU arithmetic")
            rceil = functools.partial(rceil_codes, element=element)
            assert_levels_near_ties(code, ref.mx_codes(x, element, rounding), rceil, amax, backend.name, rounding)
        else:
            np.testing.assert_array_equal(code, ref.mx_codes(x, element, rounding), err_msg=rounding)
        expected_scale = np.where(code == 255, np.nan, np.ldexp(1.0, code.astype(int) - 127))
        assert _same(to_numpy(out.scale), expected_scale)


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
    y_c, expected = mx_on_device(y, expected, backend.name)
    assert _same(y_c, expected)
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
    y, expected = mx_on_device(y, ref.mx_fake_quantize(x, code, "int8"), backend.name)
    assert _same(y, expected)


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


def test_a_block_beyond_the_axis_is_one_block_without_its_padding(backend):
    """``block_size`` larger than the axis: one block, the results of any zero padding (checked against
    block size 2n), without allocating ``block_size`` elements (2**31 asked for 8 GiB on NumPy and aborted
    the JAX interpreter; 10**8 took ~30 s in mx_fake_quantize)."""
    x = np.random.default_rng(9).standard_normal((3, 8)).astype(np.float32) * 4
    x[0] = np.abs(x[0]) + 1  # a block whose minimum is the padding's zero
    for huge in (2**31, 2**62):
        for fn in (oc.block_aminmax, lambda a, **kw: oc.block_aminmax(a, ignore_nonfinite=True, **kw)):
            got, want = (call(backend, fn, x, block_size=size) for size in (huge, 16))
            for g, w in zip(got, want):
                assert _same(to_numpy(g), to_numpy(w))
        lo, hi = call(backend, oc.block_aminmax, x, block_size=16)
        code = oc.mx_scale(np.maximum(-to_numpy(lo), to_numpy(hi))).exponent
        got, want = (to_numpy(call(backend, oc.mx_fake_quantize, x, code, block_size=size)) for size in (huge, 16))
        assert _same(got, want)
        bfp = oc.bfp_scale(to_numpy(lo), to_numpy(hi)).exponent
        got, want = (to_numpy(call(backend, oc.bfp_fake_quantize, x, bfp, block_size=size)) for size in (huge, 16))
        assert _same(got, want)


def test_codes_and_ranges_of_another_kind_are_named(backend):
    """The fake quantizers and ``e8m0_to_float`` take uint8 E8M0 codes only (an int64 -5 or 300, or a NaN code,
    raised IndexError on NumPy/torch and gave other values on JAX); ``group_qparams``/``bfp_scale`` take one
    range shape (min (4, 2) with max (4, 3) raised the backend's broadcast error)."""
    x = backend.asarray(np.ones((4, 32), np.float32))
    for code in (np.full((4, 1), -5), np.full((4, 1), 300), np.full((4, 1), np.nan, np.float32)):
        for fn in (lambda c: oc.mx_fake_quantize(x, c), lambda c: oc.bfp_fake_quantize(x, c, block_size=32)):
            with pytest.raises(TypeError, match="exponent must hold uint8 E8M0 codes"):
                fn(backend.asarray(code))
        with pytest.raises(TypeError, match="code must hold uint8 E8M0 codes"):
            oc.e8m0_to_float(backend.asarray(code))
    lo, hi = backend.asarray(np.zeros((4, 2), np.float32)), backend.asarray(np.ones((4, 3), np.float32))
    for fn in (oc.group_qparams, oc.bfp_scale):
        with pytest.raises(ValueError, match=r"min_val and max_val must have one shape .* \(4, 2\) and \(4, 3\)"):
            fn(lo, hi)


def test_qparams_that_do_not_fit_x_are_named(backend):
    """A scale (or zero point) that does not broadcast against ``x`` per tensor, or does not hold one value per
    channel: a ``ValueError`` naming it (the backends' own broadcast/reshape errors before; torch's a
    RuntimeError)."""
    x = backend.asarray(np.ones((4, 8), np.float32))
    three, two = backend.asarray(np.ones(3, np.float32)), backend.asarray(np.full(2, 0.1, np.float32))
    zp2 = backend.asarray(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"scale has shape \(2,\), which does not broadcast against x's shape \(4, 8\)"):
        oc.fake_quantize(x, two, zp2, quant_min=0, quant_max=255)
    with pytest.raises(ValueError, match=r"scale has shape \(3,\), which does not broadcast"):
        oc.fp8_fake_quantize(x, three)
    with pytest.raises(ValueError, match=r"scale must hold one value per channel along axis=0 \(4\), got shape \(3,\)"):
        oc.fp8_fake_quantize(x, three, axis=0)
    with pytest.raises(ValueError, match=r"scale must hold one value per channel along axis=1 \(8\), got shape \(2,\)"):
        oc.group_fake_quantize(x, two, zp2, dtype="int4", axis=1)
    assert tuple(oc.fake_quantize(x, backend.asarray(np.full((4, 1), 0.1, np.float32)),
                                  backend.asarray(np.zeros((4, 1), np.int32)), quant_min=0, quant_max=255).shape) == (4, 8)


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
    (numpy, array_api_strict, torch). Where subnormal operands count as zero (XLA on CPU, CuPy: docs/gpu.md
    "GPU arithmetic") the results are the reference's flushed: here all zeros."""
    x = mx_rows(np.random.default_rng(6), subnormals=True, nonfinite=False)[-2:]
    code = to_numpy(call(backend, mx_pipeline, x).exponent)
    flushes = flushes_subnormals(backend)
    if not (backend.name.startswith("jax") and flushes):
        np.testing.assert_array_equal(code, 0)
    code = np.zeros_like(code)
    y = to_numpy(call(backend, oc.mx_fake_quantize, x, code))
    expected = ref.mx_fake_quantize(x, code, "fp8_e4m3").astype(np.float32)
    assert (expected != 0).any()
    assert _same(y, flushed(expected) if flushes else expected)


def flushes_subnormals(backend) -> bool:
    """CuPy flushes float32 subnormals (``-ftz=true``). Whether XLA does depends on the machine and the
    device (on the H200 test machine XLA's GPU code kept them here), so JAX is probed on its device."""
    if not backend.name.startswith("jax"):
        return backend.name in FLUSHING_BACKENDS
    import jax

    return float(jax.jit(lambda a: a * 2)(backend.asarray(np.float32(2.0**-140)))) == 0.0


def test_mx_float64_and_e8m0_clamp():
    """float64 amax outside the E8M0 range clamps: ``1e300`` -> 254, ``1e-300`` -> 0 (numpy, torch)."""
    for xp_arr in (np.asarray, torch.as_tensor):
        amax = xp_arr(np.array([[1e300], [1e-300], [3.0], [2.0**-140]]))
        code = to_numpy(oc.mx_scale(amax, element="fp8_e4m3").exponent)[:, 0]
        np.testing.assert_array_equal(code, [254, 0, 128 - 8, 0])
        x = xp_arr(np.full((1, 32), 1e300))
        y = to_numpy(oc.mx_fake_quantize(x, xp_arr(np.array([[254]], np.uint8))))
        assert (y == 448 * 2.0**127).all()


# ------------------------------------------------------------------------------- per-group ints

INT_DTYPES = list(oc.INT_RANGES)
_TORCH_TARGET = {"int2": torch.int8, "int3": torch.int8, "int4": torch.int8, "int8": torch.int8,
                 "uint4": torch.uint8, "uint8": torch.uint8}


def int_rows(rng) -> np.ndarray:
    """(64, 256) float32 weights with row scales over 6 decades, an all-zero row, an all-positive row,
    an all-negative row and a constant row."""
    x = (rng.standard_normal((64, 256)) * 10.0 ** rng.uniform(-3, 3, (64, 1))).astype(np.float32)
    x[3] = 0
    x[4] = np.abs(x[4])
    x[5] = -np.abs(x[5])
    x[6] = 0.37
    return x


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_group_qparams_match_torchao(torchao_affine, dtype, symmetric):
    """Scale and zero point bit-for-bit equal to torchao's ``choose_qparams_affine`` with
    ``block_size=(1, 32)`` (float32 eps passed to both), and fake quantization equal to its
    ``_fake_quantize_affine``."""
    x = int_rows(np.random.default_rng(10))
    qmin, qmax = oc.INT_RANGES[dtype]
    mapping = torchao_affine["mapping"].SYMMETRIC if symmetric else torchao_affine["mapping"].ASYMMETRIC
    eps = float(np.finfo(np.float32).eps)
    s_t, z_t = torchao_affine["choose"](torch.from_numpy(x), mapping, (1, 32), _TORCH_TARGET[dtype], qmin, qmax, eps=eps)
    lo, hi = oc.group_aminmax(x, axis=-1, group_size=32)
    qp = oc.group_qparams(lo, hi, dtype=dtype, symmetric=symmetric)
    np.testing.assert_array_equal(qp.scale, s_t.numpy())
    np.testing.assert_array_equal(qp.zero_point, z_t.numpy())
    assert qp.zero_point.dtype == np.int32 and qp.scale.dtype == np.float32
    y_t = torchao_affine["fake"](torch.from_numpy(x), (1, 32), s_t, z_t, _TORCH_TARGET[dtype], qmin, qmax)
    y = oc.group_fake_quantize(x, qp.scale, qp.zero_point, dtype=dtype, axis=-1, group_size=32)
    np.testing.assert_array_equal(y, y_t.numpy())


def test_group_qparams_torchao_default_eps(torchao_affine):
    """torchao's default ``eps`` is the input's smallest normal: passing it gives its all-zero groups."""
    x = np.zeros((2, 64), np.float32)
    x[1, 5] = 1.0
    s_t, z_t = torchao_affine["choose"](torch.from_numpy(x), torchao_affine["mapping"].ASYMMETRIC, (1, 32), torch.int8, -8, 7)
    lo, hi = oc.group_aminmax(x, axis=-1, group_size=32)
    qp = oc.group_qparams(lo, hi, dtype="int4", eps=float(np.finfo(np.float32).smallest_normal))
    np.testing.assert_array_equal(qp.scale, s_t.numpy())
    np.testing.assert_array_equal(qp.zero_point, z_t.numpy())


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_group_pipeline_every_backend(backend, torchao_affine, dtype, symmetric):
    """Per-group min/max (axis 0, groups of 16) equal the float64 reference; scale, zero point and fake
    quantization equal torchao's (``block_size=(16, 1)``) bit for bit on every backend (JAX under jit)."""
    x = int_rows(np.random.default_rng(11)).T.copy()  # (256, 64): groups along axis 0
    qmin, qmax = oc.INT_RANGES[dtype]

    def pipeline(a, *, dtype, symmetric):
        lo, hi = oc.group_aminmax(a, axis=0, group_size=16)
        qp = oc.group_qparams(lo, hi, dtype=dtype, symmetric=symmetric)
        return lo, hi, qp, oc.group_fake_quantize(a, *qp, dtype=dtype, axis=0, group_size=16)

    lo, hi, qp, y = call(backend, pipeline, x, dtype=dtype, symmetric=symmetric)
    r_lo, r_hi = ref.group_minmax(x, 0, 16)
    np.testing.assert_array_equal(to_numpy(lo), r_lo)
    np.testing.assert_array_equal(to_numpy(hi), r_hi)
    r_s, _ = ref.int_qparams(r_lo, r_hi, qmin, qmax, symmetric, float(np.finfo(np.float32).eps))
    np.testing.assert_allclose(to_numpy(qp.scale), r_s, rtol=2e-7)  # float32 rounding of the float64 formula
    mapping = torchao_affine["mapping"].SYMMETRIC if symmetric else torchao_affine["mapping"].ASYMMETRIC
    s_t, z_t = torchao_affine["choose"](torch.from_numpy(x), mapping, (16, 1), _TORCH_TARGET[dtype], qmin, qmax,
                                        eps=float(np.finfo(np.float32).eps))
    s, z = to_numpy(qp.scale), to_numpy(qp.zero_point)
    assert_same_on_device(s, s_t.numpy(), backend.name, "scale")  # GPU: docs/gpu.md "GPU arithmetic"
    if symmetric:
        np.testing.assert_array_equal(z, z_t.numpy())
    else:  # Q_min - round(m / s): a division
        assert_levels_near_ties(z, z_t.numpy(), lambda m: int_zero_point(m, s, dtype), r_lo, backend.name, "zero point")
    # torchao fed our qparams (on CPU backends its own: equal bit for bit above)
    y_t = torchao_affine["fake"](torch.from_numpy(x), (16, 1), torch.tensor(s), torch.tensor(z), _TORCH_TARGET[dtype],
                                 qmin, qmax)
    s_x, z_x = np.repeat(s, 16, axis=0), np.repeat(z, 16, axis=0)
    assert_levels_near_ties(to_numpy(y), y_t.numpy(), lambda v: ref.int_fake_quantize(v, s_x, z_x, qmin, qmax), x,
                            backend.name, "fake quantized")


def test_group_granularities_and_edge_ranges(backend):
    """Per tensor (0-d range) and per channel (axis kept) fake quantization equal torch's
    ``fake_quantize_per_{tensor,channel}_affine`` with the same qparams; whole-axis groups are per-row
    ranges; nothing observed (+inf, -inf) gives s = 1, z = 0; NaN gives s = NaN, z = 0; Inf gives
    s = inf; an all-zero range gives s = eps, z = Q_min (asymmetric)."""
    x = int_rows(np.random.default_rng(12))[:8, :64]
    eps = float(np.finfo(np.float32).eps)
    lo_t, hi_t = x.min(), x.max()
    qp = call(backend, oc.group_qparams, np.asarray(lo_t), np.asarray(hi_t), dtype="uint8", symmetric=False)
    np.testing.assert_allclose(to_numpy(qp.scale), ref.int_qparams(lo_t, hi_t, 0, 255, False, eps)[0], rtol=2e-7)
    s, z = to_numpy(qp.scale), to_numpy(qp.zero_point)  # fed back from the host
    y = to_numpy(call(backend, oc.group_fake_quantize, x, s, z, dtype="uint8"))
    y_t = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), float(s), int(z), 0, 255)
    assert_levels_near_ties(y, y_t.numpy(), lambda v: ref.int_fake_quantize(v, s, z, 0, 255), x, backend.name, "per tensor")
    # per channel along axis 1 (ranges over axis 0)
    lo_c, hi_c = x.min(axis=0), x.max(axis=0)
    qp = call(backend, oc.group_qparams, lo_c, hi_c, dtype="int3", symmetric=True)
    np.testing.assert_allclose(to_numpy(qp.scale), ref.int_qparams(lo_c, hi_c, -4, 3, True, eps)[0], rtol=2e-7)
    s, z = to_numpy(qp.scale), to_numpy(qp.zero_point)
    y = to_numpy(call(backend, oc.group_fake_quantize, x, s, z, dtype="int3", axis=1))
    y_t = torch.fake_quantize_per_channel_affine(torch.from_numpy(x), torch.tensor(s), torch.tensor(z), 1, -4, 3)
    # |x| = max(-m, M) divided by s = max(-m, M) / 3.5 is a tie by construction
    assert_levels_near_ties(y, y_t.numpy(), lambda v: ref.int_fake_quantize(v, s, z, -4, 3), x, backend.name, "per channel")
    # whole-axis groups equal per-row ranges
    lo_g, hi_g = call(backend, oc.group_aminmax, x, axis=-1, group_size=-1)
    np.testing.assert_array_equal(to_numpy(lo_g)[:, 0], x.min(axis=1))
    # special ranges
    lo = np.array([np.inf, np.nan, -1.0, 0.0], np.float32)
    hi = np.array([-np.inf, 1.0, np.inf, 0.0], np.float32)
    qp = call(backend, oc.group_qparams, lo, hi, dtype="int4")
    s, z = to_numpy(qp.scale), to_numpy(qp.zero_point)
    assert s[0] == 1 and z[0] == 0
    assert np.isnan(s[1]) and z[1] == 0
    assert s[2] == np.inf
    assert s[3] == np.float32(np.finfo(np.float32).eps) and z[3] == -8


def test_group_input_dtypes():
    """float16 / integer inputs: stats in the input's floating dtype, qparams in float32, fake
    quantization in the input's dtype (integers: float32); bfloat16 through torch."""
    rng = np.random.default_rng(13)
    xh = rng.standard_normal((4, 64)).astype(np.float16)
    lo, hi = oc.group_aminmax(xh, axis=-1, group_size=32)
    assert lo.dtype == np.float16
    qp = oc.group_qparams(lo, hi, dtype="int4")
    assert qp.scale.dtype == np.float32
    assert oc.group_fake_quantize(xh, *qp, dtype="int4", axis=-1, group_size=32).dtype == np.float16
    xi = rng.integers(-50, 50, (4, 64))
    lo, hi = oc.group_aminmax(xi, axis=-1, group_size=16)
    np.testing.assert_array_equal(lo, ref.group_minmax(xi, -1, 16)[0])
    qp = oc.group_qparams(lo, hi, dtype="int8", symmetric=True)
    yi = oc.group_fake_quantize(xi, *qp, dtype="int8", axis=-1, group_size=16)
    assert yi.dtype == np.float32
    xb = torch.from_numpy(xh.astype(np.float32)).to(torch.bfloat16)
    lo, hi = oc.group_aminmax(xb, axis=-1, group_size=32)
    assert lo.dtype == torch.bfloat16
    assert oc.group_fake_quantize(xb, *oc.group_qparams(lo, hi), dtype="int4", axis=-1, group_size=32).dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------- fp8

FP8 = {"float8_e4m3fn": ("fp8_e4m3", torch.float8_e4m3fn), "float8_e5m2": ("fp8_e5m2", torch.float8_e5m2)}


def fp8_ties(name: str) -> np.ndarray:
    """Every grid midpoint of an fp8 type, one ulp either side, the grid itself and past the max."""
    grid = ref.element_grid(name).astype(np.float32)
    mid = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
    v = np.concatenate([grid, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf)),
                        [grid[-1] * 1.01, grid[-1] * 4, 1e30]]).astype(np.float32)
    return np.concatenate([v, -v])


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel", "per_group"])
@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_fake_quantize_matches_torch_cast(dtype, granularity):
    """``fp8(clip(x / s)) * s`` equals torch's native float8 cast (Quark's and torchao's formula) on
    random data plus every rounding tie of the format."""
    rng = np.random.default_rng(20)
    x = (rng.standard_normal((8, 256)) * 3.0 ** rng.integers(-5, 5, (8, 1))).astype(np.float32)
    ties = fp8_ties(FP8[dtype][0])[:1024]
    x[:4].reshape(-1)[: ties.size] = ties / 2**3  # rows 0-3 get the scale 2**-3 below: x / s hits the ties
    if granularity == "per_tensor":
        kw, s = {}, np.float32(2**-3)
        s_b = s
    elif granularity == "per_channel":
        kw, s = {"axis": 0}, oc.fp8_scale(np.max(np.abs(x), axis=1), dtype=dtype)
        s[:4] = 2**-3
        s_b = s[:, None]
    else:
        kw, s = {"axis": 1, "group_size": 64}, oc.fp8_scale(np.max(np.abs(x.reshape(8, 4, 64)), axis=2), dtype=dtype)
        s[:4] = 2**-3
        s_b = np.repeat(s, 64, axis=1)
    y = oc.fp8_fake_quantize(x, s, dtype=dtype, **kw)
    fmax = oc.FP8_MAX[dtype]
    xt, st = torch.from_numpy(x), torch.from_numpy(np.array(np.broadcast_to(s_b, x.shape), copy=True))
    y_t = (xt / st).clamp(-fmax, fmax).to(FP8[dtype][1]).to(torch.float32) * st
    np.testing.assert_array_equal(y, y_t.numpy())


@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_reference(backend, dtype):
    """fp8 scale ``amax / max_fp8`` (zero -> float32 eps, NaN -> NaN, Inf -> Inf) and per-group fake
    quantization equal the float64 reference on every backend."""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((6, 128)) * 7.0 ** rng.integers(-6, 6, (6, 1))).astype(np.float32)
    x[2] = 0
    amax = np.abs(x).reshape(6, 4, 32).max(axis=2)
    amax_special = np.concatenate([amax.ravel(), [np.nan, np.inf, 0.0]]).astype(np.float32)
    s_all = to_numpy(call(backend, oc.fp8_scale, amax_special, dtype=dtype))
    r = (amax_special.astype(np.float64) / oc.FP8_MAX[dtype]).astype(np.float32)  # one correctly rounded division
    r[r == 0] = np.finfo(np.float32).eps
    assert_same_on_device(s_all[:-3], r[:-3], backend.name, "scale")  # GPU: docs/gpu.md "GPU arithmetic"
    assert np.isnan(s_all[-3]) and s_all[-2] == np.inf and s_all[-1] == np.float32(np.finfo(np.float32).eps)
    s = s_all[:-3].reshape(6, 4)  # the backend's own scale, fed to the reference
    y = to_numpy(call(backend, oc.fp8_fake_quantize, x, s, dtype=dtype, axis=1, group_size=32))
    s_x = np.repeat(s.astype(np.float64), 32, axis=1)
    fq = lambda v: ref.fp8_fake_quantize(v, s_x, FP8[dtype][0]).astype(np.float32)  # noqa: E731
    assert_levels_near_ties(y, fq(x), fq, x, backend.name, "fake quantized")
    assert (y[2] == 0).all()
    ties = fp8_ties(FP8[dtype][0])  # every rounding tie, one ulp either side, past the max; scale 1 (exact everywhere)
    y = to_numpy(call(backend, oc.fp8_fake_quantize, ties, np.float32(1.0), dtype=dtype))
    assert _same(y, ref.fp8_fake_quantize(ties, 1.0, FP8[dtype][0]).astype(np.float32))


# ------------------------------------------------------------------------------------------- BFP


def bfp_rows(rng) -> np.ndarray:
    """(12, 64) float32: random scales, blocks whose largest mantissa rounds to 128 (127.5 ties to
    even, 127.74), stays at 127 (127.4), rounds to -128 (-127.74, -127.5: no overflow for negatives),
    zeros, NaN and Inf."""
    x = (rng.standard_normal((12, 64)) * 2.0 ** rng.integers(-20, 20, (12, 1))).astype(np.float32)
    for r, (peak, k) in enumerate([(127.5, 0), (127.74, 3), (127.4, -5), (-127.74, 2), (-127.5, 0), (127.5, -60)]):
        x[r, :8] = rng.uniform(-60, 60, 8) * 2.0 ** (k - 6)
        x[r, 3] = peak * 2.0 ** (k - 6) * 1.0  # mantissa ~peak relative to 2**(k - 6), k = floor(log2(amax))
    x[6, 8:16] = 0
    x[7, 16] = np.nan
    x[8, 24] = np.inf
    x[9, 32:40] = np.nan
    return x


def test_bfp_reference(backend):
    """BFP16 shared exponents follow Quark's overflow rule (a mantissa rounding to 128 bumps the
    exponent; one rounding to -128 fits) and fake quantization equals the float64 reference on every backend; NaN/Inf
    are skipped for the exponent (Quark zeroes them), NaN stays NaN and Inf saturates."""
    x = bfp_rows(np.random.default_rng(30))

    def pipeline(a):
        lo, hi = oc.block_aminmax(a, block_size=8, ignore_nonfinite=True)
        bs = oc.bfp_scale(lo, hi)
        return bs, oc.bfp_fake_quantize(a, bs.exponent)

    bs, y = call(backend, pipeline, x)
    codes = ref.bfp_codes(x)
    np.testing.assert_array_equal(to_numpy(bs.exponent), codes)
    assert codes[0, 0] == 127 + 1 and codes[1, 0] == 127 + 4 and codes[2, 0] == 127 - 5
    assert codes[3, 0] == 127 + 2 and codes[4, 0] == 127  # -127.74 and -127.5 round to -128: it fits
    assert codes[6, 1] == 0 and codes[9, 4] == 0  # all zero / all NaN
    y = to_numpy(y)
    assert _same(y, ref.bfp_fake_quantize(x, codes).astype(np.float32))
    assert np.isnan(y[7, 16]) and y[8, 24] == 127 * 2.0 ** (codes[8, 3] - 127 - 6)


def test_bfp_matches_quark_formula_in_torch():
    """Quark's ``fake_quantize_bfp16`` steps written with torch ops (nan_to_num, ``2**floor(log2)``,
    the [-129, 128] overflow probe, then [-128, 127]) give our values on normal data."""
    x = torch.from_numpy(bfp_rows(np.random.default_rng(31))[:7])
    blocks = x.reshape(-1, 8)
    clean = torch.nan_to_num(blocks, nan=0.0, posinf=0.0, neginf=0.0)
    amax = clean.abs().amax(dim=-1)
    scale = torch.pow(2, torch.floor(torch.log2(amax)) - 6).masked_fill(amax == 0, float(np.finfo(np.float32).eps))
    probe = torch.clamp(torch.round(clean / scale[:, None]), -129, 128)
    amax = amax * torch.pow(2, ((probe >= 128) | (probe < -128)).any(dim=-1).float())
    scale = torch.pow(2, torch.floor(torch.log2(amax)) - 6).masked_fill(amax == 0, float(np.finfo(np.float32).eps))
    y_quark = (torch.clamp(torch.round(clean / scale[:, None]), -128, 127) * scale[:, None]).reshape(x.shape)
    lo, hi = oc.block_aminmax(x, block_size=8, ignore_nonfinite=True)
    y = oc.bfp_fake_quantize(x, oc.bfp_scale(lo, hi).exponent)
    np.testing.assert_array_equal(y.numpy(), y_quark.numpy())


# ---------------------------------------------------------------------------- spec and dispatch


def test_lowbit_spec_defaults_and_hashable():
    assert oc.lowbit_spec("mxfp4") == oc.LowBitSpec("mxfp4", "per_block", -1, 32, True, "floor")
    assert oc.lowbit_spec("bfp16") == oc.LowBitSpec("bfp16", "per_block", -1, 8, True, None)
    assert oc.lowbit_spec("int4", axis=1, group_size=128).granularity == "per_group"
    assert oc.lowbit_spec("int8", axis=0).granularity == "per_channel"
    assert oc.lowbit_spec("uint4").granularity == "per_tensor"
    assert oc.lowbit_spec("torch.float8_e4m3fn").symmetric is True
    assert oc.lowbit_spec("mxfp8_e4m3", rounding="even", group_size=16, axis=0).rounding == "even"
    assert len({oc.lowbit_spec("int4", axis=1, group_size=32), oc.lowbit_spec("int4", axis=1, group_size=32)}) == 1


SPECS = [
    dict(dtype="int4", axis=1, group_size=32),
    dict(dtype="uint8", symmetric=True),
    dict(dtype="int8", axis=0, symmetric=True),
    dict(dtype="float8_e4m3fn", axis=1, group_size=64),
    dict(dtype="float8_e5m2"),
    dict(dtype="mxfp4", rounding="even"),
    dict(dtype="mxint8", rounding="rceil", group_size=16),
    dict(dtype="mxfp6_e2m3", axis=0, rounding="ceil"),
    dict(dtype="bfp16"),
]


@pytest.mark.parametrize("config", SPECS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_dispatch_static_and_dynamic(backend, config):
    """``lowbit_stats`` -> ``lowbit_qparams`` -> ``lowbit_fake_quantize`` under jit (the spec is static)
    equals the direct functions; merging two batches' stats (static mode) equals the stats of both."""
    spec = oc.lowbit_spec(**config)
    rng = np.random.default_rng(40)
    a = (rng.standard_normal((64, 128)) * 3).astype(np.float32)
    b = (rng.standard_normal((64, 128)) * 5).astype(np.float32)

    def calibrate(x1, x2, *, spec):
        s = oc.minmax_merge(oc.lowbit_stats(x1, spec), oc.lowbit_stats(x2, spec))
        qp = oc.lowbit_qparams(s, spec)
        return s, qp, oc.lowbit_fake_quantize(x1, qp, spec)

    state, qp, y = call(backend, calibrate, a, b, spec=spec)
    if spec.granularity == "per_tensor":
        both = np.concatenate([a, b])
        lo, hi = np.float32(both.min()), np.float32(both.max())
    elif spec.granularity == "per_channel":
        both = np.concatenate([a, b], axis=1 - spec.axis)  # the reduced axis
        lo, hi = both.min(axis=1 - spec.axis), both.max(axis=1 - spec.axis)
    else:  # groups / blocks: the float64 reference's blocks of each batch, combined
        bl = [ref.blocks(v, spec.axis, spec.group_size) for v in (a, b)]
        lo = np.moveaxis(np.minimum(bl[0].min(axis=-1), bl[1].min(axis=-1)), -1, spec.axis).astype(np.float32)
        hi = np.moveaxis(np.maximum(bl[0].max(axis=-1), bl[1].max(axis=-1)), -1, spec.axis).astype(np.float32)
    np.testing.assert_array_equal(to_numpy(state.min_val), lo)
    np.testing.assert_array_equal(to_numpy(state.max_val), hi)
    element = oc.MX_DTYPES.get(spec.dtype)
    if spec.family == "int":  # fq(x, scale, zero point or exponent): the direct fake quantization
        qd = oc.group_qparams(lo, hi, dtype=spec.dtype, symmetric=spec.symmetric)
        fq = functools.partial(oc.group_fake_quantize, dtype=spec.dtype, axis=spec.axis,
                               group_size=spec.group_size if spec.granularity == "per_group" else None)
    elif spec.family == "fp8":
        qd = oc.QParams(oc.fp8_scale(np.maximum(-lo, hi), dtype=spec.dtype), None)
        def fq(v, s, _):
            return oc.fp8_fake_quantize(v, s, dtype=spec.dtype, axis=spec.axis, group_size=spec.group_size)
    elif spec.family == "mx":
        qd = oc.mx_scale(np.maximum(-lo, hi), element=element, rounding=spec.rounding)
        def fq(v, _, c):
            return oc.mx_fake_quantize(v, c, element=element, axis=spec.axis, block_size=spec.group_size)
    else:
        qd = oc.bfp_scale(lo, hi)
        def fq(v, _, c):
            return oc.bfp_fake_quantize(v, c)
    s, p = to_numpy(qp[0]), to_numpy(qp[1])
    assert_same_on_device(s, qd[0], backend.name, "scale")  # GPU: docs/gpu.md "GPU arithmetic"
    if spec.family == "int" and not spec.symmetric:  # Q_min - round(m / s): a division
        assert_levels_near_ties(p, qd[1], lambda m: int_zero_point(m, s, spec.dtype), lo, backend.name, "zero point")
    elif spec.rounding == "rceil":  # amax / max_normal: a division
        rceil = functools.partial(rceil_codes, element=element)
        assert_levels_near_ties(p, qd[1], rceil, np.maximum(-lo, hi), backend.name, "exponent")
    elif qd[1] is not None:
        np.testing.assert_array_equal(p, qd[1])
    yd = fq(a, s, p)  # fed the backend's qparams (on CPU backends the direct ones: equal bit for bit above)
    if spec.family in ("int", "fp8"):  # x / s
        assert_levels_near_ties(to_numpy(y), yd, lambda v: fq(v, s, p), a, backend.name, "fake quantized")
    else:
        np.testing.assert_array_equal(to_numpy(y), yd)


# ------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "call_, match",
    [
        (lambda x: oc.block_aminmax(x, block_size=0), "block_size=0"),
        (lambda x: oc.mx_fake_quantize(x, np.zeros((4, 2), np.uint8), block_size=-3), "block_size=-3"),
        (lambda x: oc.mx_scale(np.ones(3), element="fp7_e3m3"), "element='fp7_e3m3'"),
        (lambda x: oc.mx_scale(np.ones(3), rounding="up"), "rounding='up'"),
        (lambda x: oc.block_aminmax(x, axis=2), "axis=2"),
        (lambda x: oc.mx_fake_quantize(x, np.zeros((4, 2), np.uint8), axis=-3), "axis=-3"),
        (lambda x: oc.group_aminmax(x, axis=1, group_size=24), "group_size=24"),
        (lambda x: oc.group_aminmax(x, axis=1, group_size=0), "group_size=0"),
        (lambda x: oc.group_qparams(x, x, dtype="int5"), "dtype='int5'"),
        (lambda x: oc.fp8_scale(x, dtype="float8_e3m4"), "dtype='float8_e3m4'"),
        (lambda x: oc.group_fake_quantize(x, 1.0, 0, group_size=4), "group_size=4"),
        (lambda x: oc.mx_fake_quantize(x, np.zeros((4, 3), np.uint8)), "exponent has shape"),
        (lambda x: oc.group_fake_quantize(x, np.ones((4, 3)), np.zeros((4, 3)), axis=1, group_size=32), "qparams have shape"),
        (lambda x: oc.lowbit_spec("int4", granularity="per_block"), "granularity='per_block'"),
        (lambda x: oc.lowbit_spec("mxfp4", rounding="nearest"), "rounding='nearest'"),
        (lambda x: oc.lowbit_spec("bfp16", rounding="floor"), "rounding='floor'"),
        (lambda x: oc.lowbit_spec("float8_e5m2", symmetric=False), "symmetric=False"),
        (lambda x: oc.lowbit_spec("int4", granularity="per_group"), "needs an axis"),
        (lambda x: oc.lowbit_spec("mxfp9"), "dtype='mxfp9'"),
        (lambda x: oc.lowbit_spec("mxfp4", group_size=0), "group_size=0"),
        (lambda x: oc.lowbit_spec("int8", eps=0.0), "eps=0.0"),
    ],
)
def test_bad_arguments_raise_value_error(call_, match):
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match=match):
        call_(x)


def test_bad_types_raise_type_error():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(TypeError, match="block_size"):
        oc.block_aminmax(x, block_size=2.5)
    with pytest.raises(TypeError, match="axis"):
        oc.block_aminmax(x, axis=1.0)
    with pytest.raises(TypeError, match="dtype"):
        oc.mx_fake_quantize(np.ones((2, 32), bool), np.zeros((2, 1), np.uint8))


def test_empty_inputs(backend):
    """Zero rows give zero blocks and empty results; a zero-length axis has no whole-axis group."""
    x = np.zeros((0, 64), np.float32)
    lo, hi = call(backend, oc.block_aminmax, x)
    assert tuple(lo.shape) == (0, 2)
    y = call(backend, oc.mx_fake_quantize, x, np.zeros((0, 2), np.uint8))
    assert tuple(y.shape) == (0, 64)
    lo, hi = call(backend, oc.group_aminmax, x, axis=1, group_size=16)
    assert tuple(hi.shape) == (0, 4)
    assert tuple(call(backend, oc.mx_scale, np.zeros((0, 2), np.float32)).exponent.shape) == (0, 2)
    with pytest.raises(ValueError, match="length 0"):
        oc.group_aminmax(np.zeros((3, 0), np.float32), axis=1, group_size=-1)
