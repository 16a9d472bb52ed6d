"""Low-bit observers (per-group integers, fp8, MX, BFP16) of ``observers_core.adapters.torch``, ``.jax``
(under ``jax.jit``), ``.cupy`` (skipped without a GPU) and the generic array ones (numpy,
array_api_strict).

Oracles: torchao's ``choose_qparams_affine`` / ``_fake_quantize_affine`` (per-group integers) and
``mx_formats.to_mx`` / ``to_dtype`` (MX exponents), torch's native float8 casts (fp8), the float64 NumPy
reference of Quark's BFP16 rule (``_lowbit_reference``), and the core functions (``lowbit_stats``,
``minmax_merge``, ``lowbit_qparams``, ``lowbit_fake_quantize``) called directly on numpy arrays.
Static mode is checked over several batches (torchao sees all batches at once: a block spanning the
batches), dynamic mode per batch.
"""

from __future__ import annotations

import copy
import functools
import io
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _lowbit_reference as ref  # noqa: E402
import observers_core as oc  # noqa: E402
from conftest import (  # noqa: E402
    TraceDelta,
    _cupy_available,
    adapter_backend,
    assert_same_on_device,
    to_numpy,
    to_torch,
)
from observers_core.adapters import _array_lowbit as generic  # noqa: E402  (no public numpy module)
from observers_core.adapters import torch as tobs  # noqa: E402

try:  # bfloat16 for numpy (installed with jax)
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

CLASSES = ("LowBitObserver", "PerGroupMinMaxObserver", "FP8Observer", "PerBlockMXObserver", "PerBlockBFPObserver")
F32_EPS = float(np.finfo(np.float32).eps)


# ------------------------------------------------------------------------------------- backends


def _make_backend(name: str) -> SimpleNamespace:
    return adapter_backend(name, generic)


ALL_BACKENDS = ["numpy", "array_api_strict", "torch", "jax", "cupy"]
BACKENDS = ["numpy", "torch", "jax", "cupy"]  # array_api_strict runs the core-equality grid and the input checks


@pytest.fixture(params=ALL_BACKENDS)
def lb(request) -> SimpleNamespace:
    return _make_backend(request.param)


@pytest.fixture(params=BACKENDS)
def be(request) -> SimpleNamespace:
    return _make_backend(request.param)


def on_backends(cases: list, jax_cases: list) -> list:
    """``(backend, *case)`` params: every case on each backend but JAX, which compiles every configuration
    (about a second each on this CPU) and runs ``jax_cases`` only, one per format; the core's jit grid
    is in test_lowbit_core.py."""
    out = []
    for backend in BACKENDS:
        for case in cases:
            if backend != "jax" or case in jax_cases:
                case = case if isinstance(case, tuple) else (case,)
                out.append(pytest.param(backend, *case, id="-".join([backend, *map(str, case)])))
    return out


def make(lb, cls_name: str, **kwargs):
    return getattr(lb.mod, cls_name)(**kwargs, **lb.kw)


def same(a, b) -> bool:
    """Same shape and values, NaN == NaN (dtype-independent)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def assert_same(ours, expected, what: str = "") -> None:
    ours, expected = to_numpy(ours), np.asarray(expected)
    assert ours.dtype == expected.dtype, f"{what}: dtype {ours.dtype} != {expected.dtype}"
    assert same(ours, expected), f"{what}: {ours} != {expected}"


def batches_of(seed: int, shape=(8, 64), n: int = 3) -> list[np.ndarray]:
    """``n`` float32 batches with per-row scales from 1e-3 to 1e3 and a constant row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, (shape[0], 1))).astype(np.float32)
        x[1] = 0.5
        out.append(x)
    return out


def core_expected(spec, batches, dynamic: bool):
    """The core functions on numpy: (state, qparams, fake quantization of the last batch)."""
    stats = [oc.lowbit_stats(b, spec) for b in batches]
    state = stats[-1] if dynamic else functools.reduce(oc.minmax_merge, stats)
    qp = oc.lowbit_qparams(state, spec)
    return state, qp, oc.lowbit_fake_quantize(batches[-1], qp, spec)


def observe_all(obs, batches, asarray):
    """Feed ``batches``; each call must return its input object."""
    for b in batches:
        x = asarray(b)
        assert obs(x) is x
    return obs


# ----------------------------------------------------------------- equal to the core, every backend

CONFIGS = {
    "int4-group-asym": ("PerGroupMinMaxObserver", dict(dtype="int4", group_size=32)),
    "uint4-group-axis0-sym": ("PerGroupMinMaxObserver", dict(dtype="uint4", axis=0, group_size=4, symmetric=True)),
    "int8-whole-axis": ("PerGroupMinMaxObserver", dict(dtype="int8", group_size=-1)),
    "fp8-e4m3-tensor": ("FP8Observer", dict()),
    "fp8-e5m2-channel": ("FP8Observer", dict(dtype="float8_e5m2", axis=0)),
    "fp8-e4m3-group": ("FP8Observer", dict(axis=1, group_size=16)),
    "mxfp8-floor": ("PerBlockMXObserver", dict()),
    "mxfp4-even-partial-block": ("PerBlockMXObserver", dict(dtype="mxfp4", rounding="even", block_size=24)),
    "mxint8-rceil-axis0": ("PerBlockMXObserver", dict(dtype="mxint8", axis=0, block_size=4, rounding="rceil")),
    "bfp16": ("PerBlockBFPObserver", dict()),
    "generic-int3-channel": ("LowBitObserver", dict(dtype="int3", axis=1)),
    "generic-mxfp6-ceil": ("LowBitObserver", dict(dtype="mxfp6_e2m3", block_size=16, rounding="ceil")),
}


