"""The torch CUDA path (what a torch observer runs on CUDA: the Triton kernels where a step has them, else
every branch computed with ``where``, no host shortcut, no compiled host kernel) run on CPU tensors must
give the host path's state bit for bit.

CUDA runs this path in the GPU tests only; this test covers it on every machine, inside
:func:`observers_core.testing.cuda_path_on_cpu` (the Triton kernels through Triton's interpreter); the
sequences exercise what the branch-free logic decides: the first batch, a
single-valued state (also at float32's maximum) and its move onto a wider range (the point mass),
growing and unchanged ranges, +/-inf, NaN, integer and float16 batches, and ranges near float32's limit;
a hypothesis test then draws random sequences of the adversarial batch kinds
(``OBSERVERS_CORE_FUZZ_EXAMPLES=N``: N random examples per observer instead of the 10 fixed ones).
For the configurations in ``ARRAY_CODE_TOO`` both tests also run the torch CUDA path without the Triton
kernels (``OBSERVERS_CORE_NO_TRITON=1``: the array code) and require its state too. The KL, MSE and Mix
kernels are also checked alone: the KL curve equals the NumPy host path's bit for bit, the MSE threshold
and Mix's candidate errors, choice and range the torch CUDA array code's.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from observers_core.adapters import torch as tobs  # noqa: E402
from observers_core.testing import count_launches, cuda_path_on_cpu  # noqa: E402

from _adversarial_strategies import KINDS, make_batch  # noqa: E402
from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

_FUZZ_EXAMPLES = int(os.environ.get("OBSERVERS_CORE_FUZZ_EXAMPLES", "0") or 0)
#: configurations (``config_id``) whose device path is also run as the array code (OBSERVERS_CORE_NO_TRITON=1)
#: and compared; MSE and Mix per channel only in their (slow) adversarial runs (``_SLOW_ADVERSARIAL``)
ARRAY_CODE_TOO = ("KLObserver", "KLObserver-per_channel", "MSEObserver", "MixObserver")


@contextlib.contextmanager
def array_code():
    """The torch CUDA path without the Triton kernels (``OBSERVERS_CORE_NO_TRITON=1``: the array code)."""
    from observers_core import _namespace

    old = os.environ.get("OBSERVERS_CORE_NO_TRITON")
    os.environ["OBSERVERS_CORE_NO_TRITON"] = "1"
    _namespace._triton_available.cache_clear()
    try:
        yield
    finally:
        if old is None:
            del os.environ["OBSERVERS_CORE_NO_TRITON"]
        else:
            os.environ["OBSERVERS_CORE_NO_TRITON"] = old
        _namespace._triton_available.cache_clear()


def sequences() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape, scale=1.0: torch.randn(*shape, generator=g) * scale  # noqa: E731
    return {
        "growing": [randn(8, 64, scale=s) for s in (1.0, 3.0, 0.5, 10.0)],
        "point": [torch.full((8, 64), 0.75)],  # the single value binned on torch.histc's widened range
        "point_at_float32_max": [torch.full((8, 64), torch.finfo(torch.float32).max)],  # no wider range: nothing counted
        "point_then_wider": [torch.full((8, 64), 0.75), torch.full((8, 64), 0.75), randn(8, 64)],
        "point_then_one_other_value": [torch.full((8, 64), -2.0), torch.full((8, 64), 5.0), randn(8, 64)],
        "nonfinite": [randn(8, 64), torch.tensor([[float("inf"), -float("inf"), 1.0, 0.5] * 16] * 8), randn(8, 64)],
        "nan": [randn(8, 64), torch.tensor([[float("nan"), 2.0] * 32] * 8), randn(8, 64)],
        "huge": [randn(8, 64, scale=1e37), randn(8, 64, scale=3e38).clamp(-3.4e38, 3.4e38), randn(8, 64)],
        "int_and_half": [torch.randint(-50, 50, (8, 64), generator=g), randn(8, 64, scale=20).half()],
    }


def run(name: str, kwargs: dict, batches: list) -> dict[str, np.ndarray] | str:
    """The observer's state_dict after the batches, or the name of the exception one of them raised."""
    obs = getattr(tobs, name)(**kwargs)
    for x in batches:
        try:
            obs(x)
        except (ValueError, TypeError, RuntimeError) as err:
            return type(err).__name__
    return {key: value.detach().numpy().copy() for key, value in obs.state_dict().items()}


