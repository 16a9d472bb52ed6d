"""moving_average_merge near float32's maximum (issue 11, item 10): ``(u + v) / 2`` overflowed to inf for
finite states; the mean is now overflow-free and unchanged wherever the sum did not overflow."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import observers_core as oc

from conftest import to_numpy

_f32 = st.floats(-3.4028234663852886e38, 3.4028234663852886e38, width=32, allow_subnormal=False)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.tuples(_f32, _f32, _f32, _f32), min_size=1, max_size=8))
def test_merge_is_the_correctly_rounded_mean(backend, values):
    v = np.asarray(values, dtype=np.float32)
    lo_a, hi_a = np.minimum(v[:, 0], v[:, 1]), np.maximum(v[:, 0], v[:, 1])
    lo_b, hi_b = np.minimum(v[:, 2], v[:, 3]), np.maximum(v[:, 2], v[:, 3])
    a = oc.MinMaxState(backend.asarray(lo_a), backend.asarray(hi_a))
    b = oc.MinMaxState(backend.asarray(lo_b), backend.asarray(hi_b))
    merged = oc.moving_average_merge(a, b)
    for got, u, w in ((merged.min_val, lo_a, lo_b), (merged.max_val, hi_a, hi_b)):
        exact = (u.astype(np.float64) + w.astype(np.float64)) / 2  # float64 holds the exact mean of two float32
        np.testing.assert_array_equal(to_numpy(got), exact.astype(np.float32))


def test_merge_at_the_limit():
    big = np.float32(3.0e38)
    a = oc.MinMaxState(np.asarray(-big), np.asarray(big))
    merged = oc.moving_average_merge(a, a)
    assert merged.min_val == -big and merged.max_val == big
