"""The low-bit family module (observers_core.families.lowbit): merge of shards is the single pass.

Batches of one shape split over shards (processes, devices), each observed separately and merged, give
the statistics (and so the qparams) of one observer that saw every batch, bit for bit, on every backend;
per tensor also those of the concatenated data; merge is associative and commutative. Formats:
per-group int4, per-channel int8, per-tensor fp8, MX and BFP16 blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import observers_core as oc
from observers_core.families import lowbit as family

from conftest import to_numpy

SPECS = {
    "int4_group": oc.lowbit_spec("int4", granularity="per_group", axis=-1, group_size=8),
    "int8_channel": oc.lowbit_spec("int8", granularity="per_channel", axis=0, symmetric=True),
    "fp8_tensor": oc.lowbit_spec("float8_e4m3fn"),
    "mxfp4": oc.lowbit_spec("mxfp4", axis=-1, group_size=32),
    "bfp16": oc.lowbit_spec("bfp16", axis=-1, group_size=8),
}

# numpy draws once per example; the backend's arrays are made from them
_shards = st.lists(  # each shard: a list of batches
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 1e-3, 1.0, 1e30, 3e38]),  # magnitude (0: zeros-only, a dead batch)
            st.booleans(),  # one NaN in the batch
        ),
        min_size=1,
        max_size=2,
    ),
    min_size=2,
    max_size=4,
)


def _make(magnitude: float, nan: bool, rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal((4, 64)) * magnitude).astype(np.float32)
    x = np.clip(x, -3.4e38, 3.4e38)
    if nan:
        x[0, rng.integers(64)] = np.nan
    return x


def _observe(config, asarray, shards):
    state = None
    for shard in shards:
        state = family.update(config, state, asarray(shard))
    return state


def _same(a, b):
    for u, v in zip(a, b):
        np.testing.assert_array_equal(to_numpy(u), to_numpy(v))


@pytest.mark.slow_on("jax")  # a hypothesis campaign, compiled under jit per shape
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("ignore_nonfinite", [False, True])
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=_shards, seed=st.integers(0, 2**16))
def test_merge_of_shards_is_the_single_pass(backend, name, ignore_nonfinite, shards, seed):
    rng = np.random.default_rng(seed)
    data = [[_make(*batch, rng) for batch in shard] for shard in shards]
    config = family.Config(SPECS[name], ignore_nonfinite=ignore_nonfinite)
    whole = _observe(config, backend.asarray, [b for shard in data for b in shard])  # one observer, every batch
    per_shard = [_observe(config, backend.asarray, shard) for shard in data]
    merged = per_shard[0]
    for s in per_shard[1:]:
        merged = family.merge(config, merged, s)
    if SPECS[name].granularity == "per_tensor":  # also the statistics of all the data at once
        _same(whole, family.update(config, None, backend.asarray(np.concatenate([b for sh in data for b in sh]))))
    _same(merged, whole)
    _same(family.qparams(config, merged), family.qparams(config, whole))
    if len(per_shard) >= 3:  # associative and commutative
        a, b, c = per_shard[:3]
        _same(family.merge(config, family.merge(config, a, b), c), family.merge(config, a, family.merge(config, b, c)))
        _same(family.merge(config, a, b), family.merge(config, b, a))


def test_dynamic_mode_keeps_the_last_batch_and_static_accumulates():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((4, 64)).astype(np.float32) * 3
    spec = SPECS["int4_group"]
    dynamic, static = family.Config(spec, is_dynamic=True), family.Config(spec)
    _same(family.update(dynamic, family.update(dynamic, None, a), b), family.update(dynamic, None, b))
    sa, sb = family.update(static, None, a), family.update(static, None, b)
    expected = (np.minimum(sa.min_val, sb.min_val), np.maximum(sa.max_val, sb.max_val))  # per group, over batches
    _same(family.update(static, sa, b), expected)


def test_config_is_hashable_and_validated():
    config = family.Config(SPECS["mxfp4"])
    assert hash(config) == hash(family.Config(SPECS["mxfp4"]))
    with pytest.raises(TypeError, match="spec"):
        family.Config("mxfp4")
    with pytest.raises(TypeError, match="is_dynamic"):
        family.Config(SPECS["mxfp4"], is_dynamic=1)


def test_init_gives_the_defaults_and_a_shape_mismatch_is_refused():
    config = family.Config(SPECS["int8_channel"])
    empty = family.init(config)
    scale, zero_point = family.qparams(config, empty)
    assert to_numpy(scale).tolist() == [1.0] and to_numpy(zero_point).tolist() == [0]  # torch's defaults
    state = family.update(config, None, np.ones((2, 64), dtype=np.float32))
    with pytest.raises(ValueError, match="statistics of shape"):
        family.update(config, state, np.ones((3, 64), dtype=np.float32))  # 3 channels, not 2


def test_fake_quantize_equals_the_core():
    config = family.Config(SPECS["int4_group"])
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    state = family.update(config, None, x)
    expected = oc.lowbit_fake_quantize(x, oc.lowbit_qparams(state, config.spec), config.spec)
    np.testing.assert_array_equal(family.fake_quantize(config, state, x), expected)