def assert_paths_agree(config, batches, kwargs, what: str, array_too: bool = False) -> None:
    name = config[0]
    array_too = array_too or config_id(config) in ARRAY_CODE_TOO
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = run(name, kwargs, batches)
        with cuda_path_on_cpu():
            device = run(name, kwargs, batches)
            if array_too:
                with array_code():
                    array = run(name, kwargs, batches)
                assert_same_state(array, device, f"{config_id(config)} {what}: array code, kernels")
    assert_same_state(host, device, f"{config_id(config)} {what}: host, device")


def assert_same_state(a, b, what: str) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b, f"{what}: {a!r}, {b!r}"
        return
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=f"{what}: {key}")


@pytest.mark.parametrize("sequence", list(sequences()))
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_device_path_equals_host_path(config, sequence):
    name, kwargs = config
    kwargs = dict(kwargs, ignore_nonfinite=sequence != "nan") if "ignore_nonfinite" in kwargs else kwargs
    assert_paths_agree(config, sequences()[sequence], kwargs, sequence)


#: Adversarial runs left to ``-m slow``: per channel, MSE and Mix run the MSE search's level sums of every
#: (channel, candidate) through Triton's interpreter (~40 s of CPU for the ten examples, as the array code);
#: their kernels are checked in the default run against the array code on NaN/inf/huge batches below.
_SLOW_ADVERSARIAL = ("MSEObserver-per_channel", "MixObserver-per_channel")


@pytest.mark.parametrize("config", [pytest.param(c, marks=pytest.mark.slow) if config_id(c) in _SLOW_ADVERSARIAL else c
                                    for c in CONFIGS], ids=config_id)
@settings(max_examples=_FUZZ_EXAMPLES or 10, derandomize=not _FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_device_path_equals_host_path_on_adversarial_batches(config, data):
    """Three to five batches of the adversarial kinds (tests/_adversarial_strategies.py: huge, subnormal,
    float32's limit, NaN, inf, constant, mixed...) in float32, float64, float16 or int8."""
    steps = data.draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**16),
                                         st.sampled_from(["float32", "float32", "float64", "float16", "int8"])),
                               min_size=3, max_size=5), label="batches")
    batches = [torch.from_numpy(make_batch(kind, seed, (4, 32), dtype, ch_axis=1)) for kind, seed, dtype in steps]
    assert_paths_agree(config, batches, config[1], str(steps), array_too=config_id(config) in _SLOW_ADVERSARIAL)


def test_cuda_path_on_cpu_switches_the_one_predicate_and_restores_it():
    import array_api_compat.numpy as nxp
    import array_api_compat.torch as txp

    from observers_core._namespace import on_host, torch_cuda_path

    x = torch.ones(3)
    assert on_host(x, txp) and not torch_cuda_path(x)
    with cuda_path_on_cpu():
        assert torch_cuda_path(x) and not on_host(x, txp)
        assert on_host(np.ones(3), nxp)  # NumPy arrays stay on the host path
        with cuda_path_on_cpu():
            assert torch_cuda_path(x)
        assert torch_cuda_path(x)  # the inner block restored the outer state
    assert on_host(x, txp) and not torch_cuda_path(x)
    with pytest.raises(RuntimeError), cuda_path_on_cpu():
        raise RuntimeError("restored on errors too")
    assert not torch_cuda_path(x)


def _calibration_cases():
    """(x, axis) batches for the search kernels: per tensor and per channel, tiny and huge magnitudes, zeros,
    NaN, +/-inf, a channel with nothing finite."""
    g = torch.Generator().manual_seed(3)
    cases = []
    for shape, axis, scale in [((16, 128), None, 1.0), ((4, 12), 1, 3.0), ((4, 12), 1, 1e-30), ((4, 32), None, 1e37),
                               ((3, 500), 0, 1.0), ((4, 12), 1, 3e38)]:
        x = (torch.randn(*shape, generator=g) * scale).clamp(-3.4e38, 3.4e38)
        x.view(-1)[:3] = 0.0
        x.view(-1)[5], x.view(-1)[7] = float("nan"), float("inf")
        if axis == 1 and scale > 1e38:
            x[:, 2] = float("nan")
        cases.append((x, axis))
    return cases


