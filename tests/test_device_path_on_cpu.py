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
For the classes in ``ARRAY_CODE_TOO`` both tests also run the torch CUDA path without the Triton kernels
(``OBSERVERS_CORE_NO_TRITON=1``: the array code) and require its state too. The KL kernels are also checked
alone: the curve equals the NumPy host path's bit for bit.
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
from observers_core.testing import cuda_path_on_cpu  # noqa: E402

from _adversarial_strategies import KINDS, make_batch  # noqa: E402
from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

_FUZZ_EXAMPLES = int(os.environ.get("OBSERVERS_CORE_FUZZ_EXAMPLES", "0") or 0)
#: classes whose device path is also run as the array code (OBSERVERS_CORE_NO_TRITON=1) and compared
ARRAY_CODE_TOO = ("KLObserver",)


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


def assert_paths_agree(config, batches, kwargs, what: str) -> None:
    name = config[0]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = run(name, kwargs, batches)
        with cuda_path_on_cpu():
            device = run(name, kwargs, batches)
            if name in ARRAY_CODE_TOO:
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


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
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
    assert_paths_agree(config, batches, config[1], str(steps))


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
