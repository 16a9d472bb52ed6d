"""Invariants of the core, checked with hypothesis on numpy (the backends agree bit for bit elsewhere)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import observers_core as oc

BOUND = float(np.float32(1e30))
finite32 = st.floats(min_value=-BOUND, max_value=BOUND, allow_nan=False, width=32)
batches = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6), elements=finite32)
dtypes = st.sampled_from(["qint8", "quint8", "int16", "uint16", "quint4x2", "qint32"])
per_tensor_schemes = st.sampled_from(["per_tensor_affine", "per_tensor_symmetric"])


@settings(max_examples=200, deadline=None)
@given(lo=finite32, width=st.floats(0, BOUND, width=32), dtype=dtypes, qscheme=per_tensor_schemes)
def test_zero_is_exactly_representable_and_scale_at_least_eps(lo, width, dtype, qscheme):
    hi = np.float32(lo) + np.float32(width)
    spec = oc.quant_spec(dtype, qscheme)
    scale, zp = oc.calculate_qparams(np.asarray(lo, np.float32), np.asarray(hi, np.float32), spec)
    assert scale.dtype == np.float32 and scale.shape == (1,)
    assert scale[0] >= np.float32(spec.eps)
    assert spec.quant_min <= zp[0] <= spec.quant_max
    zero = oc.fake_quantize(np.zeros(3, np.float32), scale, zp, quant_min=spec.quant_min, quant_max=spec.quant_max)
    assert (zero == 0).all()


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(batches, min_size=1, max_size=4))
def test_merge_of_states_equals_state_of_concatenation(parts):
    states = [oc.minmax_update(oc.minmax_init(xp=np), p) for p in parts]
    merged = oc.minmax_init(xp=np)
    for s in reversed(states):  # any order
        merged = oc.minmax_merge(s, merged)
    whole = oc.minmax_update(oc.minmax_init(xp=np), np.concatenate([p.ravel() for p in parts]))
    assert merged.min_val == whole.min_val and merged.max_val == whole.max_val
    for qscheme in ("per_tensor_affine", "per_tensor_symmetric"):
        spec = oc.quant_spec("qint8", qscheme)
        for got, want in zip(oc.minmax_qparams(merged, spec), oc.minmax_qparams(whole, spec)):
            np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(x=batches)
def test_observed_range_covers_the_data_after_fake_quant(x):
    """Values inside the observed range round-trip with an error of at most half a step."""
    spec = oc.quant_spec("quint8", "per_tensor_affine")
    state = oc.minmax_update(oc.minmax_init(xp=np), x)
    scale, zp = oc.minmax_qparams(state, spec)
    xq = oc.fake_quantize(x, scale, zp, quant_min=spec.quant_min, quant_max=spec.quant_max)
    err = np.abs(xq.astype(np.float64) - x.astype(np.float64))
    assert (err <= 0.5 * float(scale[0]) * (1 + 1e-5) + 1e-30).all() or not np.isfinite(scale).all()