_SLOW = pytest.mark.slow
#: The quantizers of the search-kernel tests: the three scale formulas (symmetric, affine, float qparams) in
#: the default run, more levels and zero points in the slow one.
_SEARCH_SPECS = [("qint8", "per_tensor_symmetric"), ("quint8", "per_channel_affine_float_qparams"),
                 pytest.param("quint8", "per_tensor_affine", marks=_SLOW),
                 pytest.param("quint4x2", "per_channel_symmetric", marks=_SLOW)]


@pytest.mark.parametrize("dtype, qscheme", _SEARCH_SPECS)
def test_mse_search_kernels_equal_the_array_search(dtype, qscheme):
    """The three MSE kernels' ``amax`` (``search_amax("mse")`` on the torch CUDA path) is ``mse_threshold``'s
    array code bit for bit, for several strides and bin counts."""
    pytest.importorskip("triton")
    import array_api_compat.torch as txp

    from observers_core import quant_spec
    from observers_core._calibration import CalibHistogram, calib_histogram_edges, mse_threshold
    from observers_core._triton_kernels import range_abs_histogram
    from observers_core.families import calibration as cal

    spec = quant_spec(dtype, qscheme)
    grids = [(256, 1), (256, 3), (512, 2), (256, 1), (300, 1), (256, 5)]  # (bins, stride) of each case
    for (x, axis), (bins, stride) in zip(_calibration_cases(), grids):
        with cuda_path_on_cpu():
            hist = CalibHistogram(*range_abs_histogram(x, axis, bins)[2])
            config = cal.CalibConfig("mse", spec, 0.01, bins, cal.positive_levels(spec), stride=stride)
            with count_launches() as counted:
                kernel = cal.search_amax("mse", hist, config, txp)
            assert counted.triton["_mse_errors_kernel"] == 1 and counted.syncs == 0, counted
            array = mse_threshold(hist.counts, calib_histogram_edges(hist, xp=txp), spec=spec, stride=stride,
                                  check=False, xp=txp)
        assert kernel.dtype == array.dtype and kernel.shape == array.shape
        np.testing.assert_array_equal(kernel.numpy(), array.numpy(), err_msg=f"{tuple(x.shape)} axis={axis}")


_MIX_SPECS = _SEARCH_SPECS + [("qint8", "per_channel_affine"),
                              pytest.param("quint8", "per_channel_symmetric", marks=_SLOW)]


@pytest.mark.parametrize("dtype, qscheme", _MIX_SPECS)
def test_mix_kernels_equal_the_array_code(dtype, qscheme):
    """The Mix kernels' candidate errors, choice and range are ``candidate_errors`` (torch CUDA array code: its
    terms added as :func:`tree_sum`) and ``argmin`` bit for bit (NaN errors where the array code has them)."""
    pytest.importorskip("triton")
    import array_api_compat.torch as txp

    from observers_core import quant_spec
    from observers_core._calibration import CalibHistogram
    from observers_core._dtypes import QScheme
    from observers_core._triton_kernels import mix_pick, range_abs_histogram
    from observers_core.families import calibration as cal

    spec = quant_spec(dtype, qscheme)
    mode = 0 if spec.qscheme.is_symmetric else 2 if spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS else 1
    qrange = float(spec.quant_max - spec.quant_min)
    for x, axis in _calibration_cases():
        with cuda_path_on_cpu():
            lo, hi, parts = range_abs_histogram(x, axis, 256)
            hist = CalibHistogram(*parts)
            config = cal.CalibConfig("mix", spec, 0.01, 256, cal.positive_levels(spec))
            amax = [cal.search_amax(m, hist, config, txp) for m in cal.MIX_CANDIDATES]
            got = mix_pick(x, axis, lo, hi, amax[1:], mode=mode, quant_min=spec.quant_min, quant_max=spec.quant_max,
                           zero_point=spec.symmetric_zero_point, divisor=qrange / 2 if mode == 0 else qrange,
                           eps=float(np.float32(spec.eps)))
            ranges = [cal.clip_range(lo, hi, a, txp) for a in amax]
            lo_k, hi_k = (torch.stack([r[i] for r in ranges], -1) for i in (0, 1))
            errors = cal.candidate_errors(x, lo_k, hi_k, axis=axis, spec=spec, xp=txp, amax=torch.maximum(-lo, hi))
            choice = torch.argmin(errors, -1)
        what = f"{tuple(x.shape)} axis={axis}"
        np.testing.assert_array_equal(got[3].numpy(), errors.numpy(), err_msg=what)  # (NaN == NaN here)
        np.testing.assert_array_equal(got[2].numpy(), choice.numpy(), err_msg=what)
        for out, k in ((got[0], lo_k), (got[1], hi_k)):
            picked = torch.gather(k, -1, choice[..., None])[..., 0]
            np.testing.assert_array_equal(out.numpy(), picked.numpy(), err_msg=what)


