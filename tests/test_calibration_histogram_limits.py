"""The calibration histogram (CalibHistogram) at the edges of float32 (issue 11, items 2 and 9).

Item 2: a state that had seen only zeros (width 2**-126) meeting a value more than about 4x the bin count
formed ``new_width / width`` = 2**128 = inf, then ``0 * inf`` = NaN, an int64-min index and an IndexError
(KL/MSE/percentile/Mix observers stuck for good; per channel: one dead ReLU channel). Item 9: counts of
values beyond 2**127 (above the capped grid) were dropped on re-binning.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import observers_core as oc

from conftest import FLUSHING_BACKENDS, to_numpy

_values = st.lists(
    st.one_of(
        st.just(0.0),
        st.floats(-3.3999999521443642e38, 3.3999999521443642e38, width=32),
        st.sampled_from([1e-45, -1e-40, 2.0**127, -(2.0**127), 3.4e38, -3.4e38, 5000.0, -3000.0]),
    ),
    min_size=1,
    max_size=24,
)


def _total(state) -> int:
    return int(to_numpy(state.counts).sum())


@pytest.mark.slow  # a hypothesis campaign on every backend
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_values, min_size=1, max_size=4), absolute=st.booleans(), zeros_first=st.booleans())
def test_updates_never_fail_and_keep_every_count(backend, batches, absolute, zeros_first):
    """Any sequence (a zeros-only first batch, huge and subnormal values): no error, every finite value
    counted once, and the sequence of updates equals merging one fresh state per batch."""
    xp = backend.xp
    arrays = ([np.zeros(8, np.float32)] if zeros_first else []) + [np.asarray(b, np.float32) for b in batches]
    init = lambda: oc.calib_histogram_init(bins=64, xp=xp, device=backend.device)  # noqa: E731
    state, merged = init(), init()
    for a in arrays:
        state = oc.calib_histogram_update(state, backend.asarray(a), absolute=absolute)
        fresh = oc.calib_histogram_update(init(), backend.asarray(a), absolute=absolute)
        merged = oc.calib_histogram_merge(merged, fresh)
    assert _total(state) == sum(int(np.isfinite(a).sum()) for a in arrays)
    assert _total(merged) == _total(state)
    if backend.name not in FLUSHING_BACKENDS:  # XLA and CuPy flush subnormals to zero, which can move a bin edge
        for u, v in zip(state, merged):
            np.testing.assert_array_equal(to_numpy(u), to_numpy(v))


@pytest.mark.parametrize("name", ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"])
def test_dead_channel_then_a_wide_batch(name):
    """The issue's repro, per tensor and with one dead channel per channel: no error, finite qparams."""
    torch = pytest.importorskip("torch")
    from observers_core.adapters import torch as ours

    obs = getattr(ours, name)()
    obs(torch.zeros(4, 8))
    obs(torch.linspace(-3000, 3000, 32))
    scale, _ = obs.calculate_qparams()
    assert torch.isfinite(scale).all() and scale.item() > 0

    per_channel = getattr(ours, name)(ch_axis=1, qscheme=torch.per_channel_symmetric)
    x = torch.randn(16, 4)
    x[:, 2] = 0  # a dead ReLU channel
    per_channel(x)
    per_channel(torch.randn(16, 4) * 4000)
    scale, _ = per_channel.calculate_qparams()
    assert torch.isfinite(scale).all() and (scale > 0).all()


def test_counts_beyond_two_to_the_127_are_kept_on_rebinning():
    x = np.array([3.3e38, 3.0e38, 2.0**127, 1.0], dtype=np.float32)
    state = oc.calib_histogram_update(oc.calib_histogram_init(bins=16, xp=np), x)
    state = oc.calib_histogram_update(state, np.array([-3.3e38], dtype=np.float32))  # re-bins the grid
    assert int(state.counts.sum()) == 5
    assert int(state.counts[-1]) == 3  # the three values at or beyond 2**127 stay in the last bin


