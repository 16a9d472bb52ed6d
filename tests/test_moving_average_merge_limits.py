"""moving_average_merge near float32's maximum (issue 11, item 10): ``(u + v) / 2`` overflowed to inf for
finite states; the mean is now overflow-free and unchanged wherever the sum did not overflow."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
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


@pytest.mark.parametrize("case", ["overflow", "cancellation"])
def test_moving_average_overflow_is_torchs_and_its_qparams_differ_by_framework(case):
    """A moving average whose step leaves ``min_val > max_val``, as in torch.ao (the min/max family keeps
    torch's formula bit for bit): a step ``min(X) - x_min`` that overflows float32 (a finite ``min_val``
    beside ``max_val = -inf``), or one that cancels (``averaging_constant=1``: ``1e30 + (0.125 - 1e30)``
    is 0, below ``min_val = 0.125``). ``calculate_qparams`` of that state: torch.ao raises
    ``AssertionError``, our torch observer ``ValueError``; the array observers (numpy, JAX, CuPy) return
    scale 1 and zero point 0 for it, the core's fallback for ``min > max``, since checking would read the
    device (docs/torch.md, "Differences from torch.ao")."""
    torch = pytest.importorskip("torch")
    from torch.ao.quantization import observer as tao

    from observers_core.adapters import _array_observers as array_obs
    from observers_core.adapters import torch as tobs

    if case == "overflow":
        c, batches = 0.01, [np.array([1.7e38, -1.7e38], dtype=np.float32), np.array([-2.43e38, -2.5e38], dtype=np.float32)]
    else:
        c, batches = 1.0, [np.array([-1.0, 1e30], dtype=np.float32), np.array([0.125], dtype=np.float32)]
    theirs, ours, on_numpy = (tao.MovingAverageMinMaxObserver(averaging_constant=c),
                              tobs.MovingAverageMinMaxObserver(averaging_constant=c),
                              array_obs.MovingAverageMinMaxObserver(averaging_constant=c))
    for x in batches:
        theirs(torch.from_numpy(x))
        ours(torch.from_numpy(x))
        on_numpy(x)
    for obs in (theirs, ours):
        assert obs.min_val > obs.max_val
    assert on_numpy.state.min_val > on_numpy.state.max_val
    if case == "overflow":
        assert torch.isfinite(ours.min_val) and ours.max_val == -float("inf")
    for name in ("min_val", "max_val"):
        assert float(getattr(ours, name)) == float(getattr(theirs, name)) == float(getattr(on_numpy.state, name))
    with pytest.raises(AssertionError):
        theirs.calculate_qparams()
    with pytest.raises(ValueError, match="must be less than or equal to max_val"):
        ours.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale, zero_point = on_numpy.calculate_qparams()
    assert float(scale[0]) == 1.0 and int(zero_point[0]) == 0
