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

HistogramObserver.calculate_qparams (the L2 search kernel) is compared three ways: the host path, the
kernel and the device path's array code (``OBSERVERS_CORE_NO_TRITON``'s route), on the fixed sequences,
adversarial batches and drawn core states; its device functions one by one against the host's arithmetic;
and, on a CUDA machine, compiled against the host.

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


#: Per channel, the calibration observers run every channel's rows through Triton's interpreter (4-30 s a
#: sequence): the default run takes one sequence of each, ``-m slow`` all of them.
_SLOW_PER_CHANNEL = ("KLObserver-per_channel", "MSEObserver-per_channel", "MixObserver-per_channel",
                     "PercentileObserver-per_channel")
_DEFAULT_PER_CHANNEL_SEQUENCES = ("int_and_half",)


def _fixed_cases():
    for config in CONFIGS:
        for sequence in sequences():
            slow = config_id(config) in _SLOW_PER_CHANNEL and sequence not in _DEFAULT_PER_CHANNEL_SEQUENCES
            yield pytest.param(config, sequence, marks=[pytest.mark.slow] if slow else [],
                               id=f"{config_id(config)}-{sequence}")


@pytest.mark.parametrize("config, sequence", list(_fixed_cases()))
def test_device_path_equals_host_path(config, sequence):
    name, kwargs = config
    kwargs = dict(kwargs, ignore_nonfinite=sequence != "nan") if "ignore_nonfinite" in kwargs else kwargs
    assert_paths_agree(config, sequences()[sequence], kwargs, sequence)


#: Adversarial runs left to ``-m slow``: per channel, KL, MSE and Mix run their searches over every
#: (channel, candidate) through Triton's interpreter (~40 s of CPU for the ten examples, as the array code);
#: their kernels are checked in the default run against the array code on NaN/inf/huge batches below.
_SLOW_ADVERSARIAL = ("MSEObserver-per_channel", "MixObserver-per_channel", "KLObserver-per_channel")


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


# ----------------------------------------------------------------------------------------------------------
# HistogramObserver.calculate_qparams: the L2 search kernel (_triton_kernels.l2_search) against the host path
# and the array code of the device path (OBSERVERS_CORE_NO_TRITON's route)


@contextlib.contextmanager
def _array_code():
    """Inside: the torch CUDA path runs the array code (no Triton kernel), as with OBSERVERS_CORE_NO_TRITON=1."""
    from observers_core import _namespace

    original = _namespace._triton_available
    _namespace._triton_available = lambda: False
    try:
        yield
    finally:
        _namespace._triton_available = original


def _outcome(call) -> tuple:
    """``(result as NumPy arrays, or the exception's type name; the warnings' messages)``."""
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        try:
            result = tuple(np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v).copy() for v in call())
        except (ValueError, TypeError) as err:
            result = type(err).__name__
    return result, [str(w.message) for w in caught]


def _assert_three_paths_agree(call, what: str) -> None:
    """``call()`` on the host path, on the torch CUDA path (the kernel, through the interpreter) and on its
    array code: the same results bit for bit (or the same exception), the same warnings. (Without triton
    or with OBSERVERS_CORE_NO_TRITON set, the CUDA path runs the array code twice.)"""
    from observers_core import _namespace
    from observers_core.testing import count_launches

    host = _outcome(call)
    with cuda_path_on_cpu():
        with count_launches() as counted:
            kernel = _outcome(call)
        with _array_code():
            array = _outcome(call)
    if _namespace._triton_available():
        assert counted.triton["_l2_search_kernel"] == 1, (what, counted)
    for name, got in (("kernel", kernel), ("array code", array)):
        if isinstance(host[0], str) or isinstance(got[0], str):
            assert got[0] == host[0], f"{what}: host {host[0]!r}, {name} {got[0]!r}"
        else:
            assert len(got[0]) == len(host[0])
            for g, h in zip(got[0], host[0]):
                assert g.dtype == h.dtype and g.shape == h.shape, (what, name, g, h)
                np.testing.assert_array_equal(g, h, err_msg=f"{what}: {name}")
        assert got[1] == host[1], f"{what}: warnings of the {name}: {got[1]} != {host[1]}"


@pytest.mark.parametrize("sequence", list(sequences()))
def test_histogram_qparams_device_paths_equal_host(sequence):
    """The fixed sequences (forwards on the host), then calculate_qparams on the three paths."""
    obs = tobs.HistogramObserver(ignore_nonfinite=sequence != "nan")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for x in sequences()[sequence]:
            obs(x)
    _assert_three_paths_agree(obs.calculate_qparams, sequence)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")