JAX_CONFIGS = ["int4-group-asym", "fp8-e4m3-group", "mxfp8-floor", "bfp16"]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend, config", on_backends(list(CONFIGS), JAX_CONFIGS)
                         + [pytest.param("array_api_strict", c, id=f"array_api_strict-{c}") for c in CONFIGS])
def test_equal_to_core_functions(backend, config, dynamic):
    """State, qparams and fake quantization equal the core functions on the same data, bit for bit:
    static merges every batch, dynamic keeps the last batch alone (checked after each batch)."""
    lb = _make_backend(backend)
    cls_name, kwargs = CONFIGS[config]
    obs = make(lb, cls_name, is_dynamic=dynamic, **kwargs)
    spec = obs.spec
    batches = batches_of(1)
    for i, b in enumerate(batches):
        observe_all(obs, [b], lb.asarray)
        if dynamic or i == len(batches) - 1:
            state, qp, y = core_expected(spec, batches[: i + 1], dynamic)
            sd = obs.state_dict()
            assert_same(sd["min_val"], state.min_val, "min_val")
            assert_same(sd["max_val"], state.max_val, "max_val")
            ours = obs.calculate_qparams()
            assert type(ours).__name__ == type(qp).__name__
            for name, a, e in zip(qp._fields, ours, qp):
                assert_same(a, e, name)
            assert_same(obs.fake_quantize(lb.asarray(b)), y, "fake_quantize")


# ----------------------------------------------------------------------------- external anchors


@pytest.fixture(scope="module")
def torchao():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
            from torchao.quantization.quant_primitives import MappingType, _fake_quantize_affine, choose_qparams_affine
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"torchao does not import here: {exc!r}")
    return SimpleNamespace(
        to_mx=to_mx, to_dtype=to_dtype, modes=ScaleCalculationMode, choose=choose_qparams_affine,
        fake=_fake_quantize_affine, mapping=MappingType,
    )


def union_blocks(batches: list[np.ndarray], size: int) -> np.ndarray:
    """``(R, C)`` batches as ``(R, nb * B * size)``: block ``j`` of row ``r`` holds that block of every
    batch (zero-padded as the observers pad), so one block of ``B * size`` spans all batches."""
    xb = np.stack([ref.blocks(b, -1, size) for b in batches], axis=-2)  # (R, nb, B, size)
    return np.ascontiguousarray(xb.reshape(xb.shape[0], -1))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend, dtype, symmetric", on_backends(
    [("int4", False), ("uint4", True), ("int8", True)], [("int4", False)]))
def test_per_group_int_matches_torchao(backend, torchao, dtype, symmetric, dynamic):
    """Scale and zero point equal torchao's ``choose_qparams_affine`` (static: the batches stacked,
    ``block_size=(B, 1, 32)``; dynamic: the last batch, ``(1, 32)``), fake quantization its
    ``_fake_quantize_affine``."""
    be = _make_backend(backend)
    batches = batches_of(2, n=3)
    obs = observe_all(make(be, "PerGroupMinMaxObserver", dtype=dtype, group_size=32, symmetric=symmetric,
                           is_dynamic=dynamic), batches, be.asarray)
    qmin, qmax = oc.INT_RANGES[dtype]
    target = torch.uint8 if dtype.startswith("u") else torch.int8
    mapping = torchao.mapping.SYMMETRIC if symmetric else torchao.mapping.ASYMMETRIC
    seen = batches[-1:] if dynamic else batches
    s_t, z_t = torchao.choose(torch.from_numpy(np.stack(seen)), mapping, (len(seen), 1, 32), target, qmin, qmax,
                              eps=F32_EPS)
    s_t, z_t = s_t.reshape(8, 2), z_t.reshape(8, 2)
    scale, zero_point = obs.calculate_qparams()
    assert_same(scale, s_t.numpy(), "scale")
    assert_same(zero_point, z_t.numpy(), "zero_point")
    y_t = torchao.fake(torch.from_numpy(batches[-1]), (1, 32), s_t, z_t, target, qmin, qmax)
    assert_same(obs.fake_quantize(be.asarray(batches[-1])), y_t.numpy(), "fake_quantize")


MX_ANCHORS = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend, dtype, rounding", on_backends(
    [("mxfp8_e4m3", "floor"), ("mxfp4", "even"), ("mxfp4", "ceil")], [("mxfp8_e4m3", "floor")]))
