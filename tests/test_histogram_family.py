"""observers_core.families.histogram: Config/State/init/update/merge/qparams, merge against torch's combine."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import observers_core as oc
from observers_core.families import histogram as fam

torch = pytest.importorskip("torch")
from _torch_histogram_reference import make_observer, torch_combine  # noqa: E402
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver  # noqa: E402

F32 = np.float32


def _state_np(state):
    return tuple(np.asarray(a) for a in state)


def _run(config, xs):
    state = fam.init(config)
    for x in xs:
        state = fam.update(config, state, x)
    return state


def test_config_is_hashable_validated_and_the_state_keys_are_torchs():
    config = fam.Config(bins=64, upsample_rate=8)
    assert hash(config) == hash(fam.Config(bins=64, upsample_rate=8))
    assert fam.STATE_KEYS == fam.State._fields == ("histogram", "min_val", "max_val")
    obs = TorchHistogramObserver(bins=64)
    assert set(fam.STATE_KEYS) < set(obs.state_dict())
    for kwargs, err in [({"bins": 0}, ValueError), ({"bins": 2.0}, TypeError), ({"upsample_rate": 0}, ValueError),
                        ({"ignore_nonfinite": 1}, TypeError), ({"spec": "quint8"}, TypeError),
                        ({"spec": oc.quant_spec("quint8", "per_channel_affine")}, ValueError)]:  # fmt: skip
        with pytest.raises(err):
            fam.Config(**kwargs)
    with pytest.raises(ValueError, match="num_channels"):
        fam.init(config, num_channels=3)


def test_update_and_qparams_are_torchs():
    rng = np.random.default_rng(0)
    config = fam.Config(bins=256, spec=oc.quant_spec("qint8", "per_tensor_symmetric"))
    ref = TorchHistogramObserver(bins=256, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    xs = [(rng.standard_normal(300) * (i + 1) + i).astype(F32) for i in range(4)]
    for x in xs:
        ref(torch.from_numpy(x))
    state = _run(config, xs)
    for name, value in zip(fam.STATE_KEYS, _state_np(state)):
        np.testing.assert_array_equal(value, getattr(ref, name).numpy(), err_msg=name)
    scale, zero_point = fam.qparams(config, state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_scale, ref_zero_point = ref.calculate_qparams()
    np.testing.assert_array_equal(np.asarray(scale), ref_scale.numpy())
    np.testing.assert_array_equal(np.asarray(zero_point), ref_zero_point.numpy())


_shard = st.lists(st.floats(-100, 100, width=32), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(a=_shard, b=_shard, bins=st.sampled_from([1, 4, 16, 100]), up=st.sampled_from([1, 4, 16]))
def test_merge_equals_torchs_combine(a, b, bins, up):
    """merge = torch's ``_combine_histograms`` of each shard's histogram onto the merged range, added;
    where one range contains the other, one call of torch's combine (the wider one as ``update_hist``)."""
    config = fam.Config(bins=bins, upsample_rate=up)
    sa, sb = (_run(config, [np.asarray(v, F32)]) for v in (a, b))
    merged = _state_np(fam.merge(config, sa, sb))
    (ha, la, ua), (hb, lb, ub) = _state_np(sa), _state_np(sb)
    lo, hi = min(la, lb), max(ua, ub)
    assert merged[1] == lo and merged[2] == hi
    expected = torch_combine(ha, la, ua, lo, hi, upsample_rate=up) + torch_combine(hb, lb, ub, lo, hi, upsample_rate=up)
    np.testing.assert_array_equal(merged[0], expected)
    if lb <= la and ub >= ua:  # b's range holds a's: torch's own combine, a as orig, b as update
        obs = make_observer(ha, la, ua)
        obs.upsample_rate = up
        t = lambda v: torch.tensor(F32(v))  # noqa: E731
        direct = obs._combine_histograms(obs.histogram, t(la), t(ua), torch.from_numpy(hb), t(lb), t(ub)).numpy()
        np.testing.assert_array_equal(merged[0], direct)


@settings(max_examples=60, deadline=None)
@given(shards=st.lists(_shard, min_size=1, max_size=4), bins=st.sampled_from([1, 7, 64]))
def test_merge_of_shards_on_one_range_is_the_single_pass(shards, bins):
    """Every shard holds the overall min and max, so every shard state has the same range: the merge is
    exactly one pass over all the data (and merging is then associative and commutative)."""
    config = fam.Config(bins=bins)
    everything = np.concatenate([np.asarray(s, F32) for s in shards])
    lo, hi = everything.min(), everything.max()
    parts = [np.concatenate([np.asarray(s, F32), [lo, hi]]).astype(F32) for s in shards]
    single = _state_np(_run(config, [np.concatenate(parts)]))
    states = [_run(config, [p]) for p in parts]
    merged = states[0]
    for s in states[1:]:
        merged = fam.merge(config, merged, s)
    for got, want in zip(_state_np(merged), single):
        np.testing.assert_array_equal(got, want)
    backwards = states[-1]
    for s in states[-2::-1]:
        backwards = fam.merge(config, s, backwards)
    for got, want in zip(_state_np(backwards), single):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(a=_shard, b=_shard, bins=st.sampled_from([2, 8, 32]), up=st.sampled_from([1, 16]))
def test_merge_bound_in_general(a, b, bins, up):
    """The docstring's bound: total count exact; at each merged edge, the merged count below it differs
    from the single pass by at most the shards' counts in their bins within one merged-bin width."""
    config = fam.Config(bins=bins, upsample_rate=up)
    xa, xb = np.asarray(a, F32), np.asarray(b, F32)
    sa, sb = _run(config, [xa]), _run(config, [xb])
    merged = _state_np(fam.merge(config, sa, sb))
    single = _state_np(_run(config, [np.concatenate([xa, xb])]))
    assert merged[1] == single[1] and merged[2] == single[2]
    assert merged[0].sum() == single[0].sum() == xa.size + xb.size
    lo, hi = float(merged[1]), float(merged[2])
    width = (hi - lo) / bins
    edges = lo + width * np.arange(1, bins)
    below_merged = np.cumsum(merged[0])[:-1]
    below_single = np.cumsum(single[0])[:-1]
    slack = np.zeros(bins - 1)
    for state in (sa, sb):
        h, s_lo, s_hi = (np.asarray(v, np.float64) for v in state)
        n = h.shape[0]
        if s_hi > s_lo:
            w = (s_hi - s_lo) / n
            left = s_lo + w * np.arange(n)
            near = (left[None, :] - width <= edges[:, None]) & (left[None, :] + w + width >= edges[:, None])
            slack += (near * h[None, :]).sum(axis=1)
        else:  # a single value: all of it moves to one merged bin, within one width of the value
            slack += np.where(np.abs(edges - s_lo) <= width, h.sum(), 0.0)
    assert np.all(np.abs(below_merged - below_single) <= slack), (below_merged, below_single, slack)