def test_tree_sum_adds_adjacent_pairs_level_by_level():
    import array_api_compat.torch as txp

    from observers_core.families.calibration import tree_sum

    v = torch.tensor([[1e16, 1.0, -1e16, 1.0, 3.0]], dtype=torch.float64)
    # ((1e16 + 1) + (-1e16 + 1)) + ((3 + 0) + (0 + 0)): 1e16 + 1 rounds to 1e16, -1e16 + 1 to -1e16 + 2 (even)
    assert float(tree_sum(v, txp)[0]) == ((1e16 + 1.0) + (-1e16 + 1.0)) + 3.0
    assert float(tree_sum(v[:, :1], txp)[0]) == 1e16 and float(tree_sum(v[:, :0], txp)[0]) == 0.0


def _signature(kernel, constexprs: dict, types: dict) -> dict:
    """The compile signature of a Triton kernel: ``types`` by argument name (default ``i32``), ``constexpr``
    for ``constexprs``."""
    return {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in kernel.arg_names}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_calibration_search_kernels_compile_for_a_gpu(mode):
    """The MSE, Mix and clip/average kernels compile to PTX and a cubin for sm_90 (no GPU needed): the
    interpreter accepts Python that the compiler refuses (an enum held in a variable, for one)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from observers_core import _triton_kernels as tk

    pointers = dict(counts_ptr="*i64", p0_ptr="*i64", p1_ptr="*i64", count_ptr="*i64", choice_out="*i64",
                    consts_ptr="*fp64", err_ptr="*fp64", bound_ptr="*fp64", part_ptr="*fp64", errors_out="*fp64")
    floats = dict.fromkeys(["binsf", "d1", "d2", "d3", "eps", "divisor", "c", "one_minus_c"], "fp32")
    types = {**pointers, **floats}
    cases = [
        (tk._mse_prepare_kernel, dict(BLOCK=2048, KBLOCK=1024)),
        (tk._mse_errors_kernel, dict(KBLOCK=32, LBLOCK=128)),
        (tk._mse_pick_kernel, dict(KBLOCK=1024)),
        (tk._mix_errors_kernel, dict(MODE=mode, BLOCK=1024, LOG=10)),
        (tk._mix_pick_kernel, dict(MODE=mode, NBLOCK=64, LOG=6)),
        (tk._clip_average_kernel, dict(CLIP=mode > 0, BLOCK=16)),
    ]
    for kernel, constexprs in cases:
        sig = _signature(kernel, constexprs, types)
        for name in kernel.arg_names:  # the remaining pointers: float32 tensors
            if name.endswith(("_ptr", "_out")) and name not in types:
                sig[name] = "*fp32"
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
        assert "cubin" in compiled.asm and compiled.asm["ptx"], kernel


def kl_histograms(bins: int) -> np.ndarray:
    """Rows of int64 counts that exercise the KL search: decaying (the usual), sparse, a single bin, a spike
    at 0 (flattened away), all zero (every candidate +inf: the last one), constant (exact ties), huge counts."""
    rng = np.random.default_rng(bins)
    j = np.arange(bins)
    rows = [rng.poisson(np.exp(-j / (bins / 8)) * 1000), rng.poisson(50, bins) * (rng.random(bins) < 0.1),
            np.where(j == bins // 3, 7, 0), np.where(j == 0, 10**6, rng.poisson(3, bins)), np.zeros(bins),
            np.full(bins, 4), rng.integers(0, 2**40, bins)]
    return np.stack(rows).astype(np.int64)


@pytest.mark.parametrize("bins, levels", [(512, 128), (512, 256), (300, 9), (40, 17), (1100, 1024), (8, 3)])
def test_kl_kernels_give_the_numpy_curve_and_threshold(bins, levels):
    """``kl_curve`` equals the NumPy host path's ``kl_divergences`` bit for bit (NumPy's pairwise group sums;
    the interpreter's logs are NumPy's), and ``kl_search_amax`` its ``kl_threshold`` on each row's grid."""
    pytest.importorskip("triton")
    from observers_core import _triton_kernels as tk
    from observers_core import kl_divergences, kl_threshold

    counts = kl_histograms(bins)
    width = np.float32(2.0) ** np.arange(-3, counts.shape[0] - 3, dtype=np.float32)
    width[4] = 0.0  # an empty grid
    lo = np.zeros_like(width)
    start = lo[:, None] / np.where(width > 0, width, 1)[:, None]
    edges = (start + np.arange(bins + 1, dtype=np.float32)) * width[:, None]
    curve = kl_divergences(counts, edges, num_levels=levels, check=False).objective
    threshold = kl_threshold(counts, edges, num_levels=levels, check=False)
    with cuda_path_on_cpu():
        got_curve = tk.kl_curve(torch.from_numpy(counts), levels)
        got = tk.kl_search_amax(torch.from_numpy(counts), torch.from_numpy(lo), torch.from_numpy(width), levels)
    np.testing.assert_array_equal(got_curve.numpy(), curve)
    np.testing.assert_array_equal(got.numpy(), threshold)


