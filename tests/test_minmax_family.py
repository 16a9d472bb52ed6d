"""The min/max family module (observers_core.families.minmax): the running range's merge of shards is
the single pass (associative, commutative, fresh state as identity); the moving average's merge is the
mean of replicas; updates and qparams equal torch.ao's observers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import observers_core as oc
from observers_core.families import minmax as family

torch = pytest.importorskip("torch")
from torch.ao.quantization import observer as tao  # noqa: E402

PER_TENSOR = family.Config(oc.quant_spec("quint8", "per_tensor_affine"))
PER_CHANNEL = family.Config(oc.quant_spec("qint8", "per_channel_symmetric"), ch_axis=1)

_batches = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([0.0, 1e-30, 1.0, 1e30, 3e38]), st.booleans()),
    min_size=1,
    max_size=6,
)


def _arrays(draws, seed: int) -> list[np.ndarray]:
    """(rows, 3) float32 batches at the drawn magnitudes, a NaN where drawn."""
    rng = np.random.default_rng(seed)
    out = []
    for rows, magnitude, nan in draws:
        x = (rng.standard_normal((rows, 3)) * magnitude).astype(np.float32)
        if nan and x.size:
            x[0, 0] = np.nan
        out.append(x)
    return out


def _run(config, batches, xp=np):
    state = family.init(config, num_channels=None if config.ch_axis is None else 3, xp=xp)
    for x in batches:
        state = family.update(config, state, x)
    return state


def _equal(a, b) -> None:
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draws=_batches, cuts=st.lists(st.integers(0, 6), min_size=2, max_size=3), seed=st.integers(0, 2**16))
def test_running_range_merge_of_shards_is_the_single_pass(draws, cuts, seed):
    batches = _arrays(draws, seed)
    for config in (PER_TENSOR, PER_CHANNEL):
        edges = sorted({0, len(batches), *(min(c, len(batches)) for c in cuts)})
        shards = [_run(config, batches[a:b]) for a, b in zip(edges, edges[1:])]
        merged = family.init(config, num_channels=None if config.ch_axis is None else 3)
        for s in shards:
            merged = family.merge(config, merged, s)
        _equal(merged, _run(config, batches))
        if len(shards) >= 2:  # commutative and associative
            _equal(family.merge(config, shards[1], shards[0]), family.merge(config, shards[0], shards[1]))
        if len(shards) == 3:
            left = family.merge(config, family.merge(config, shards[0], shards[1]), shards[2])
            right = family.merge(config, shards[0], family.merge(config, shards[1], shards[2]))
            _equal(left, right)


def test_moving_average_merge_is_the_mean_of_replicas():
    config = family.Config(oc.quant_spec("quint8", "per_tensor_affine"), averaging_constant=0.5)
    a = _run(config, [np.array([-2.0, 4.0], np.float32), np.array([0.0, 2.0], np.float32)])
    b = _run(config, [np.array([-4.0, 8.0], np.float32)])
    np.testing.assert_array_equal(family.merge(config, a, b).min_val, (a.min_val + b.min_val) / 2)
    np.testing.assert_array_equal(family.merge(config, a, b).max_val, (a.max_val + b.max_val) / 2)
    fresh = family.init(config)
    _equal(family.merge(config, fresh, a), a)


@pytest.mark.parametrize("averaging_constant", [None, 0.25])
@pytest.mark.parametrize("per_channel", [False, True])
def test_updates_and_qparams_equal_torch_ao(averaging_constant, per_channel):
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((4, 3)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32) for _ in range(5)]
    if per_channel:
        cls = tao.PerChannelMinMaxObserver if averaging_constant is None else tao.MovingAveragePerChannelMinMaxObserver
        config = PER_CHANNEL if averaging_constant is None else family.Config(PER_CHANNEL.spec, averaging_constant, 1)
        theirs = cls(ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                     **({} if averaging_constant is None else {"averaging_constant": averaging_constant}))  # fmt: skip
    else:
        cls = tao.MinMaxObserver if averaging_constant is None else tao.MovingAverageMinMaxObserver
        config = PER_TENSOR if averaging_constant is None else family.Config(PER_TENSOR.spec, averaging_constant)
        theirs = cls(**({} if averaging_constant is None else {"averaging_constant": averaging_constant}))
    for x in batches:
        theirs(torch.from_numpy(x))
    ours = _run(config, batches)
    np.testing.assert_array_equal(ours.min_val, theirs.min_val.numpy())
    np.testing.assert_array_equal(ours.max_val, theirs.max_val.numpy())
    scale, zero_point = family.qparams(config, ours)
    their_scale, their_zero_point = theirs.calculate_qparams()
    np.testing.assert_array_equal(np.asarray(scale), their_scale.numpy())
    np.testing.assert_array_equal(np.asarray(zero_point), their_zero_point.numpy())


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="ch_axis=None does not fit qscheme='per_channel_symmetric'"):
        family.Config(oc.quant_spec("qint8", "per_channel_symmetric"))
    with pytest.raises(ValueError, match="averaging_constant"):
        family.Config(averaging_constant=1.5)
    with pytest.raises(TypeError, match="spec must be a QuantSpec"):
        family.Config(spec="quint8")
    with pytest.raises(ValueError, match="num_channels=None does not fit ch_axis=1"):
        family.init(PER_CHANNEL)
    assert hash(PER_CHANNEL) == hash(family.Config(oc.quant_spec("qint8", "per_channel_symmetric"), ch_axis=1))
