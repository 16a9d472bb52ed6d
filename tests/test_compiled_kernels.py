"""The compiled CPU kernels (``observers_core/_compiled.py``, numba) against the array-API code and torch.

Host-memory arrays (NumPy, torch CPU) go through numba kernels by default; every other namespace runs the
array-API code. Both must give the same bits: each kernel is compared with the array-API path on random
and adversarial inputs, and the histogram observer's update runs batch sequences against torch.ao with the
kernels switched off (the other histogram tests run them switched on).
"""

from __future__ import annotations

import math

import os

import numpy as np
import pytest
import torch

import array_api_compat.numpy as xnp
import array_api_compat.torch as xt
import observers_core as oc
from observers_core import _compiled
from observers_core import _histogram as H
from _torch_histogram_reference import make_observer, torch_combine
from test_histogram_core import KINDS, _assert_state, _sequence, _torch_states

F32 = np.float32
HOSTS = [pytest.param(xnp, id="numpy"), pytest.param(xt, id="torch")]


def test_the_test_environment_has_the_kernels():
    """The test extra installs numba: without it every compiled path below would go untested."""
    assert _compiled.AVAILABLE and _compiled.ENABLED, "numba is missing or OBSERVERS_CORE_NO_NUMBA is set"


def _both_paths(fn):
    """``(compiled result, array-API result)`` of ``fn()``."""
    out = []
    for enabled in (True, False):
        saved, _compiled.ENABLED = _compiled.ENABLED, enabled
        try:
            with np.errstate(all="ignore"):  # the private functions run outside the public ones' errstate
                out.append(fn())
        finally:
            _compiled.ENABLED = saved
    return out


def _as(xp, a):
    return torch.from_numpy(np.array(a)) if xp is xt else np.asarray(a)


def _data(rng, n, lo, hi):
    """``n`` float32 values over about ``[lo, hi]`` with some outside, NaN, +/-inf, the bounds and their
    neighbours."""
    span = F32(hi) - F32(lo) if math.isfinite(F32(hi) - F32(lo)) else F32(hi)
    x = (F32(lo) + rng.uniform(-0.1, 1.1, n).astype(F32) * span).astype(F32)
    special = np.array([lo, hi, np.nextafter(F32(lo), -np.inf), np.nextafter(F32(hi), np.inf), np.nan, np.inf,
                        -np.inf, 0.0], dtype=F32)  # fmt: skip
    idx = rng.integers(0, n, size=min(n, 64))
    x[idx] = rng.choice(special, size=idx.size)
    return x


RANGES = [(-3.0, 5.0), (0.0, 1.0), (-4.6e-41, 4.6e-41), (1e-45, 3e-45), (-3.4e38, 3.4e38), (3.0e38, 3.4e38),
          (-1e30, 2e30), (7.0, 7.000001)]  # fmt: skip


@pytest.mark.parametrize("xp", HOSTS)
@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize("lo,hi", RANGES)
def test_counts_kernel_equals_array_api(xp, bounded, lo, hi):
    rng = np.random.default_rng(abs(hash((lo, hi, bounded))) % 2**32)
    for bins, n in ((1, 5), (3, 1000), (2048, 5000), (4096, 300_000), (7, 600_001)):
        x = _as(xp, _data(rng, n, lo, hi))
        b = [_as(xp, np.asarray(F32(v))) for v in (lo, hi)]
        compiled, portable = _both_paths(lambda: H._counts(x, bins, *b, xp, bounded=bounded))
        np.testing.assert_array_equal(np.asarray(compiled), np.asarray(portable), err_msg=f"bins={bins} n={n}")
        assert int(np.asarray(compiled).sum()) == n