def test_mx_exponents_match_torchao(backend, torchao, dtype, rounding, dynamic):
    """Shared exponents (uint8 E8M0 codes) equal torchao's ``to_mx`` (static: one block spanning every
    batch's block; dynamic: the last batch); fake quantization equals its ``to_dtype(to_mx(x))`` (floor)."""
    be = _make_backend(backend)
    batches = batches_of(3, n=3)
    obs = observe_all(make(be, "PerBlockMXObserver", dtype=dtype, rounding=rounding, is_dynamic=dynamic),
                      batches, be.asarray)
    seen = batches[-1:] if dynamic else batches
    mode = getattr(torchao.modes, rounding.upper())
    scale_t, _ = torchao.to_mx(torch.from_numpy(union_blocks(seen, 32)), MX_ANCHORS[dtype], 32 * len(seen), mode)
    scale, exponent = obs.calculate_qparams()
    assert_same(exponent, scale_t.view(torch.uint8).numpy().reshape(8, 2), "exponent")
    assert_same(scale, np.ldexp(np.float32(1), to_numpy(exponent).astype(np.int32) - 127), "scale")
    if dynamic and rounding == "floor":
        s_t, data_t = torchao.to_mx(torch.from_numpy(batches[-1]), MX_ANCHORS[dtype], 32)
        y_t = torchao.to_dtype(data_t, s_t, MX_ANCHORS[dtype], 32, torch.float32)
        assert_same(obs.fake_quantize(be.asarray(batches[-1])), y_t.numpy(), "fake_quantize")