@pytest.mark.parametrize("sequence", list(sequences()))
def test_histogram_qparams_on_cuda_equal_host(sequence):
    """On a GPU, compiled: the same state (the forwards on the host, then moved) gives the host's qparams
    bit for bit (the kernel adds in torch's CPU order) and the same warnings, in one kernel."""
    from observers_core import _namespace
    from observers_core.testing import count_launches

    obs = tobs.HistogramObserver(ignore_nonfinite=sequence != "nan")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for x in sequences()[sequence]:
            obs(x)
    host = _outcome(obs.calculate_qparams)
    obs.cuda()
    with count_launches() as counted:
        device = _outcome(obs.calculate_qparams)
    if _namespace._triton_available():
        assert counted.triton["_l2_search_kernel"] == 1, counted
    assert device[1] == host[1]
    if isinstance(host[0], str) or isinstance(device[0], str):
        assert device[0] == host[0]
    else:
        for d, h in zip(device[0], host[0]):
            assert d.dtype == h.dtype and d.shape == h.shape, (sequence, d, h)
            np.testing.assert_array_equal(d, h, err_msg=sequence)


_OBSERVER_KWARGS = [
    {}, dict(ignore_nonfinite=True), dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
    dict(bins=7, reduce_range=True), dict(bins=64, dtype=torch.qint8), dict(bins=3000, quant_min=0, quant_max=15),
]


@settings(max_examples=_FUZZ_EXAMPLES or 10, derandomize=not _FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_histogram_qparams_device_paths_equal_host_on_adversarial_batches(data):
    """One to four batches of the adversarial kinds (forwards on the host), an observer configuration,
    then calculate_qparams on the three paths."""
    kwargs = data.draw(st.sampled_from(_OBSERVER_KWARGS), label="observer")
    steps = data.draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**16),
                                         st.sampled_from(["float32", "float32", "float64", "float16", "int8"])),
                               min_size=1, max_size=4), label="batches")
    obs = tobs.HistogramObserver(**kwargs)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for kind, seed, dtype in steps:
            obs(torch.from_numpy(make_batch(kind, seed, (4, 32), dtype, ch_axis=1)))
    _assert_three_paths_agree(obs.calculate_qparams, f"{kwargs} {steps}")