@pytest.mark.parametrize("xp", HOSTS)
def test_counts_kernel_splits_over_threads_like_one_pass(xp):
    """Above 2**16 values, the count is split in slices over threads; the sum of the parts is the count."""
    x = _as(xp, np.random.default_rng(0).standard_normal(1_000_003).astype(F32))
    b = [_as(xp, np.asarray(F32(v))) for v in (-4.0, 4.0)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        host = x.numpy() if xp is xt else x
        args = [_compiled.host_scalar(v) for v in (b[0], b[1], b[0], F32(1), F32(2048), F32(8))]
        whole = _compiled.counts_kernel(host, *args, 2048, True)
        for workers, chunk in ((3, 1 << 16), (2, 4099), (8, 1 << 17)):
            split = _compiled.split_sum(_compiled.counts_kernel, host, workers, *args, 2048, True, chunk=chunk)
            np.testing.assert_array_equal(whole, split, err_msg=f"workers={workers} chunk={chunk}")
        compiled, portable = _both_paths(lambda: H._counts(x, 2048, *b, xp, bounded=False))
        np.testing.assert_array_equal(np.asarray(compiled), np.asarray(portable))
    finally:
        torch.set_num_threads(threads)


def test_tally_flushes_its_int32_counts_at_each_span_and_at_the_end():
    """The counting kernels tally in int32 and add into their int64 counts every ``_TALLY_SPAN`` values
    (no tally reaches 2**31) and after the last chunk; in between the int64 counts are untouched. Value
    ``j`` is tallied in row ``j % 2``."""
    idx = np.array([0, 2, 2, 1, 2], dtype=np.uint32)
    tally, counts = np.zeros((_compiled._LANES, 3), dtype=np.int32), np.full(3, 2**40, dtype=np.int64)
    _compiled._tally(idx, 4, tally, counts, 0)  # mid-span: only the tally moves
    assert tally.tolist() == [[1, 0, 1], [0, 1, 1]] and counts.tolist() == [2**40] * 3
    _compiled._tally(idx, 5, tally, counts, _compiled._TALLY_SPAN - 5)  # the span ends with this chunk
    assert not tally.any() and counts.tolist() == [2**40 + 2, 2**40 + 2, 2**40 + 5]
    _compiled._tally(idx, 2, tally, counts, -1)  # the last chunk
    assert not tally.any() and counts.tolist() == [2**40 + 3, 2**40 + 2, 2**40 + 6]
    _compiled._tally(idx, 3, tally, counts, 0)  # an odd count: the last value in row 0
    assert tally.tolist() == [[1, 0, 1], [0, 0, 1]]


def test_split_sum_does_not_wait_for_a_thread_that_never_runs(monkeypatch):
    """A helper thread that gets no CPU (here: the pool is busy) leaves its slices to the caller: the
    result is complete and nothing waits for the helper."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    x = np.random.default_rng(1).standard_normal(300_000).astype(F32)
    args = (F32(-4), F32(4), F32(-4), F32(1), F32(64), F32(8), 64, True)
    busy, release = ThreadPoolExecutor(max_workers=1), threading.Event()
    blocker = busy.submit(release.wait)
    monkeypatch.setattr(_compiled, "_pool", busy)
    try:
        split = _compiled.split_sum(_compiled.counts_kernel, x, 2, *args, chunk=4096)
        assert not blocker.done()  # the helper never ran, and split_sum returned anyway
        np.testing.assert_array_equal(split, _compiled.counts_kernel(x, *args))
    finally:
        release.set()
        busy.shutdown()


def test_split_sum_does_not_wait_for_a_thread_stuck_in_a_slice():
    """A helper thread descheduled in the middle of a slice (here: blocked until released) does not hold
    up the result: the caller counts that slice again itself, and the late count is dropped."""
    import threading

    x = np.random.default_rng(2).standard_normal(300_000).astype(F32)
    args = (F32(-4), F32(4), F32(-4), F32(1), F32(64), F32(8), 64, True)
    caller, release, stuck, unstuck = threading.get_ident(), threading.Event(), threading.Event(), threading.Event()

    def kernel(part, *a):
        if threading.get_ident() != caller and not stuck.is_set():
            stuck.set()  # the first slice a pool thread claims never finishes before the caller returns
            release.wait(5)
            unstuck.set()
        elif threading.get_ident() == caller:
            stuck.wait(10)  # the caller goes on once a pool thread holds a slice
        return _compiled.counts_kernel(part, *a)

    try:
        split = _compiled.split_sum(kernel, x, 2, *args, chunk=4096)
        assert stuck.is_set() and not unstuck.is_set()  # returned while the pool thread still held its slice
        np.testing.assert_array_equal(split, _compiled.counts_kernel(x, *args))
    finally:
        release.set()


def test_threads_leave_torchs_threads_their_cores_and_follow_the_grain():
    """With torch loaded the kernels take the calling thread plus the CPUs torch's intra-op threads leave
    free (torch.set_num_threads); small inputs get one."""
    saved = torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        torch.set_num_threads(cpus)
        assert _compiled.threads(1 << 24) == 1
        torch.set_num_threads(1)
        assert _compiled.threads(1 << 24) == min(cpus, (1 << 24) >> 16)
        assert _compiled.threads((1 << 16) - 1) == 1
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_threads_refuses_a_bad_setting_for_any_input_size(monkeypatch, value):
    """``OBSERVERS_CORE_THREADS`` must be a positive integer; a bad value is refused even where a small
    input would take one thread anyway."""
    monkeypatch.setenv("OBSERVERS_CORE_THREADS", value)
    for n in (10, 1 << 24):
        with pytest.raises(ValueError, match="OBSERVERS_CORE_THREADS"):
            _compiled.threads(n)


def test_observers_core_threads_sets_the_count(monkeypatch):
    """OBSERVERS_CORE_THREADS fixes the kernels' thread count (still one per 64K values at most); anything
    but a positive integer is refused with a ValueError naming the variable."""
    monkeypatch.setenv("OBSERVERS_CORE_THREADS", "3")
    assert _compiled.threads(1 << 24) == 3
    assert _compiled.threads(2 << 16) == 2
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("OBSERVERS_CORE_THREADS", bad)
        with pytest.raises(ValueError, match="OBSERVERS_CORE_THREADS must be a positive integer"):
            _compiled.threads(1 << 24)


@pytest.mark.parametrize("xp", HOSTS)
def test_finite_range_fast_path_equals_the_masked_one(xp):
    rng = np.random.default_rng(1)
    cases = [rng.normal(size=1000).astype(F32), np.array([np.nan, 1.0, -2.0], F32), np.array([np.inf, 3.0], F32),
             np.array([-np.inf, np.nan, np.inf], F32), np.array([5.0], F32), np.array([-0.0, 0.0], F32),
             np.array([3.4e38, -3.4e38], F32)]  # fmt: skip
    for x in cases:
        got = H._finite_range(_as(xp, x), xp)
        finite = x[np.isfinite(x)]
        expected = (finite.min(), finite.max()) if finite.size else (np.inf, -np.inf)
        assert tuple(float(v) for v in got) == tuple(float(v) for v in expected), x


def test_linspace_kernel_is_torch_linspace():
    rng = np.random.default_rng(2)
    for _ in range(400):
        a, b = np.sort(rng.standard_normal(2).astype(F32) * F32(10.0 ** rng.uniform(-38, 37)))
        steps = int(rng.choice([2, 3, 17, 2049, 32769, int(rng.integers(2, 70000))]))
        expected = torch.linspace(torch.tensor(a), torch.tensor(b), steps).numpy()
        np.testing.assert_array_equal(_compiled.linspace_kernel(F32(a), F32(b), steps), expected, err_msg=f"{a} {b} {steps}")
        np.testing.assert_array_equal(H._linspace(np.asarray(a), np.asarray(b), steps, xnp), expected)


@pytest.mark.parametrize("xp", HOSTS)
def test_rebin_kernel_is_torch_upscale_histogram(xp):
    rng = np.random.default_rng(3)
    for case in range(60):
        bins = int(rng.choice([1, 2, 3, 100, 2048]))
        up = int(rng.choice([1, 3, 16]))
        scale = F32(10.0 ** rng.integers(-38, 36)) if case % 4 else F32(1)
        old_lo, old_hi = np.sort(rng.standard_normal(2).astype(F32) * scale)
        new_lo = F32(old_lo - abs(rng.standard_normal()) * scale * rng.integers(0, 3))
        new_hi = F32(old_hi + abs(rng.standard_normal()) * scale * rng.integers(0, 3))
        hist = rng.integers(0, 1000, bins).astype(F32) * F32(rng.choice([1, 3, 2**20]))
        if not (new_lo < old_lo < old_hi < new_hi) or not math.isfinite(float(new_hi - new_lo)):
            continue
        expected = torch_combine(hist, old_lo, old_hi, new_lo, new_hi, upsample_rate=up)
        args = [_as(xp, np.asarray(v, F32)) for v in (hist, old_lo, old_hi, new_lo, new_hi)]
        compiled, portable = _both_paths(lambda: H._rebin(*args, up, xp))
        np.testing.assert_array_equal(np.asarray(compiled), expected, err_msg=f"case {case}")
        np.testing.assert_array_equal(np.asarray(portable), expected, err_msg=f"case {case}")


@pytest.mark.parametrize("xp", HOSTS)
@pytest.mark.parametrize("kind", KINDS)
def test_update_sequence_without_kernels_matches_torch_forward(xp, kind):
    """The array-API path on host arrays, batch by batch against torch.ao (the kernels are on in
    ``test_histogram_core``)."""
    batches = _sequence(np.random.default_rng(KINDS.index(kind) + 99), kind)
    _, expected = _torch_states(batches, 100)
    saved, _compiled.ENABLED = _compiled.ENABLED, False
    try:
        state = oc.histogram_init(bins=100, xp=xp)
        for i, x in enumerate(batches):
            state = oc.histogram_update(state, _as(xp, x))
            _assert_state(state, expected[i], f"{kind} batch {i}")
    finally:
        _compiled.ENABLED = saved


@pytest.mark.parametrize("threads", [1, 2])
def test_big_batches_match_torch_forward(threads):
    """Batches of 1M values (split over threads), growing, shrinking and equal ranges, NaN-free with
    a few +/-inf: the torch adapter's buffers equal torch.ao's after each batch."""
    from observers_core.adapters.torch import HistogramObserver

    rng = np.random.default_rng(threads)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        theirs, ours = make_observer(np.zeros(2048), np.inf, -np.inf), HistogramObserver(bins=2048)
        for i, scale in enumerate([1.0, 2.5, 2.5, 0.5, 4.0]):
            x = rng.standard_normal(1 << 20).astype(F32) * F32(scale)
            x[rng.integers(0, x.size, 3)] = [np.inf, -np.inf, np.inf]
            with pytest.warns(UserWarning, match="inf"):
                theirs(torch.from_numpy(x))
            with pytest.warns(UserWarning, match="inf"):
                ours(torch.from_numpy(x))
            for name in ("histogram", "min_val", "max_val"):
                assert torch.equal(getattr(ours, name), getattr(theirs, name)), (i, name)
    finally:
        torch.set_num_threads(saved)
