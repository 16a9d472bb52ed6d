"""The torch-histogram family at float32's limit (issue 10's exactness gap, issue 11 item 8).

Multi-batch sequences mixing ordinary batches with values around 1e33-3.4e38. What is claimed, and
checked here:

- the compiled (numba) path and the array-API path give the same bits, always (ranges wider than
  float32's maximum included);
- both equal torch 2.13's ``HistogramObserver`` bit for bit whenever, at every step, torch's
  ``(max_val - min_val) * bins`` is finite in float32. Where it overflows, torch.histc casts inf to an
  integer (undefined behaviour in C++; values land in bin 0 on x86-64) or, for a span beyond float32's
  maximum, builds NaN bin edges and counts nothing: there is no defined torch result to equal, and ours
  keeps every finite value (the count is preserved) in the bin torch's formula means.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver  # noqa: E402

from observers_core import _compiled  # noqa: E402
from observers_core.adapters.torch import HistogramObserver  # noqa: E402

F32_MAX = float(np.finfo(np.float32).max)


def _batch(rng, huge: bool) -> np.ndarray:
    n = int(rng.integers(1, 40))
    x = rng.standard_normal(n) * 10 ** (rng.uniform(33, 38.6) if huge else rng.uniform(-3, 3))
    if huge and rng.random() < 0.2:
        x[0] = rng.choice([-1.0, 1.0]) * F32_MAX  # the limit itself
    return np.clip(x, -F32_MAX, F32_MAX).astype(np.float32)


def _overflows(obs, bins: int) -> bool:
    """Whether torch's histc on this observer's range computes ``(x - lo) * bins`` past float32."""
    with np.errstate(all="ignore"):
        span = np.float32(obs.max_val.item()) - np.float32(obs.min_val.item())
        return not np.isfinite(span * np.float32(bins))


def _run(batches, bins: int):
    """(torch's observer, ours on the compiled path, ours on the array-API path, whether torch overflowed)."""
    ref = TorchHistogramObserver(bins=bins)
    fast, slow = HistogramObserver(bins=bins), HistogramObserver(bins=bins)
    overflow = False
    saved = _compiled.ENABLED
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for x in batches:
                t = torch.from_numpy(x)
                ref(t.clone())
                _compiled.ENABLED = True
                fast(t.clone())
                _compiled.ENABLED = False
                slow(t.clone())
                overflow |= _overflows(ref, bins)
    finally:
        _compiled.ENABLED = saved
    return ref, fast, slow, overflow


def _state(obs):
    return tuple(getattr(obs, k).numpy().copy() for k in ("histogram", "min_val", "max_val"))


def _same(a, b) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(_state(a), _state(b)))


@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed: only one path to compare")
def test_random_sequences_up_to_float32_max():
    rng = np.random.default_rng(20261123)
    seen = {True: 0, False: 0}
    for _ in range(160):
        bins = int(rng.choice([1, 3, 8, 64, 128, 2048]))
        batches = [_batch(rng, rng.random() < 0.6) for _ in range(int(rng.integers(2, 6)))]
        ref, fast, slow, overflow = _run(batches, bins)
        seen[overflow] += 1
        assert _same(fast, slow), (bins, batches)
        finite = sum(int(np.isfinite(x).sum()) for x in batches)
        assert float(fast.histogram.sum()) == finite  # every finite value counted, once
        if not overflow:
            assert _same(fast, ref), (bins, batches)
    # both regimes were exercised, so neither assertion above is vacuous
    assert seen[True] >= 30 and seen[False] >= 30, seen


_values = st.one_of(
    st.floats(-1e3, 1e3, width=32),
    st.builds(lambda sign, mag: sign * mag, st.sampled_from([-1.0, 1.0]), st.floats(float(np.float32(1e30)), F32_MAX, width=32)),
    st.sampled_from([F32_MAX, -F32_MAX, 1e35, -1e37, 3e38]),
)


@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed: only one path to compare")
@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(_values, min_size=1, max_size=12), min_size=2, max_size=5),
    bins=st.sampled_from([1, 2, 5, 16, 256]),
)
def test_hypothesis_sequences_up_to_float32_max(batches, bins):
    batches = [np.asarray(b, dtype=np.float32) for b in batches]
    ref, fast, slow, overflow = _run(batches, bins)
    assert _same(fast, slow)
    assert float(fast.histogram.sum()) == sum(b.size for b in batches)
    if not overflow:
        assert _same(fast, ref)


@pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed: only one path to compare")
def test_range_wider_than_float32_max_rebins_alike_on_both_paths():
    """Issue 11 item 8: the old histogram re-binned onto a range whose span overflows float32 lands in
    the same bins on both paths (before the fix: bin 0 on one, the last bin on the other)."""
    first = np.asarray([-211.2, 5.0, 991.7], np.float32)
    second = np.asarray([-3.4e38, -3.8e37, 4.6e37], np.float32)
    ref, fast, slow, overflow = _run([first, second], 16)
    assert overflow
    assert _same(fast, slow)
    hist = fast.histogram.numpy()
    # the three old values sit near 0, i.e. 3.4e38 / 3.86e38 of the way up: bin 14 of 16
    assert hist.sum() == 6 and hist[14] == 3 and hist[0] == 1, hist


def test_float64_values_beyond_float32_are_inf_and_dropped_as_torch_drops_inf():
    """A float64 batch is binned as its float32 cast: a value beyond float32's range is ``±inf`` and
    dropped, as torch's observer drops ``inf`` in a float32 batch (ours equal torch's there, bit for bit).
    torch's observer instead keeps it as ``max_val = inf`` and raises at the next batch (``histc``: range
    not finite)."""
    nxt = torch.tensor([0.25, -0.5, 1.0, 2.5])
    for extreme in (1e300, -1e300, 4e38, -3.5e38):
        wide = torch.tensor([extreme, 0.5, -2.0, 3.0], dtype=torch.float64)
        ours, float32_ours, float32_torch = HistogramObserver(), HistogramObserver(), TorchHistogramObserver()
        ours(wide)
        ours(nxt)
        for obs in (float32_ours, float32_torch):
            obs(wide.float())  # the cast: ±inf
            obs(nxt)
        got, mine, want = (o.state_dict() for o in (ours, float32_ours, float32_torch))
        assert all(torch.equal(got[k], want[k]) and torch.equal(mine[k], want[k]) for k in want), extreme
        theirs = TorchHistogramObserver()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs(wide)
            with pytest.raises(RuntimeError, match="not finite"):
                theirs(nxt)


@pytest.mark.parametrize("bins", [8, 2048])
def test_single_value_histogram_beyond_two_to_the_24_moves_as_torchs(bins):
    """A histogram of one value (``min_val == max_val``) moved onto a wider range is all in one bin, its
    total summed in torch's order (``torch.sum``, a float32 cascade): past 2**24 the order decides the last
    bits (NumPy's pairwise sum was 1 ulp off). numpy, the torch adapter (compiled and array paths) and
    JAX equal torch.ao."""
    jnp = pytest.importorskip("jax.numpy")
    from observers_core.adapters import _array_histogram
    from observers_core.adapters import jax as jax_observers

    counts = np.random.default_rng(bins).integers(2_000_000, 16_000_000, bins).astype(np.float32)
    def state():  # fresh tensors each time: torch.ao's load keeps the loaded tensors as its buffers
        return {"histogram": torch.from_numpy(counts.copy()), "min_val": torch.tensor(1.0), "max_val": torch.tensor(1.0)}

    reference = TorchHistogramObserver(bins=bins)
    loaded = {k: v.numpy().copy() for k, v in (reference.state_dict() | state()).items()}
    reference.load_state_dict(reference.state_dict() | state())
    reference(torch.tensor([0.0]))
    want = reference.histogram.numpy()
    assert want.sum() > 2**24 and np.count_nonzero(want) == 2
    saved = _compiled.ENABLED
    try:
        for compiled in (True, False) if _compiled.AVAILABLE else (False,):
            _compiled.ENABLED = compiled
            ours = HistogramObserver(bins=bins)
            ours.load_state_dict(ours.state_dict() | state())
            ours(torch.tensor([0.0]))
            np.testing.assert_array_equal(ours.histogram.numpy(), want)
    finally:
        _compiled.ENABLED = saved
    for obs, x in ((_array_histogram.HistogramObserver(bins=bins), np.zeros(1, np.float32)),
                   (jax_observers.HistogramObserver(bins=bins), jnp.zeros(1))):
        obs.load_state_dict(loaded)
        obs(x)
        np.testing.assert_array_equal(np.asarray(obs.state.histogram), want)
