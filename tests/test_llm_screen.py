"""The LLM family's MSE grid search on host float32 arrays (``llm._screened_search``: a compiled screen with
error bounds, the array code's exact errors for near ties) against the array code (kernels off), bit for
bit, on NumPy and torch CPU: int, FP4/FP8, NVFP4, MX and importance-weighted searches, on random, outlier,
zero-row, tiny, huge, subnormal, integer-valued (exact ties), NaN/Inf and multi-observation inputs, every
stopping rule, and with two kernel threads; and the Triton screen of the torch CUDA path (through Triton's
interpreter under ``cuda_path_on_cpu``): one launch, the array code's bits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from observers_core import _compiled
from observers_core.families import llm

pytestmark = pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed")

CONFIGS = {
    "int4-group": llm.Config(num_bits=4, strategy="group", group_size=128, search="mse"),
    "int4-asym-p1": llm.Config(num_bits=4, symmetric=False, strategy="group", group_size=32, search="mse",
                               patience=1),
    "int8-channel-norm2": llm.Config(num_bits=8, strategy="channel", search="mse", norm=2.0, grid=20,
                                     maxshrink=0.9),
    "int2-tensor-p0": llm.Config(num_bits=2, strategy="tensor", search="mse", patience=0, norm=3.0),
    "nvfp4-expanded": llm.Config(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                                 scale_dtype="float8_e4m3fn", search="mse", expand=1.8, maxshrink=1 - 0.8 / 1.8,
                                 grid=200.0, patience=1000),
    "mxfp4": llm.Config(num_bits=4, type="float", strategy="group", group_size=32, scale_dtype="uint8",
                        zp_dtype="uint8", search="mse"),
    "fp8-asym": llm.Config(num_bits=8, type="float", symmetric=False, strategy="group", group_size=64,
                           search="mse", patience=2),
    "imatrix-int4": llm.Config(num_bits=4, strategy="group", group_size=64, search="imatrix", norm=2.4),
    "imatrix-p0": llm.Config(num_bits=8, strategy="channel", search="imatrix", patience=0, maxshrink=0.5,
                             grid=10),
}
KINDS = ["random", "outlier", "zero_row", "tiny", "huge", "subnormal", "integers", "nonfinite"]


def _weight(kind, seed, shape=(24, 256)):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    if kind == "outlier":
        w[rng.integers(0, shape[0], 4), rng.integers(0, shape[1], 4)] = 40.0
    elif kind == "zero_row":
        w[::5] = 0.0
        w[1, :100] = 0.0
    elif kind == "tiny":
        w[::2] *= np.float32(1e-30)
    elif kind == "huge":
        w[::3] *= np.float32(1e30)
    elif kind == "subnormal":
        w[::2] = (w[::2] * np.float32(2.0**-140)).astype(np.float32)
    elif kind == "integers":  # few distinct values: equal errors for several candidates
        w = rng.integers(-3, 4, shape).astype(np.float32)
    elif kind == "nonfinite":
        w[2, 5], w[4, 9], w[6, 0] = np.nan, np.inf, -np.inf
    return w


def _search(w, cfg, weights, enabled, monkeypatch):
    monkeypatch.setattr(_compiled, "ENABLED", enabled)
    o = llm.flatten(w, cfg)
    ww = None if weights is None else llm.flatten(weights, cfg)
    return [np.asarray(a) for a in llm.grid_search(o, cfg, weights=ww)]


def _importance(cfg, shape, seed):
    if cfg.search != "imatrix":
        return None
    imp = np.random.default_rng(seed + 100).exponential(1.0, shape[1]).astype(np.float32)
    imp[:7] = 0.0
    return np.broadcast_to(llm.normalized_importance(imp)[None, :], shape).copy()


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", [k if k in ("random", "zero_row", "subnormal", "integers", "nonfinite") else
                                  pytest.param(k, marks=pytest.mark.slow) for k in KINDS])
@pytest.mark.parametrize("name", CONFIGS)
def test_screen_equals_array_code(name, kind, seed, monkeypatch):
    torch = pytest.importorskip("torch")
    cfg = CONFIGS[name]
    w = _weight(kind, seed, (24, 256) if seed else (12, 256))
    imp = _importance(cfg, w.shape, seed)
    want = _search(w, cfg, imp, False, monkeypatch)
    for arr, wts in ((w, imp), (torch.from_numpy(w), None if imp is None else torch.from_numpy(imp))):
        got = _search(arr, cfg, wts, True, monkeypatch)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint32), b.view(np.uint32)), (name, kind, seed)


def test_screen_runs_and_evaluates_few_groups_exactly(monkeypatch):
    """The screen is taken for a float32 host weight and leaves only near ties to the array code."""
    cfg = CONFIGS["int4-group"]
    o = llm.flatten(_weight("random", 0, (256, 1024)), cfg)
    seen = []
    table = llm.error_table
    monkeypatch.setattr(llm, "error_table", lambda sub, *a, **k: seen.append(int(np.prod(sub.shape[1:-1]))) or table(sub, *a, **k))
    monkeypatch.setattr(_compiled, "ENABLED", True)
    llm.grid_search(o, cfg)
    assert len(seen) <= 1 and sum(seen) < 0.05 * 256 * 8
    monkeypatch.setattr(_compiled, "ENABLED", False)
    seen.clear()
    llm.grid_search(o, cfg)
    assert seen == [256 * 8]


def test_screen_activations_and_threads(monkeypatch):
    """Several observations per group (activations, static MSE), and the kernel split over two threads."""
    cfg = llm.Config(num_bits=8, type="float", strategy="tensor_group", group_size=16, search="mse",
                     scale_dtype="float8_e4m3fn")
    x = np.random.default_rng(3).standard_normal((6, 512)).astype(np.float32)
    o = llm.flatten(x, cfg, role="activation")
    monkeypatch.setattr(_compiled, "ENABLED", False)
    want = [np.asarray(a) for a in llm.grid_search(o, cfg)]
    monkeypatch.setattr(_compiled, "ENABLED", True)
    for threads in ("1", "2"):
        monkeypatch.setenv("OBSERVERS_CORE_THREADS", threads)
        big = replace(cfg, maxshrink=0.9, grid=400.0)  # enough work for a second thread
        monkeypatch.setattr(_compiled, "ENABLED", False)
        want_big = [np.asarray(a) for a in llm.grid_search(o, big)]
        monkeypatch.setattr(_compiled, "ENABLED", True)
        for c, ref in ((cfg, want), (big, want_big)):
            got = [np.asarray(a) for a in llm.grid_search(o, c)]
            assert all(np.array_equal(a, b) for a, b in zip(got, ref))


_SLOW = pytest.mark.slow
TRITON_CASES = [("int4-group", "random"), ("mxfp4", "nonfinite"), ("imatrix-int4", "random"),
                pytest.param("int4-asym-p1", "zero_row", marks=_SLOW), pytest.param("fp8-asym", "integers", marks=_SLOW),
                pytest.param("int2-tensor-p0", "tiny", marks=_SLOW), pytest.param("nvfp4-expanded", "outlier", marks=_SLOW),
                ("mxfp8", "subnormal")]
TRITON_CASES += [pytest.param(name, kind, marks=_SLOW) for name in ("mxfp4", "mxfp8") for kind in KINDS
                 if (name, kind) not in (("mxfp4", "nonfinite"), ("mxfp8", "subnormal"))]


def _bits(a):
    return a.view(__import__("torch").int32)


def _same_or_both_nan(a, b):
    nan = a.isnan()
    return bool((nan == b.isnan()).all()) and __import__("torch").equal(_bits(a[~nan]), _bits(b[~nan]))


@pytest.mark.parametrize("name,kind", TRITON_CASES)
def test_triton_screen_on_the_cuda_path(name, kind, monkeypatch):
    """On the torch CUDA path (here: CPU tensors under ``cuda_path_on_cpu``, Triton's interpreter) the search
    is the screen and the pick kernels (plus the exact rows' kernels when a group is undecided) and one host
    read, and gives the array code's bits (triton off)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from observers_core import _namespace
    from observers_core.testing import count_launches, cuda_path_on_cpu

    cfg = CONFIGS[name] if name != "mxfp8" else replace(CONFIGS["mxfp4"], num_bits=8)
    w = _weight(kind, 0, (8, 256))
    imp = _importance(cfg, w.shape, 0)
    o = llm.flatten(torch.from_numpy(w), cfg)
    ww = None if imp is None else llm.flatten(torch.from_numpy(imp), cfg)
    with cuda_path_on_cpu():
        monkeypatch.setenv("OBSERVERS_CORE_NO_TRITON", "1")
        _namespace._triton_available.cache_clear()
        want = llm.grid_search(o, cfg, weights=ww)
        monkeypatch.setenv("OBSERVERS_CORE_NO_TRITON", "0")
        _namespace._triton_available.cache_clear()
        with count_launches() as launches:
            got = llm.grid_search(o, cfg, weights=ww)
    _namespace._triton_available.cache_clear()
    kernels = dict(launches.triton)
    exact = kernels.pop("_exact_diff_kernel", 0)
    assert kernels.pop("_exact_rows_kernel", 0) == (exact > 0) and launches.syncs <= 1
    assert kernels == {"_search_screen_kernel": 1, "_search_pick_kernel": 1}
    for a, b in zip(got, want):
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name,seed,undecided", [("int4-group", 0, 0), ("int4-group", 1, 2), ("mxfp4", 0, 0)])
def test_triton_search_launches(name, seed, undecided, monkeypatch):
    """A 64 x 256 int4 g128 weight on the torch CUDA path (20 steps): 5 launches (``amin``, ``amax``, the
    screen, a row ``amax``, the pick) and 1 host read when the screen decides every group (seed 0); the
    undecided groups' exact errors add 4 (seed 1: 2 groups; the ``|fq(x) - x|`` kernel, torch's ``pow``
    and ``sum``, the rows' kernel); the array code: about 400 launches; its bits either way. MXFP4 g32 too:
    its E8M0 candidate scales computed in the screen, a step repeating the previous step's scale decided
    there (5 launches, was over 100)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from observers_core import _namespace, _triton_llm
    from observers_core.testing import count_launches, cuda_path_on_cpu

    cfg = CONFIGS[name]
    o = llm.flatten(torch.from_numpy(np.random.default_rng(seed).standard_normal((64, 256)).astype(np.float32)), cfg)
    rows = []
    exact_rows = _triton_llm.exact_rows
    monkeypatch.setattr(_triton_llm, "exact_rows", lambda imp, err, idx: rows.append(idx.shape[0]) or exact_rows(imp, err, idx))
    with cuda_path_on_cpu():
        with count_launches() as launches:
            got = llm.grid_search(o, cfg)
        monkeypatch.setenv("OBSERVERS_CORE_NO_TRITON", "1")
        _namespace._triton_available.cache_clear()
        with count_launches() as plain:
            want = llm.grid_search(o, cfg)
    _namespace._triton_available.cache_clear()
    assert sum(rows) == undecided and launches.syncs == 1 and plain.syncs == 0
    extra = {"pow": 1, "sum": 1} if undecided else {}
    assert dict(launches.aten) == {"amin": 1, "amax": 2, **extra}
    assert launches.launches == (9 if undecided else 5) and plain.launches > 300
    for a, b in zip(got, want):
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name", ["int4-group", "int4-asym-p1", "int2-tensor-p0", "nvfp4-expanded", "mxfp4", "mxfp8",
                                  "fp8-asym"])
def test_triton_exact_diff_is_the_array_code(name):
    """The undecided groups' ``|fq_t(x) - x|`` from the kernel (candidate qparams computed in it, or read from
    ``calculate_qparams``'s for MX / scale dtypes / float zero points) equals the array code's bits, every
    candidate, for groups with NaN/Inf, subnormal and random values (a NaN's bits may differ: its ``** norm`` is
    NaN, which never improves)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from observers_core import _triton_llm
    from observers_core._namespace import array_namespace
    from observers_core.testing import cuda_path_on_cpu

    cfg = CONFIGS[name] if name != "mxfp8" else replace(CONFIGS["mxfp4"], num_bits=8)
    search = llm._search_config(cfg)
    w = _weight("nonfinite", 0, (8, 256))
    w[7] = np.float32(2.0**-140) * w[7]
    o = llm.flatten(torch.from_numpy(w), cfg)
    n, gs = o.shape[0], o.shape[-1]
    lo, hi = torch.amin(o, dim=(0, o.ndim - 1)), torch.amax(o, dim=(0, o.ndim - 1))
    g, t = lo.numel(), len(cfg.shrink_factors())
    factors = torch.tensor(cfg.shrink_factors(), dtype=torch.float32)
    xp = array_namespace(lo)
    cmin = llm._candidates(lo.reshape(g) * cfg.expand, factors, xp)
    cmax = llm._candidates(hi.reshape(g) * cfg.expand, factors, xp)
    s, z = llm.calculate_qparams(cmin, cmax, search)
    x3 = o.reshape(n, g, gs)
    want = torch.abs(llm.fake_quantize(x3[None], s[:, None, :, None], None if search.symmetric else
                                       z[:, None, :, None], search) - x3[None])
    qmin, qmax = llm.quant_range(search)
    fmt = llm._element(search)
    args = dict(steps=t, expand=cfg.expand, grid=cfg.grid, qmin=qmin, qmax=qmax,
                element=None if fmt is None else (fmt.emin, fmt.mbits))
    nonfinite = torch.nonzero(~torch.isfinite(x3).all(dim=(0, 2)))[:, 0]
    idx = torch.unique(torch.cat([nonfinite, torch.tensor([g - 1, g - 2, 0, 1, g // 2]).clamp(0, g - 1)])).flip(0)
    with cuda_path_on_cpu():
        got_tables = _triton_llm.exact_diff(o, lo, hi, idx, **args, scale=s, zero_point=z, has_zp=not search.symmetric)
        want = want[:, :, idx]
        assert _same_or_both_nan(got_tables, want)
        mx = search.is_mx and search.symmetric
        assert mx == name.startswith("mx")
        if mx or (search.scale_dtype is None and (search.symmetric or search.type == "int")):
            zp = llm._INT_RANGE.get(search.zp_dtype, (0, 0))
            divisor = (qmax - qmin) / 2 if search.symmetric else qmax - qmin
            offset = llm._MX_ELEM_OFFSET[search.num_bits] if mx else -1
            got = _triton_llm.exact_diff(o, lo, hi, idx, **args, candidates=(not search.symmetric, divisor, *zp, offset))
            assert _same_or_both_nan(got, want)


try:  # a kernel running the screen's E8M0 scale alone (module level: Triton reads its globals)
    import triton as _triton
    import triton.language as tl

    from observers_core import _triton_llm

    @_triton.jit
    def _mx_scale_kernel(a_ptr, s_ptr, n, offset, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(a_ptr + i, mask=i < n, other=0.0)
        tl.store(s_ptr + i, _triton_llm._mx_scale(a, offset), mask=i < n)
except ImportError:
    _mx_scale_kernel = None


@pytest.mark.parametrize("num_bits", [4, 8])
def test_triton_mx_scale_is_calculate_qparams(num_bits):
    """The screen kernel's E8M0 candidate scale (``_triton_llm._mx_scale``, bit manipulation) equals
    ``calculate_qparams``'s MX scale bit for bit for every binade's edges (mantissa 1, just below and at 1.75,
    the largest), zero, subnormals, the smallest normal's neighbours, float32's max and ``inf``, and random
    magnitudes."""
    torch = pytest.importorskip("torch")
    if _mx_scale_kernel is None:
        pytest.skip("triton is not installed")
    import triton

    from observers_core._triton_kernels import launch
    from observers_core.testing import cuda_path_on_cpu

    exps = np.arange(1, 255, dtype=np.uint32) << 23
    mant = np.array([0, 1, 0x5FFFFF, 0x600000, 0x7FFFFF], dtype=np.uint32)
    edges = (exps[:, None] | mant[None, :]).ravel()
    special = np.array([0, 1, 0x300000, 0x5FFFFF, 0x600000, 0x7FFFFF, 0x7F7FFFFF, 0x7F800000], dtype=np.uint32)
    rand = np.random.default_rng(0).integers(0, 0x7F800000, 4000, dtype=np.uint32)
    amax = torch.from_numpy(np.concatenate([edges, special, rand]).view(np.float32).copy())
    cfg = replace(CONFIGS["mxfp4"], num_bits=num_bits)
    want, _ = llm.calculate_qparams(-amax, amax * 0.5, cfg)
    got = torch.empty_like(amax)
    with cuda_path_on_cpu():
        launch(_mx_scale_kernel, (triton.cdiv(amax.numel(), 4096),), amax, got, amax.numel(), llm._MX_ELEM_OFFSET[num_bits],
               BLOCK=4096)
    assert torch.equal(_bits(got), _bits(want))


def test_triton_screen_activations(monkeypatch):
    """Several observations per group: the kernel's strided layout (value ``i`` of group ``g`` at
    ``x[i // group, g, i % group]``)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from observers_core.testing import cuda_path_on_cpu

    cfg = llm.Config(num_bits=8, type="float", strategy="tensor_group", group_size=16, search="mse",
                     scale_dtype="float8_e4m3fn")
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((5, 3, 64)).astype(np.float32))
    o = llm.flatten(x, cfg, role="activation")
    monkeypatch.setattr(_compiled, "ENABLED", False)
    want = llm.grid_search(o, cfg)
    with cuda_path_on_cpu():
        got = llm.grid_search(o, cfg)
    for a, b in zip(got, want):
        assert torch.equal(_bits(a), _bits(b))


def test_flushed_subnormals_take_the_array_code(monkeypatch):
    """With ``torch.set_flush_denormal(True)`` the screen's bounds do not hold: the array code runs."""
    torch = pytest.importorskip("torch")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        cfg = CONFIGS["int4-group"]
        o = llm.flatten(torch.from_numpy(_weight("subnormal", 0, (8, 256))), cfg)
        seen = []
        table = llm.error_table
        monkeypatch.setattr(llm, "error_table", lambda sub, *a, **k: seen.append(sub.shape) or table(sub, *a, **k))
        monkeypatch.setattr(_compiled, "ENABLED", True)
        got = llm.grid_search(o, cfg)
        assert seen == [tuple(o.shape)]
        monkeypatch.setattr(_compiled, "ENABLED", False)
        want = llm.grid_search(o, cfg)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("name", ["int4-group", "nvfp4-expanded", "imatrix-int4"])
def test_triton_screen_on_a_gpu(name, monkeypatch):
    """On a CUDA device: the Triton screen gives the array code's bits (triton off), the undecided groups'
    exact errors being torch's CUDA sums over fewer groups."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    from observers_core import _namespace

    cfg = CONFIGS[name]
    for kind in KINDS:
        w = torch.from_numpy(_weight(kind, 0, (64, 1024))).cuda()
        imp = _importance(cfg, tuple(w.shape), 0)
        ww = None if imp is None else llm.flatten(torch.from_numpy(imp).cuda(), cfg)
        o = llm.flatten(w, cfg)
        monkeypatch.setenv("OBSERVERS_CORE_NO_TRITON", "1")
        _namespace._triton_available.cache_clear()
        want = llm.grid_search(o, cfg, weights=ww)
        monkeypatch.setenv("OBSERVERS_CORE_NO_TRITON", "0")
        _namespace._triton_available.cache_clear()
        got = llm.grid_search(o, cfg, weights=ww)
        _namespace._triton_available.cache_clear()
        for a, b in zip(got, want):
            assert torch.equal(_bits(a), _bits(b)), (name, kind)