F32_MAX = float(np.finfo(np.float32).max)
#: Values at float32's maximum, 2**127 (the grid's cap), +-inf (not counted) and ordinary ones.
_EXTREMES = [F32_MAX, -F32_MAX, np.inf, -np.inf, 2.0**127, -(2.0**127), 3e38, -3e38, 1e38, 0.0, 1.0, -1.0]
_SHARDS = [  # found by a random search (the merge put the value at float32's maximum or 2**127 one bin lower)
    [[-1.0, 2.0**127, 3e38], [-(2.0**127), 2.0**127, 2.0**127], [-np.inf, -3e38, -(2.0**127)]],
    [[F32_MAX, 1e38], [np.inf, -F32_MAX], [F32_MAX, 2.0**127, -F32_MAX]],
    [[-(2.0**127), -3e38], [F32_MAX], [1.0, F32_MAX, -1.0]],
    [[1e38, 1.0], [2.0**127], [-3e38, -1.0, 0.0]],
]


def _single_and_merged(backend, shards, bins, absolute):
    init = lambda: oc.calib_histogram_init(bins=bins, xp=backend.xp, device=backend.device)  # noqa: E731
    update = lambda s, v: oc.calib_histogram_update(s, backend.asarray(np.asarray(v, np.float32)),  # noqa: E731
                                                    absolute=absolute)
    single = update(init(), [v for shard in shards for v in shard])
    merged = init()
    for shard in shards:
        merged = oc.calib_histogram_merge(merged, update(init(), shard))
    return single, merged


@pytest.mark.parametrize("bins", [2, 3, 2048])
@pytest.mark.parametrize("absolute", [False, True])
@pytest.mark.parametrize("case", range(len(_SHARDS)))
def test_shards_at_float32_max_and_inf_merge_as_a_single_pass(backend, case, absolute, bins):
    """Shards holding float32's maximum, 2**127 and +-inf (skipped, as the calibration observers'
    ignore_nonfinite=True does), merged: the same state, bit for bit, as one pass over all values."""
    single, merged = _single_and_merged(backend, _SHARDS[case], bins, absolute)
    for field, u, v in zip(single._fields, single, merged):
        np.testing.assert_array_equal(to_numpy(v), to_numpy(u), err_msg=field)


@pytest.mark.slow  # a hypothesis campaign on every backend
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=st.lists(st.lists(st.sampled_from(_EXTREMES), min_size=1, max_size=4), min_size=2, max_size=4),
       absolute=st.booleans(), bins=st.sampled_from([2, 3, 8, 2048]))
def test_shards_of_extreme_values_merge_as_a_single_pass(backend, shards, absolute, bins):
    single, merged = _single_and_merged(backend, shards, bins, absolute)
    for field, u, v in zip(single._fields, single, merged):
        np.testing.assert_array_equal(to_numpy(v), to_numpy(u), err_msg=field)


@pytest.mark.parametrize("case", range(len(_SHARDS)))
def test_kl_observer_shards_merge_as_one_pass(case):
    """torch's KLObserver (ignore_nonfinite=True): the accumulators of one observer per shard, merged with
    kl_merge, equal the accumulator of one observer fed every shard's values at once."""
    torch = pytest.importorskip("torch")
    from observers_core.adapters import torch as ours
    from observers_core.families import calibration as family

    def accumulator(values):
        obs = ours.KLObserver()
        assert obs.ignore_nonfinite
        obs(torch.tensor(values, dtype=torch.float32))
        return obs.accumulator

    shards = _SHARDS[case]
    whole = accumulator([v for shard in shards for v in shard])
    merged = accumulator(shards[0])
    for shard in shards[1:]:
        merged = family.kl_merge(merged, accumulator(shard))
    for field, u, v in zip(whole.hist._fields, whole.hist, merged.hist):
        np.testing.assert_array_equal(to_numpy(v), to_numpy(u), err_msg=field)
