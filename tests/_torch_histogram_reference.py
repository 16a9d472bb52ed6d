"""torch 2.13's ``HistogramObserver`` as the oracle for the histogram core tests.

Everything here calls torch's own methods; nothing re-implements them. The only liberty is
:func:`torch_search` (``fast=True``): it runs torch's ``_non_linear_param_search`` unchanged, but the
running sums it walks over (``torch.cumsum(self.histogram)``, the same values) are handed to it as a
numpy array. torch's loop does up to ~1e5 scalar comparisons ``cSum[l] < next_alpha * total``; on a
tensor each costs ~10 us, on a numpy float32 ~0.1 us. NumPy 2 compares ``np.float32 < python float``
by casting the Python float to float32 (NEP 50), exactly as torch compares a float32 tensor with a
Python float, so the walk is the same; ``test_fast_oracle_is_torch`` checks it against the untouched
method.
"""

from __future__ import annotations

import contextlib
import warnings
from unittest import mock

import numpy as np
import torch
from torch.ao.quantization.observer import HistogramObserver

__all__ = [
    "make_observer",
    "torch_combine",
    "torch_error",
    "torch_qparams",
    "torch_search",
]


def make_observer(hist, min_val, max_val, *, dtype=torch.quint8, qscheme=torch.per_tensor_affine, **kwargs):
    """A torch HistogramObserver holding the given state (float32 buffers)."""
    hist = np.asarray(hist, dtype=np.float32)
    obs = HistogramObserver(bins=hist.shape[0], dtype=dtype, qscheme=qscheme, **kwargs)
    obs.histogram = torch.tensor(hist)
    obs.min_val = torch.tensor(np.float32(min_val))
    obs.max_val = torch.tensor(np.float32(max_val))
    return obs


@contextlib.contextmanager
def _numpy_running_sums():
    real = torch.cumsum

    def cumsum(t, dim):
        return real(t, dim=dim).numpy()

    with mock.patch.object(torch, "cumsum", cumsum):
        yield


def torch_search(hist, min_val, max_val, *, dst_nbins=256, fast=True) -> tuple[float, float]:
    """``(new_min, new_max)`` of torch's ``_non_linear_param_search`` on this histogram."""
    obs = make_observer(hist, min_val, max_val)
    obs.dst_nbins = dst_nbins
    with _numpy_running_sums() if fast else contextlib.nullcontext():
        lo, hi = obs._non_linear_param_search()
    return float(lo), float(hi)


def torch_qparams(obs: HistogramObserver):
    """``obs.calculate_qparams()`` (with the fast running sums), as numpy arrays."""
    with _numpy_running_sums(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scale, zero_point = obs.calculate_qparams()
    return scale.numpy(), zero_point.numpy()


def torch_error(hist, min_val, max_val, start_bin: int, end_bin: int, *, dst_nbins=256) -> float:
    """torch's ``_compute_quantization_error(start_bin, end_bin)`` (the L2 error of that clip range)."""
    obs = make_observer(hist, min_val, max_val)
    obs.dst_nbins = dst_nbins
    return float(obs._compute_quantization_error(start_bin, end_bin))


def torch_combine(hist, min_val, max_val, new_min, new_max, *, upsample_rate=16) -> np.ndarray:
    """torch's ``_combine_histograms`` of a state onto ``[new_min, new_max]`` with nothing added."""
    obs = make_observer(hist, min_val, max_val)
    obs.upsample_rate = upsample_rate
    f = lambda v: torch.tensor(np.float32(v))  # noqa: E731
    out = obs._combine_histograms(
        obs.histogram, f(min_val), f(max_val), torch.zeros_like(obs.histogram), f(new_min), f(new_max)
    )
    return out.numpy()
