"""The calibration family module (observers_core.families.calibration): KL accumulators of shards
(processes, devices), merged, equal the accumulator of one observer that saw every batch, bit for bit
(histogram counts and grid, and the range; a zero's sign aside), per tensor and per channel, on NumPy and torch; the merge
is associative and commutative, and the KL step on a merged accumulator gives the single pass's range."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from observers_core.families import calibration as family

from conftest import to_numpy

_batch = st.tuples(
    st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 7.0, 1e30, 3e38]),  # magnitude (0: a zeros-only batch)
    st.sampled_from(["normal", "nan", "inf", "positive"]),
    st.integers(0, 2**31 - 1),  # seed
)
_shards = st.lists(st.lists(_batch, min_size=1, max_size=3), min_size=2, max_size=4)


def _make(magnitude, kind, seed, channels, xp_name):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, channels, 5)) * magnitude).astype(np.float32)
    if kind == "nan":
        x[0, 0, 0] = np.nan
    elif kind == "inf":
        x[1, -1, 2] = -np.inf
    elif kind == "positive":
        x = np.abs(x)
    if xp_name == "torch":
        import torch

        return torch.from_numpy(x)
    return x


def _xp(name):
    if name == "torch":
        pytest.importorskip("torch")
        import array_api_compat.torch as xp
    else:
        import array_api_compat.numpy as xp
    return xp


def _bits(acc):
    """Bytes of every field, with -0.0 read as +0.0 (which zero a min/max keeps depends on the order of
    equal values: IEEE leaves it open, and torch and NumPy differ)."""
    return [(to_numpy(a) + 0).tobytes() for a in (*acc.hist, *acc.seen)]


@pytest.mark.parametrize("xp_name", ["numpy", "torch"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=_shards)
def test_merged_shards_equal_one_pass(shards, per_channel, xp_name):
    xp = _xp(xp_name)
    channels, axis = (4, 1) if per_channel else (4, None)
    n = channels if per_channel else None

    def accumulate(batches):
        acc = family.kl_init(n, bins=128, device=None, xp=xp)
        for b in batches:
            acc = family.kl_accumulate(acc, _make(*b, channels, xp_name), axis=axis, xp=xp)
        return acc

    parts = [accumulate(shard) for shard in shards]
    single = accumulate([b for shard in shards for b in shard])
    merged = parts[0]
    for part in parts[1:]:
        merged = family.kl_merge(merged, part, xp=xp)
    assert _bits(merged) == _bits(single)
    reverse = parts[-1]
    for part in reversed(parts[:-1]):
        reverse = family.kl_merge(part, reverse, xp=xp)  # another grouping and order
    assert _bits(reverse) == _bits(single)
    config, _ = family.make_config(
        "t", "kl", dtype="qint8", qscheme="per_channel_symmetric" if per_channel else "per_tensor_symmetric",
        quant_min=None, quant_max=None, ch_axis=1 if per_channel else -1, averaging_constant=0.5, bins=128)
    from observers_core import minmax_init

    start = minmax_init(num_channels=n, xp=xp)
    want = family.kl_update(start, single, config=config, xp=xp)
    got = family.kl_update(start, merged, config=config, xp=xp)
    assert [(to_numpy(a) + 0).tobytes() for a in got] == [(to_numpy(a) + 0).tobytes() for a in want]


def test_empty_accumulator_is_the_identity():
    import array_api_compat.numpy as xp

    acc = family.kl_accumulate(family.kl_init(None, bins=64, device=None, xp=xp),
                               np.linspace(-3, 5, 101, dtype=np.float32), axis=None, xp=xp)
    empty = family.kl_init(None, bins=64, device=None, xp=xp)
    assert _bits(family.kl_merge(acc, empty, xp=xp)) == _bits(acc) == _bits(family.kl_merge(empty, acc, xp=xp))


# -- the family shape: init / update / merge / qparams ------------------------------------------------


@pytest.mark.parametrize("method", ["percentile", "mse", "mix"])
@pytest.mark.parametrize("ch_axis", [-1, 1])
def test_family_steps_equal_the_observer(method, ch_axis):
    """``init``/``update``/``qparams`` of the family module give the NumPy observer's state and qparams."""
    from observers_core.adapters import _array_calibration as observers

    cls = {"percentile": observers.PercentileObserver, "mse": observers.MSEObserver, "mix": observers.MixObserver}[method]
    qscheme = "per_channel_symmetric" if ch_axis >= 0 else "per_tensor_symmetric"
    obs = cls(ch_axis=ch_axis, qscheme=qscheme, averaging_constant=0.3)
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((4, 3, 5)).astype(np.float32) * (i + 1) for i in range(4)]
    state = family.init(obs.config, num_channels=3 if ch_axis >= 0 else None)
    for x in batches:
        obs(x)
        state = family.update(obs.config, state, x, axis=ch_axis if ch_axis >= 0 else None)
    for got, want in zip(state, obs.state):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(family.qparams(obs.config, state), obs.calculate_qparams()):
        np.testing.assert_array_equal(got, want)


def test_family_merge_is_the_replicas_mean_and_kl_takes_one_step():
    from observers_core import MinMaxState
    from observers_core.adapters import _array_calibration as observers

    config = observers.MSEObserver().config
    a = MinMaxState(np.float32(-2.0), np.float32(4.0))
    b = MinMaxState(np.float32(-1.0), np.float32(1.0))
    fresh = family.init(config)
    merged = family.merge(config, a, b)
    assert (float(merged.min_val), float(merged.max_val)) == (-1.5, 2.5)
    assert all(float(u) == float(v) for u, v in zip(family.merge(config, fresh, a), a))  # nothing seen: the other
    kl = observers.KLObserver(update_interval=2)  # KL: one update(state, x) over KLState, as the observer steps
    kl_state = family.init(kl.config)
    for i in range(3):
        x = np.linspace(-i - 1.0, 2.0 * i + 1.0, 7, dtype=np.float32)
        kl(x)
        kl_state = family.update(kl.config, kl_state, x)
    for got, want in zip([*kl_state.range, *family.qparams(kl.config, kl_state)], [*kl.state, *kl.calculate_qparams()]):
        np.testing.assert_array_equal(got, want)
    both = family.merge(kl.config, kl_state, kl_state)
    assert all(np.array_equal(u, v) for u, v in zip(both.range, kl_state.range)) and int(both.steps) == 3
