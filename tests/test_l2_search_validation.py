"""Issue 11 item 13 (L2 part): the L2 search rejects invalid histograms eagerly, on every CPU backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import observers_core as oc
from observers_core._l2_search import check_histogram, histogram_qparams, non_linear_param_search
from observers_core._histogram import HistogramState

BACKENDS = ["numpy"]
try:
    import torch

    BACKENDS.append("torch")
except ImportError:  # pragma: no cover
    pass
try:
    import jax
    import jax.numpy as jnp

    BACKENDS.append("jax")
except ImportError:  # pragma: no cover
    jax = None


def _f(a) -> float:
    return float(np.asarray(a).reshape(-1)[0])


def _as(backend, a):
    a = np.asarray(a, dtype=np.float32)
    if backend == "torch":
        return torch.from_numpy(a.copy())
    if backend == "jax":
        return jnp.asarray(a)
    return a


BAD = [
    ("negative count", [1, -1, 2, 0], 0.0, 1.0, "counts"),
    ("NaN count", [1, np.nan, 2, 0], 0.0, 1.0, "counts"),
    ("infinite count", [1, np.inf, 2, 0], 0.0, 1.0, "counts"),
    ("decreasing range", [1, 1, 2, 0], 2.0, 1.0, "decrease"),
    ("infinite max", [1, 1, 2, 0], 0.0, np.inf, "finite"),
    ("infinite min", [1, 1, 2, 0], -np.inf, 1.0, "finite"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case,hist,lo,hi,match", BAD, ids=[b[0] for b in BAD])
def test_search_rejects_invalid_histograms(backend, case, hist, lo, hi, match):
    args = (_as(backend, hist), _as(backend, lo), _as(backend, hi))
    with pytest.raises(ValueError, match=match):
        non_linear_param_search(*args, dst_nbins=256)
    with pytest.raises(ValueError, match=match):
        histogram_qparams(HistogramState(*args), oc.quant_spec("quint8"))


@pytest.mark.slow_on("jax")  # a minute of jit compiling
@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_special_states_still_pass(backend):
    """An empty state gives the defaults, a NaN-poisoned one NaN (documented), a single value works."""
    spec = oc.quant_spec("quint8")
    empty = HistogramState(_as(backend, np.zeros(4)), _as(backend, np.inf), _as(backend, -np.inf))
    scale, _ = histogram_qparams(empty, spec)
    assert _f(scale) == 1.0
    nan = HistogramState(_as(backend, [1, 0, 0, 1]), _as(backend, np.nan), _as(backend, np.nan))
    assert np.isnan(_f(histogram_qparams(nan, spec)[0]))
    point = HistogramState(_as(backend, [0, 0, 0, 3]), _as(backend, 2.0), _as(backend, 2.0))
    assert np.isfinite(_f(histogram_qparams(point, spec)[0]))


@settings(max_examples=50, deadline=None)
@given(hist=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=16),
       lo=st.floats(width=32), hi=st.floats(width=32))
def test_check_histogram_accepts_exactly_the_valid_ones(hist, lo, hi):
    h = np.asarray(hist, np.float32)
    valid_counts = bool(np.all(np.isfinite(h) & (h >= 0)))
    valid_range = not (np.isinf(lo) or np.isinf(hi)) and not (lo > hi)
    try:
        check_histogram(h, np.float32(lo), np.float32(hi))
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == (valid_counts and valid_range)


@pytest.mark.skipif(jax is None, reason="jax is not installed")
def test_no_check_under_jit():
    """Under jax.jit nothing is read on the host: an invalid histogram traces and runs without error."""
    spec = oc.quant_spec("quint8")
    f = jax.jit(lambda h, lo, hi: histogram_qparams(HistogramState(h, lo, hi), spec))
    scale, _ = f(jnp.asarray([1.0, -1.0, 2.0, 0.0]), jnp.float32(0.0), jnp.float32(1.0))
    assert np.asarray(scale).size == 1