FP8_TORCH = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
FP8_CASES = {
    "e4m3-tensor": ("float8_e4m3fn", {}),
    "e5m2-channel": ("float8_e5m2", {"axis": 0}),
    "e4m3-group": ("float8_e4m3fn", {"axis": 1, "group_size": 16}),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend, case", on_backends(["e4m3-tensor", "e5m2-channel", "e4m3-group"], ["e4m3-group"]))
def test_fp8_matches_torch_float8_cast(backend, case, dynamic):
    """``s = amax / max_fp8`` computed by torch on all batches (static) or the last one (dynamic), and
    fake quantization equal to torch's ``(x / s).clamp(-max, max).to(float8).float() * s``."""
    be = _make_backend(backend)
    dtype, kwargs = FP8_CASES[case]
    batches = batches_of(4, n=3)
    obs = observe_all(make(be, "FP8Observer", dtype=dtype, is_dynamic=dynamic, **kwargs), batches, be.asarray)
    seen = torch.from_numpy(np.stack(batches[-1:] if dynamic else batches)).abs()  # (B, 8, 64)
    if "group_size" in kwargs:
        amax = seen.reshape(seen.shape[0], 8, 4, 16).amax(dim=(0, 3))  # (8, 4)
        expand = functools.partial(torch.repeat_interleave, repeats=16, dim=1)
    elif "axis" in kwargs:
        amax = seen.amax(dim=(0, 2))  # (8,)
        expand = lambda s: s[:, None]  # noqa: E731
    else:
        amax = seen.amax()
        expand = lambda s: s  # noqa: E731
    fmax = oc.FP8_MAX[dtype]
    s_t = amax / fmax
    scale, zero_point = obs.calculate_qparams()
    assert_same(scale, s_t.numpy(), "scale")
    assert_same(zero_point, np.zeros(s_t.shape, np.int32), "zero_point")
    x = torch.from_numpy(batches[-1])
    y_t = (x / expand(s_t)).clamp(-fmax, fmax).to(FP8_TORCH[dtype]).to(torch.float32) * expand(s_t)
    assert_same(obs.fake_quantize(be.asarray(batches[-1])), y_t.numpy(), "fake_quantize")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_bfp16_matches_quark_rule_reference(be, dynamic):
    """Shared exponents equal the float64 reference of Quark's BFP16 rule (``floor(log2(amax))``, plus
    one where a mantissa rounds to 128) over every batch's block (static) or the last batch (dynamic);
    fake quantization equals the reference's ``clip(round(x / 2**(e - 6)), -128, 127) * 2**(e - 6)``."""
    batches = batches_of(5, n=3)
    for b in batches:  # the two blocks below stay under 64 in magnitude but for their peak
        for r, cols in ((2, slice(0, 8)), (3, slice(8, 16))):
            b[r, cols] = b[r, cols] / np.abs(b[r, cols]).max() * 60
    batches[0][2, :8] = [127.5, 3, -1, 0, 5, 9, -60, 2]  # the largest mantissa rounds to 128 (static)
    batches[2][3, 8:16] = [-127.74, 3, -1, 0, 5, 9, -60, 2]  # -128 fits: no bump (every mode)
    obs = observe_all(make(be, "PerBlockBFPObserver", is_dynamic=dynamic), batches, be.asarray)
    seen = batches[-1:] if dynamic else batches
    codes = ref.bfp_codes(union_blocks(seen, 8), size=8 * len(seen))
    scale, exponent = obs.calculate_qparams()
    assert_same(exponent, codes.astype(np.uint8), "exponent")
    if not dynamic:
        assert codes[2, 0] == 127 + 7  # 127.5 = 1.99 * 2**6: the mantissa rounds to 128, e = 6 + 1
    assert codes[3, 1] == 127 + 6  # -127.74 rounds to -128: e = 6
    assert_same(obs.fake_quantize(be.asarray(batches[-1])), ref.bfp_fake_quantize(batches[-1], codes).astype(np.float32))


# --------------------------------------------------------------------------------- special values


# One configuration per format, on (8, 64) inputs, shared by the tests below: JAX compiles each
# configuration and input shape once (the equality grid above already ran these).
STANDARD = {
    "int": ("PerGroupMinMaxObserver", dict(group_size=32)),
    "fp8": ("FP8Observer", dict(axis=1, group_size=16)),
    "mx": ("PerBlockMXObserver", dict()),
    "bfp": ("PerBlockBFPObserver", dict()),
}


def standard(be, family: str, **kwargs):
    cls_name, kw = STANDARD[family]
    return make(be, cls_name, **kw, **kwargs)


def test_nan_and_inf_propagate_by_default(be):
    """NaN gives an integer scale NaN (zero point 0), MX code 255, an fp8 scale NaN; +Inf an integer
    scale inf, MX code 254, an fp8 scale inf; other groups stay finite; BFP16 skips both (Quark
    zeroes them): the reference's codes."""
    x = batches_of(6, n=1)[0]
    x[0, 3], x[2, 40] = np.nan, np.inf  # int/MX group (0, 0) and (2, 1); fp8 group (0, 0) and (2, 2)
    qp = {}
    for family in STANDARD:
        obs = standard(be, family)
        obs(be.asarray(x))
        qp[family] = [to_numpy(a) for a in obs.calculate_qparams()]
    (s, z), (fs, _), (ms, codes) = qp["int"], qp["fp8"], qp["mx"]
    assert np.isnan(s[0, 0]) and z[0, 0] == 0 and s[2, 1] == np.inf
    assert np.isnan(fs[0, 0]) and fs[2, 2] == np.inf
    assert codes[0, 0] == 255 and np.isnan(ms[0, 0]) and codes[2, 1] == 254
    rest = [1, 3, 4, 5, 6, 7]
    assert np.isfinite(s[rest]).all() and np.isfinite(fs[rest]).all() and (codes[rest] < 254).all()
    np.testing.assert_array_equal(qp["bfp"][1], ref.bfp_codes(x))


@pytest.mark.parametrize("family", ["int", "fp8", "mx"])
def test_ignore_nonfinite_skips_nan_and_inf(be, family):
    """With ``ignore_nonfinite=True`` NaN/+-Inf change nothing: the qparams equal those of the data
    before a few of its values (none a group's extreme) were replaced by NaN/+-Inf."""
    x = batches_of(7, n=1)[0]
    clean = x.copy()
    for r, c in ((0, 3), (2, 40), (5, 63)):  # make sure none of them held its group's min or max
        g = slice(c // 16 * 16, c // 16 * 16 + 16)
        clean[r, c] = (clean[r, g].min() + clean[r, g].max()) / 2
    x[:] = clean
    x[0, 3], x[2, 40], x[5, 63] = np.nan, np.inf, -np.inf
    obs, reference = standard(be, family, ignore_nonfinite=True), standard(be, family)
    obs(be.asarray(x))
    reference(be.asarray(clean))
    for a, b in zip(obs.calculate_qparams(), reference.calculate_qparams()):
        assert_same(a, to_numpy(b))


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_group_without_finite_values(be, mode):
    """``ignore_nonfinite``: a group with no finite value keeps ``(+inf, -inf)`` (nothing seen) and gets
    the qparams of nothing (integers ``s = 1, z = 0``; MX code 0)."""
    x = batches_of(8, n=1)[0]
    x[0, :32] = np.nan
    for family in ("int", "mx"):
        obs = standard(be, family, ignore_nonfinite=True, is_dynamic=mode == "dynamic")
        obs(be.asarray(x))
        assert to_numpy(obs.state_dict()["min_val"])[0, 0] == np.inf
        qp = [to_numpy(a) for a in obs.calculate_qparams()]
        if family == "int":
            assert qp[0][0, 0] == 1 and qp[1][0, 0] == 0
        else:
            assert qp[1][0, 0] == 0


def test_large_group_nan_propagates_on_every_backend(be):
    """One NaN in a whole-axis group of 8192 elements poisons that group's scale (XLA:CPU's min/max
    reductions drop NaN from 4096 elements on; the core must restore it for groups as for tensors)."""
    x = np.ones((2, 8192), np.float32)
    x[0, 5] = np.nan
    obs = make(be, "PerGroupMinMaxObserver", dtype="int8", group_size=-1)
    obs(be.asarray(x))
    scale = to_numpy(obs.calculate_qparams()[0])
    assert np.isnan(scale[0, 0]) and np.isfinite(scale[1, 0])


def test_zero_and_huge_ranges(be):
    """All-zero groups get ``s = eps`` (integers, fp8) or code 0 (MX); groups at float32's largest
    values get ``s = fl32((M - m) / 15)`` (``M - m`` overflows float32 to inf: ``s = inf``) or
    ``max / 15`` when one-signed, fp8 ``s = max / 448``, MX code ``127 + 127 - 8``."""
    f32max = np.finfo(np.float32).max
    x = batches_of(19, n=1)[0]
    x[0] = 0
    x[1, :32], x[1, 32:] = f32max, -f32max
    qp = {}
    for family in ("int", "fp8", "mx"):
        obs = standard(be, family)
        obs(be.asarray(x))
        qp[family] = [to_numpy(a) for a in obs.calculate_qparams()]
    s, z = qp["int"]
    assert s[0, 0] == np.float32(F32_EPS) and z[0, 0] == -8
    assert s[1, 0] == np.float32(np.float64(f32max) / 15) and z[1, 0] == -8
    assert s[1, 1] == np.float32(np.float64(f32max) / 15) and z[1, 1] == 7
    assert qp["fp8"][0][0, 0] == np.float32(F32_EPS)
    assert qp["fp8"][0][1, 0] == np.float32(np.float64(f32max) / 448)
    assert qp["mx"][1][0, 0] == 0 and qp["mx"][1][1, 0] == 127 + 127 - 8


# ------------------------------------------------------------------------------- inputs and dtypes


# each input dtype with one format, alternating (a new input dtype costs JAX a compilation)
DTYPE_CASES = [("float16", "int"), ("bfloat16", "mx"), ("float64", "int"), ("int8", "mx"), ("uint8", "int"),
               ("int32", "mx")]


def _typed(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed")
        return x.astype(ml_dtypes.bfloat16)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return np.clip(np.round(x * 20), info.min, info.max).astype(dtype)
    return x.astype(dtype)


@pytest.mark.parametrize("backend, dtype, family", on_backends(
    DTYPE_CASES, [c for c in DTYPE_CASES if c[0] not in ("float64", "int32")]))  # JAX without x64: float32
def test_input_dtypes(backend, dtype, family):
    """float16, bfloat16, float64 and integer inputs: qparams equal the core's on the same values
    (float16/bfloat16/integers reduce in float32; float64 keeps a float64 state where the backend has
    float64); fake quantization returns the input's floating dtype (float32 for integers)."""
    be = _make_backend(backend)
    if be.name == "cupy" and dtype == "bfloat16":
        pytest.skip("cupy has no bfloat16")
    batches = [_typed(b, dtype) for b in batches_of(9, n=2)]
    values = [b.astype(np.float64 if dtype == "float64" else np.float32) for b in batches]
    obs = observe_all(standard(be, family), batches, be.asarray)
    state, qp, _ = core_expected(obs.spec, values, dynamic=False)
    assert_same(obs.state_dict()["max_val"], state.max_val, "max_val")
    for a, e in zip(obs.calculate_qparams(), qp):
        assert_same(a, e)
    y = obs.fake_quantize(be.asarray(batches[-1]))
    out = {"bfloat16": "bfloat16", "float16": "float16", "float64": "float64"}.get(dtype, "float32")
    assert str(y.dtype).endswith(out), (y.dtype, out)


def test_empty_inputs_are_no_ops(be):
    """An empty input returns itself and changes nothing (dynamic mode keeps the last batch's
    statistics); before any input ``calculate_qparams`` warns and returns the qparams of nothing."""
    for dynamic in (False, True):
        obs = standard(be, "int", is_dynamic=dynamic)
        empty = be.asarray(np.zeros((0, 64), np.float32))
        assert obs(empty) is empty
        assert to_numpy(obs.state_dict()["min_val"]).shape == (0,)
        with pytest.warns(UserWarning, match="must run observer"):
            s, z = obs.calculate_qparams()
        assert to_numpy(s).tolist() == [1.0] and to_numpy(z).tolist() == [0]
        x = batches_of(10, n=1)[0]
        obs(be.asarray(x))
        before = {k: to_numpy(v).copy() for k, v in obs.state_dict().items()}
        assert obs(empty) is empty
        for k, v in obs.state_dict().items():
            assert same(to_numpy(v), before[k])
    mx = standard(be, "mx")
    with pytest.warns(UserWarning, match="must run observer"):
        assert to_numpy(mx.calculate_qparams().exponent).tolist() == [0]
    with pytest.raises(RuntimeError, match="needs observed statistics"):
        mx.fake_quantize(be.asarray(np.ones((2, 32), np.float32)))


# --------------------------------------------------------------------------------- bad arguments


BAD_ARGUMENTS = [
    ("PerBlockMXObserver", dict(block_size=0), ValueError, "block_size=0"),
    ("PerBlockMXObserver", dict(block_size=-1), ValueError, "block_size=-1"),
    ("PerBlockBFPObserver", dict(block_size=0), ValueError, "block_size=0"),
    ("PerBlockMXObserver", dict(dtype="mxfp9"), ValueError, "dtype='mxfp9'"),
    ("PerBlockMXObserver", dict(dtype="int4"), ValueError, "dtype='int4' is not supported by PerBlockMXObserver"),
    ("PerBlockMXObserver", dict(rounding="nearest"), ValueError, "rounding='nearest'"),
    ("PerGroupMinMaxObserver", dict(dtype="int5"), ValueError, "dtype='int5'"),
    ("PerGroupMinMaxObserver", dict(group_size=0), ValueError, "group_size=0"),
    ("PerGroupMinMaxObserver", dict(group_size=2.5), TypeError, "group_size"),
    ("PerGroupMinMaxObserver", dict(axis=1.0), TypeError, "axis"),
    ("PerGroupMinMaxObserver", dict(symmetric="yes"), TypeError, "symmetric"),
    ("PerGroupMinMaxObserver", dict(eps=0.0), ValueError, "eps=0.0"),
    ("PerGroupMinMaxObserver", dict(is_dynamic="no"), TypeError, "is_dynamic"),
    ("PerGroupMinMaxObserver", dict(ignore_nonfinite=1), TypeError, "ignore_nonfinite"),
    ("FP8Observer", dict(dtype="float8_e3m4"), ValueError, "dtype='float8_e3m4'"),
    ("FP8Observer", dict(granularity="per_block"), ValueError, "granularity='per_block'"),
    ("FP8Observer", dict(granularity="per_channel"), ValueError, "needs an axis"),
    ("LowBitObserver", dict(dtype="mxfp4", group_size=16, block_size=16), ValueError, "block_size or group_size"),
    ("LowBitObserver", dict(dtype="bfp16", rounding="floor"), ValueError, "rounding='floor'"),
]


@pytest.mark.parametrize("cls_name, kwargs, error, match", BAD_ARGUMENTS,
                         ids=[f"{c}-{'-'.join(map(str, k))}" for c, k, _, _ in BAD_ARGUMENTS])
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_bad_arguments(backend, cls_name, kwargs, error, match):
    lb = _make_backend(backend)
    with pytest.raises(error, match=match):
        make(lb, cls_name, **kwargs)


def _bits(obs) -> dict:
    return {k: to_numpy(v).copy() for k, v in obs.state_dict().items()}


def test_bad_inputs_raise_and_leave_state_untouched(lb):
    """Statistics of another shape (static), a group size that does not divide the axis, ``axis`` out
    of range, bool/complex inputs, another framework's array: ``ValueError``/``TypeError`` naming the
    problem, and the state is unchanged."""
    x = batches_of(11, n=1)[0]
    obs = standard(lb, "int")
    obs(lb.asarray(x))
    before = _bits(obs)
    bad = [
        (np.ones((4, 64), np.float32), ValueError, "statistics of shape"),
        (np.ones(64, np.float32), ValueError, "statistics of shape"),  # 1-d: (2,) against (8, 2)
        (np.ones((8, 48), np.float32), ValueError, "not a multiple of group_size=32"),
        (np.ones((8, 64), bool), TypeError, "x must hold real"),
    ]
    if lb.name != "array_api_strict":
        bad.append((np.ones((8, 64), np.complex64), TypeError, "x must hold real"))
    for arr, error, match in bad:
        with pytest.raises(error, match=match):
            obs(lb.asarray(arr))
        assert all(same(to_numpy(v), before[k]) for k, v in obs.state_dict().items())
    other = np.ones((8, 64), np.float32) if lb.name == "torch" else torch.ones(8, 64)
    with pytest.raises(TypeError, match="x must be"):
        obs(other)
    with pytest.raises(ValueError, match="qparams have shape"):
        obs.fake_quantize(lb.asarray(np.ones((4, 64), np.float32)))
    assert all(same(to_numpy(v), before[k]) for k, v in obs.state_dict().items())
    mx = make(lb, "PerBlockMXObserver", axis=2)
    with pytest.raises(ValueError, match="axis=2"):
        mx(lb.asarray(x))
    with pytest.raises(ValueError, match="axis=2"):
        mx(lb.asarray(np.zeros((0, 3), np.float32)))  # checked for empty inputs too
    assert to_numpy(mx.state_dict()["min_val"]).shape == (0,)


def test_dynamic_mode_takes_any_shape(be):
    """Dynamic mode keeps one batch: a batch of another shape replaces the statistics."""
    obs = standard(be, "mx", is_dynamic=True)
    obs(be.asarray(np.ones((8, 64), np.float32)))
    obs(be.asarray(np.full((2, 96), 3.0, np.float32)))
    _, exponent = obs.calculate_qparams()
    assert to_numpy(exponent).shape == (2, 3)
    assert (to_numpy(exponent) == 127 + 1 - 8).all()  # floor(log2(3)) - emax(e4m3) = 1 - 8


def test_state_never_aliases_the_input(be):
    """Per channel over 1-d inputs the statistics are the input itself: the state holds a copy, so the
    next batch (merged in place by torch) and later changes to the input touch neither the other."""
    if be.name == "array_api_strict":
        pytest.skip("array_api_strict arrays cannot be modified in place")
    first = np.array([1.0, -2.0, 3.0], np.float32)
    x = be.asarray(first.copy())
    obs = make(be, "FP8Observer", axis=0)
    obs(x)
    obs(be.asarray(np.array([5.0, -1.0, -7.0], np.float32)))
    np.testing.assert_array_equal(to_numpy(x), first)
    np.testing.assert_array_equal(to_numpy(obs.state_dict()["min_val"]), [1.0, -2.0, -7.0])
    np.testing.assert_array_equal(to_numpy(obs.state_dict()["max_val"]), [5.0, -1.0, 3.0])
    if be.name in ("numpy", "torch", "cupy"):
        dyn = make(be, "FP8Observer", axis=0, is_dynamic=True)
        dyn(x)
        x[0] = 100.0
        assert to_numpy(dyn.state_dict()["max_val"])[0] == 1.0


def test_fake_quantize_checks_the_channel_count(be):
    obs = make(be, "FP8Observer", axis=0)
    obs(be.asarray(np.ones((8, 4), np.float32)))
    with pytest.raises(ValueError, match="channels"):
        obs.fake_quantize(be.asarray(np.ones((6, 4), np.float32)))


# --------------------------------------------------------------------------------- state dicts


def test_state_dict_round_trip_and_reset(lb):
    """``state_dict()`` loads into a fresh observer (same qparams, same next update); a never-updated
    state dict loads as "nothing seen"; ``reset_min_max_vals`` forgets the shape too."""
    batches = batches_of(12, n=3)
    obs = observe_all(standard(lb, "mx"), batches[:2], lb.asarray)
    fresh = standard(lb, "mx")
    fresh.load_state_dict(obs.state_dict())
    for o in (obs, fresh):
        o(lb.asarray(batches[2]))
    for a, b in zip(obs.calculate_qparams(), fresh.calculate_qparams()):
        assert_same(a, to_numpy(b))
    fresh.load_state_dict(standard(lb, "mx").state_dict())
    assert to_numpy(fresh.state_dict()["min_val"]).shape == (0,)
    obs.reset_min_max_vals()
    assert to_numpy(obs.state_dict()["max_val"]).shape == (0,)
    obs(lb.asarray(np.ones((2, 96), np.float32)))  # another shape after a reset
    assert to_numpy(obs.calculate_qparams().exponent).shape == (2, 3)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_torch_state_dict_loads_into_array_observers(backend):
    """A torch observer's state dict (CPU tensors) loads into the numpy/JAX observer and back."""
    lb = _make_backend(backend)
    batches = batches_of(13, n=2)
    t = observe_all(tobs.PerGroupMinMaxObserver(group_size=32), batches, to_torch)
    ours = standard(lb, "int")
    ours.load_state_dict(t.state_dict())
    for a, b in zip(ours.calculate_qparams(), t.calculate_qparams()):
        assert_same(a, b.numpy())
    back = tobs.PerGroupMinMaxObserver(group_size=32)
    back.load_state_dict({k: torch.from_numpy(np.array(to_numpy(v))) for k, v in ours.state_dict().items()})
    assert torch.equal(back.min_val, t.min_val) and torch.equal(back.max_val, t.max_val)


BAD_STATE_DICTS = [
    (lambda sd: {"min_val": sd["min_val"]}, "keys|Missing"),
    (lambda sd: {**sd, "eps": sd["min_val"]}, "keys|Unexpected"),
    (lambda sd: {"min_val": sd["min_val"], "max_val": sd["max_val"][:1]}, "one shape"),
    (lambda sd: {"min_val": sd["max_val"] + 1, "max_val": sd["max_val"]}, "min_val > max_val"),
]


@pytest.mark.parametrize("patch, match", BAD_STATE_DICTS, ids=["missing", "unexpected", "shapes", "min>max"])
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_bad_state_dicts_raise_and_keep_state(backend, patch, match):
    lb = _make_backend(backend)
    obs = observe_all(standard(lb, "int"), batches_of(14, n=1), lb.asarray)
    before = _bits(obs)
    bad = patch({k: (v.clone() if backend == "torch" else np.asarray(to_numpy(v))) for k, v in obs.state_dict().items()})
    if backend == "torch":
        bad = {k: torch.as_tensor(v) for k, v in bad.items()}
    with pytest.raises((ValueError, RuntimeError), match=match):
        obs.load_state_dict(bad)
    assert all(same(to_numpy(v), before[k]) for k, v in obs.state_dict().items())


def test_state_dict_shape_must_fit_the_granularity(be):
    obs = make(be, "FP8Observer")  # per tensor: ()
    with pytest.raises(ValueError, match="does not fit FP8Observer"):
        obs.load_state_dict({"min_val": np.zeros(3, np.float32), "max_val": np.ones(3, np.float32)}
                            if be.name != "torch" else {"min_val": torch.zeros(3), "max_val": torch.ones(3)})
    sd = {"min_val": np.float32(-2.0), "max_val": np.float32(1.0)}
    obs.load_state_dict({k: torch.tensor(v) for k, v in sd.items()} if be.name == "torch" else
                        {k: np.asarray(v) for k, v in sd.items()})
    assert to_numpy(obs.calculate_qparams()[0]) == np.float32(2.0) / np.float32(448)


# ---------------------------------------------------------------------------------- torch only


def test_torch_observer_module_behaviour():
    """torch's ObserverBase subclass with buffers: ``with_args``, torch dtypes, ``torch.save``/``load``
    of the state dict and of the whole module, deepcopy, float64 buffers, ``.to(device)``."""
    from torch.ao.quantization.observer import ObserverBase

    batches = batches_of(15, n=2)
    for cls_name in CLASSES[1:]:
        assert issubclass(getattr(tobs, cls_name), ObserverBase)
    obs = tobs.PerGroupMinMaxObserver.with_args(dtype=torch.int4, group_size=32)()
    assert obs.dtype == "int4" and list(dict(obs.named_buffers())) == ["min_val", "max_val"]
    observe_all(obs, batches, to_torch)
    buf = io.BytesIO()
    torch.save(obs.state_dict(), buf)
    buf.seek(0)
    loaded = tobs.PerGroupMinMaxObserver(torch.int4, group_size=32)
    loaded.load_state_dict(torch.load(buf))
    whole = io.BytesIO()
    torch.save(obs, whole)
    whole.seek(0)
    for other in (loaded, torch.load(whole, weights_only=False), copy.deepcopy(obs)):
        for a, b in zip(other.calculate_qparams(), obs.calculate_qparams()):
            assert torch.equal(a, b)
    f64 = tobs.FP8Observer(torch.float8_e5m2, axis=0)
    f64(torch.from_numpy(batches[0].astype(np.float64)))
    assert f64.min_val.dtype == torch.float64
    reloaded = tobs.FP8Observer(torch.float8_e5m2, axis=0)
    reloaded.load_state_dict(f64.state_dict())
    assert reloaded.max_val.dtype == torch.float64 and torch.equal(reloaded.max_val, f64.max_val)
    with pytest.raises(ValueError, match="dtype=torch.float32"):
        tobs.FP8Observer(torch.float32)
    meta = tobs.PerBlockMXObserver().to("meta")
    assert meta.min_val.device.type == "meta"
    with pytest.raises(ValueError, match="device"):
        meta(torch.ones(2, 32))
    assert meta.min_val.numel() == 0
    x = torch.ones(2, 32, requires_grad=True)
    assert tobs.PerBlockMXObserver()(x) is x
    assert "PerBlockMXObserver(dtype='mxfp8_e4m3'" in repr(tobs.PerBlockMXObserver())


@pytest.mark.gpu("torch-cuda")
def test_torch_cuda_buffers_and_qparams_match_cpu():
    """``.to("cuda")`` moves the buffers; updates, qparams and fake quantization stay on the GPU and
    equal the core functions on the same CUDA tensors bit for bit; against the CPU observer the
    min/max buffers are equal and the scales within ``GPU_DIVISION_ULPS`` ulp (torch's CUDA kernels
    divide by a Python number as a multiplication by its reciprocal: docs/gpu.md "GPU arithmetic")."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    torch_be = _make_backend("torch")
    batches = batches_of(20, n=2)
    for family in STANDARD:
        cpu = observe_all(standard(torch_be, family), batches, to_torch)
        gpu = observe_all(standard(torch_be, family).to("cuda"), batches, lambda a: to_torch(a).cuda())
        assert gpu.min_val.is_cuda
        assert same(gpu.min_val.cpu().numpy(), cpu.min_val.numpy()) and same(gpu.max_val.cpu().numpy(), cpu.max_val.numpy())
        _, qp_core, y_core = core_expected(gpu.spec, [to_torch(b).cuda() for b in batches], dynamic=False)
        qp = gpu.calculate_qparams()
        for a, c in zip(qp, qp_core):
            assert a.is_cuda and same(a.cpu().numpy(), c.cpu().numpy())
        assert_same_on_device(qp[0].cpu().numpy(), cpu.calculate_qparams()[0].numpy(), "torch-cuda", family)
        y = gpu.fake_quantize(to_torch(batches[-1]).cuda())
        assert y.is_cuda and same(y.cpu().numpy(), y_core.cpu().numpy())


# ------------------------------------------------------------------------------------ JAX only


def test_jax_update_qparams_and_fake_quantize_trace_once():
    """The jitted update traces once per input shape and dtype: the first batch, later batches, other
    observers with the same configuration and dynamic observers share it; qparams and fake
    quantization trace once; nothing syncs with the host."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from observers_core.adapters import jax as jobs

    from observers_core.families import lowbit as family

    counters = {name: TraceDelta(jobs.TRACES, getattr(family, name)) for name in ("update", "qparams", "fake_quantize")}
    config = dict(dtype="int3", axis=0, group_size=5, symmetric=True)  # used by no other test
    xs = [jnp.asarray(b) for b in batches_of(16, shape=(10, 12), n=4)]
    obs = jobs.PerGroupMinMaxObserver(**config)
    obs(xs[0])
    assert counters["update"].count == 1
    with jax.transfer_guard_device_to_host("disallow"):
        for x in xs[1:]:
            assert obs(x) is x
    other = jobs.PerGroupMinMaxObserver(**config)
    for x in xs:
        other(x)
    dynamic = jobs.PerGroupMinMaxObserver(**config, is_dynamic=True)
    for x in xs:
        dynamic(x)
    assert counters["update"].count == 1
    with jax.transfer_guard_device_to_host("disallow"):
        for o in (obs, other, dynamic):
            o.calculate_qparams()
            o.fake_quantize(xs[0])
    assert counters["qparams"].count == 1 and counters["fake_quantize"].count == 1
    obs(jnp.ones((10, 12), jnp.bfloat16))  # a new input dtype traces once more
    assert counters["update"].count == 2


def test_jax_pure_update_composes_with_scan():
    """``obs.update``/``obs.qparams`` inside ``jax.jit`` + ``lax.scan`` give the stateful result."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from observers_core.adapters import jax as jobs

    xs = jnp.asarray(np.stack(batches_of(17, n=3)))
    obs = jobs.PerGroupMinMaxObserver(group_size=32)
    for x in xs:
        obs(x)

    @jax.jit
    def calibrate(xs):
        state = obs.update(None, xs[0])
        state, _ = jax.lax.scan(lambda s, x: (obs.update(s, x), None), state, xs[1:])
        return state, obs.qparams(state)

    state, qp = calibrate(xs)
    for a, b in zip((*state, *qp), (*obs.state, *obs.calculate_qparams())):
        assert_same(a, to_numpy(b))
    with pytest.raises(TypeError, match="cannot run inside jit"):
        jax.jit(lambda x: obs(x))(xs[0])


# ------------------------------------------------------------------------------------ CuPy only


@pytest.mark.gpu("cupy")
def test_cupy_state_stays_on_the_inputs_gpu():
    if not _cupy_available():
        pytest.skip("cupy or a CUDA device is not available here")
    import cupy
    from observers_core.adapters import cupy as cobs

    device = cupy.cuda.Device(cupy.cuda.runtime.getDeviceCount() - 1)
    with device:
        x = cupy.asarray(batches_of(18, n=1)[0])
    obs = cobs.PerBlockMXObserver()
    assert obs(x) is x
    for arr in (*obs.state, *obs.calculate_qparams(), obs.fake_quantize(x)):
        assert isinstance(arr, cupy.ndarray) and arr.device == device
    with pytest.raises(TypeError, match="cupy.ndarray"):
        obs(np.ones((8, 64), np.float32))