def test_kl_search_kernel_takes_only_the_levels_it_sums_in_numpy_order():
    """Other level counts (above 128, not a power of two) run the array code: ``kl_search_amax`` refuses them."""
    pytest.importorskip("triton")
    from observers_core import _triton_kernels as tk

    assert tk.kl_search_applies(128) and tk.kl_search_applies(9) and tk.kl_search_applies(1024)
    assert not tk.kl_search_applies(200)
    with pytest.raises(ValueError, match="levels"):
        tk.kl_search_amax(torch.zeros((1, 512), dtype=torch.int64), torch.zeros(1), torch.ones(1), 200)


@pytest.mark.parametrize("axis", [None, 1], ids=["per_tensor", "per_channel"])
def test_kl_accumulator_kernels_equal_the_host_accumulator(axis):
    """The whole accumulator (the histogram's counts and grid, the running range: not in the state dict) after
    sequences of every adversarial kind, float32 and float64 (which the kernels take), two at a time so the
    grid grows, stays (its edges beyond float32's range or not) and re-bins."""
    import array_api_compat.torch as txp

    from observers_core.families import calibration as family

    def accumulate(batches):
        acc = family.kl_init(None if axis is None else batches[0].shape[axis], bins=64, device="cpu", xp=txp)
        for x in batches:
            acc = family.kl_accumulate(acc, x, axis=axis, xp=txp)
        return [a.numpy().copy() for a in (*acc.hist, *acc.seen)]

    pairs = [(kind, other) for i, kind in enumerate(KINDS) for other in (kind, KINDS[(i + 1) % len(KINDS)])]
    for seed, (first, second) in enumerate(pairs):
        batches = [torch.from_numpy(make_batch(kind, 3 * seed + k, (4, 8), "float64" if k == 2 else "float32",
                                               ch_axis=1)) * (4.0 ** k)
                   for k, kind in enumerate((first, second, first))]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            host = accumulate(batches)
            with cuda_path_on_cpu():
                device = accumulate(batches)
        for name, h, d in zip(("counts", "lo", "width", "min_val", "max_val", "seen_min", "seen_max"), host, device):
            np.testing.assert_array_equal(d, h, err_msg=f"{first}, {second}, {first}: {name}")