def _histogram(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "counts":
        return (rng.poisson(rng.uniform(0, 40), n) * (rng.random(n) < 0.7)).astype(np.float32)
    if kind == "bell":
        return (np.exp(-((np.arange(n) - rng.uniform(0, n)) / max(1.0, n / 30)) ** 2) * 1e4).astype(np.float32)
    if kind == "fractions":  # re-binned counts: multiples of 1/16 and below
        return (rng.integers(0, 4000, n) / 16.0 / rng.choice([1.0, 16.0, 256.0], n)).astype(np.float32)
    if kind == "spike":
        h = np.zeros(n, np.float32)
        h[rng.integers(0, n)] = rng.uniform(1, 1e6)
        return h
    if kind == "huge_then_ones":  # float64 running sums that round: the kernel's one-at-a-time cumsum
        h = np.ones(n, np.float32)
        h[0] = 2.0**60
        return h
    if kind == "zeros":
        return np.zeros(n, np.float32)
    if kind == "negative":
        h = np.ones(n, np.float32)
        h[rng.integers(0, n)] = -1.0
        return h
    h = np.ones(n, np.float32)  # "nan"
    h[rng.integers(0, n)] = np.nan
    return h


_RANGES = {
    "unit": (-1.0, 1.0), "positive": (0.5, 3.0), "point": (2.0, 2.0), "tiny": (1e-30, 1.0000001e-30),
    "wide": (-3e38, 3e38), "huge": (-1e38, 2e38), "empty": (np.inf, -np.inf), "nan": (np.nan, np.nan),
    "infinite": (-np.inf, 1.0), "decreasing": (1.0, -1.0),
}


@settings(max_examples=_FUZZ_EXAMPLES or 30, derandomize=not _FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_histogram_qparams_and_search_of_drawn_states(data):
    """The core functions (histogram_qparams, non_linear_param_search) of drawn histogram states: counts,
    fractions, a single spike, zeros, float64 sums that round, invalid counts; ranges from a point to
    float32's span, empty, NaN, infinite and decreasing; affine and symmetric specs, 1 to 3000 bins."""
    import observers_core as oc

    n = data.draw(st.sampled_from([1, 2, 7, 8, 33, 256, 2048, 3000]), label="bins")
    kind = data.draw(st.sampled_from(["counts", "bell", "fractions", "spike", "huge_then_ones", "zeros",
                                      "negative", "nan"]), label="counts")
    rng_name = data.draw(st.sampled_from(list(_RANGES)), label="range")
    spec = data.draw(st.sampled_from([
        oc.quant_spec("quint8"), oc.quant_spec("qint8", "per_tensor_symmetric"),
        oc.quant_spec("quint8", "per_tensor_symmetric", reduce_range=True),
        oc.quant_spec("int16"), oc.quant_spec("qint32", quant_min=-(2**31), quant_max=2**31 - 1),
    ]), label="spec")
    levels = data.draw(st.sampled_from([256, 1, 3, 1000, 2**24 + 1]), label="dst_nbins")
    if rng_name in ("nan", "wide", "huge") or levels != 256:  # NaN errors, few or many levels: long walks
        n = min(n, 256)  # (~10 ms per step, interpreted)
    hist = torch.from_numpy(_histogram(kind, n, data.draw(st.integers(0, 2**16), label="seed")))
    lo, hi = (torch.tensor(v, dtype=torch.float32) for v in _RANGES[rng_name])
    state = oc.HistogramState(hist, lo, hi)
    what = f"{n} bins, {kind}, {rng_name}, {spec}"
    _assert_three_paths_agree(lambda: oc.histogram_qparams(state, spec), what)
    _assert_three_paths_agree(lambda: oc.non_linear_param_search(hist, lo, hi, dst_nbins=levels), what)


# the kernel's device functions one by one, through probe kernels (interpreted), against the host's arithmetic

try:  # the probe kernels (module globals: a kernel sees its module's names, not a closure's)
    import triton
    import triton.language as tl

    from observers_core import _triton_kernels as K
except ImportError:  # the tests below skip
    triton = None

if triton is not None:
    @triton.jit
    def _sum32_probe(v_ptr, n, lvl_ptr, out_ptr, LANES: tl.constexpr, GB: tl.constexpr):
        tl.store(out_ptr, K._sum32(v_ptr, n, lvl_ptr, LANES, GB))

    @triton.jit
    def _errors_probe(hist_ptr, n, starts, ends, count, width_ptr, dst_nbins, top, row_ptr, lvl_ptr, out_ptr,
                      BLOCK: tl.constexpr, LANES: tl.constexpr, GB: tl.constexpr):
        for c in range(0, count):
            tl.store(out_ptr + c, K._l2_error(hist_ptr, n, tl.load(starts + c), tl.load(ends + c), tl.load(width_ptr),
                                              dst_nbins, top, row_ptr, lvl_ptr, BLOCK, LANES, GB))

    @triton.jit
    def _cumsum_probe(h_ptr, n, cs_ptr, p_ptr, BLOCK: tl.constexpr):
        K._checked_cumsum(h_ptr, n, cs_ptr, p_ptr, BLOCK)

    @triton.jit
    def _end_count_probe(betas_ptr, nbeta, cs_ptr, total_ptr, count, out_ptr, BSTEPS: tl.constexpr):
        for c in range(0, count):
            tl.store(out_ptr + c, K._end_count(betas_ptr, nbeta, tl.load(cs_ptr + c), tl.load(total_ptr + c), BSTEPS))

needs_triton = pytest.mark.skipif(triton is None, reason="triton is not installed")


def _lanes_gb(n: int) -> tuple[int, int]:
    lanes = 8 if n >= 8 else 1
    return lanes, min(64, triton.next_power_of_2(max(1, n // lanes // 64)))


@needs_triton
@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 31, 32, 33, 127, 513, 2048, 2049, 8191, 40000])
def test_kernel_sum32_adds_in_the_host_order(n):
    """``_sum32`` against ``_histogram.sum32`` (torch's CPU order, NumPy), bit for bit, on values whose sum
    depends on the order (mixed signs and magnitudes)."""
    from observers_core._histogram import _numpy_namespace, sum32

    rng = np.random.default_rng(n)
    v = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)).astype(np.float32)
    out = torch.empty(1)
    lanes, gb = _lanes_gb(n)
    K.launch(_sum32_probe, (1,), torch.from_numpy(v), n, torch.empty(n // 8 + 64), out, LANES=lanes, GB=gb)
    np.testing.assert_array_equal(out.numpy()[0], sum32(v, _numpy_namespace()))


@needs_triton
@pytest.mark.parametrize("n, lo, hi", [(2048, -3.0, 5.0), (33, 0.0, 1e-3), (300, -2e12, 2e12), (200, -1e14, 1e14),
                                       (64, -1e38, 2e38), (16, 1.0, 1.0)])
def test_kernel_errors_equal_the_host_errors(n, lo, hi):
    """``_l2_error`` of drawn candidates against the host's ``quantization_error`` (its float32 terms and
    sum order), bit for bit, also where cubes overflow (inf, NaN) and the levels have zero width."""
    from observers_core import quantization_error

    rng = np.random.default_rng(n)
    hist = (rng.poisson(5.0, n) * (rng.random(n) < 0.8) + rng.integers(0, 16, n) / 16).astype(np.float32)
    starts = rng.integers(0, n, 12)
    ends = np.minimum(starts + rng.integers(0, n, 12), n - 1)
    width = np.asarray([(np.float64(np.float32(hi)) - np.float64(np.float32(lo))) / n])
    out = torch.empty(12)
    lanes, gb = _lanes_gb(n)
    K.launch(_errors_probe, (1,), torch.from_numpy(hist), n, torch.from_numpy(starts.astype(np.int32)),
             torch.from_numpy(ends.astype(np.int32)), 12, torch.from_numpy(width), 256.0, 255.0, torch.empty(n),
             torch.empty(n // 8 + 64), out, BLOCK=min(4096, max(16, 1 << (n - 1).bit_length())), LANES=lanes, GB=gb)
    expected = [quantization_error(hist, np.float32(lo), np.float32(hi), int(s), int(e), dst_nbins=256)
                for s, e in zip(starts, ends)]
    np.testing.assert_array_equal(out.numpy(), np.asarray(expected, np.float32))


@needs_triton
@pytest.mark.parametrize("prefix", ["left_to_right", "pairwise", "garbage"])
def test_kernel_cumsum_keeps_only_left_to_right_sums(prefix):
    """``_checked_cumsum`` gives the host's running sums (float64, left to right, then float32) whatever
    prefix it is handed: kept when it is the left-to-right one, else summed again one at a time (on a
    GPU the block scan adds in a tree order; here the check is fed one). The values make the orders
    differ: 2**60 then ones."""
    from observers_core._l2_search import _cumsum32
    from observers_core._histogram import _numpy_namespace

    n = 600
    h = np.ones(n, np.float32)
    h[0] = 2.0**60
    h[300:] = np.random.default_rng(0).integers(0, 9, n - 300) / 8
    p = {"left_to_right": np.cumsum(h.astype(np.float64)),
         "pairwise": np.concatenate([[2.0**60], 2.0**60 + np.cumsum(h[1:].astype(np.float64))]),
         "garbage": np.random.default_rng(1).random(n)}[prefix]
    if prefix != "left_to_right":
        assert not np.array_equal(p, np.cumsum(h.astype(np.float64)))  # (the fallback is what runs)
    cs = torch.empty(n)
    K.launch(_cumsum_probe, (1,), torch.from_numpy(h), n, cs, torch.from_numpy(p.copy()), BLOCK=256)
    np.testing.assert_array_equal(cs.numpy(), _cumsum32(h, _numpy_namespace()))


@needs_triton
def test_kernel_end_count_counts_the_thresholds_reached():
    """``_end_count`` = #{b : float32(beta_b * total) >= cs}, counted on the host, for drawn sums and totals
    (window and binary-search paths: a zero total, sums at and beyond the total, tiny and huge totals)."""
    import math

    from observers_core._l2_search import _walk_tables

    betas = _walk_tables()[1]
    rng = np.random.default_rng(0)
    totals = np.float32(10.0) ** rng.integers(-30, 30, 40).astype(np.float32) * rng.random(40).astype(np.float32)
    totals[:4] = [0.0, 1.0, 3e38, 1e-40]
    cs = (totals * rng.choice([0.0, 0.3, 0.99999, 1.0, 1.5, rng.random()], 40)).astype(np.float32)
    totals64 = totals.astype(np.float64)
    out = torch.empty(40, dtype=torch.int32)
    K.launch(_end_count_probe, (1,), torch.from_numpy(betas), betas.shape[0], torch.from_numpy(cs),
             torch.from_numpy(totals64), 40, out, BSTEPS=math.ceil(math.log2(betas.shape[0] + 1)))
    expected = [int(np.sum((betas * t).astype(np.float32) >= c)) for c, t in zip(cs, totals64)]
    assert out.tolist() == expected
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
