"""The torch-histogram family (``HistogramObserver``): a running histogram and torch's L2 range search.

Thin over :mod:`observers_core._histogram` (binning, update, merge) and :mod:`observers_core._l2_search`
(the search and the qparams); see those for the float32 arithmetic, which is torch 2.13's.

- ``update``: ``min_val = min(min_val, min(x))``, ``max_val = max(max_val, max(x))``; ``x`` is binned on the
  new range and added to the old histogram moved onto it (re-binned through ``upsample_rate`` sub-bins
  per bin), exactly torch's ``HistogramObserver.forward`` (bit for bit while ``(max_val - min_val) * bins``
  is finite in float32; beyond, torch.histc is undefined and ours keeps every value).
- ``merge(a, b)``: torch's ``_combine_histograms`` generalised to two ranges: each histogram moved onto
  ``[min(a.min, b.min), max(a.max, b.max)]`` (unchanged when its range already is that one; torch's
  upscale otherwise), then added. Exact (equal to one pass over both shards' data) when both shards
  have the same range. In general re-binning is lossy; the bound: the total count is preserved exactly
  (``upsample_rate`` a power of two, counts below ``2**24 / upsample_rate``), and at every edge ``e`` of
  the merged grid, ``|#merged below e - #single pass below e|`` is at most the shards' counts in their
  bins that lie within one merged-bin width of ``e`` (a value moves only within its shard bin's span).
- ``qparams``: torch's ``calculate_qparams`` (the L2 search, then the affine/symmetric formulas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._dtypes import QuantSpec
from .._histogram import (
    DST_BITS,
    HistogramState,
    check_bins,
    check_upsample_rate,
    histogram_init,
    histogram_merge,
    histogram_update,
    histogram_update_counting,
)
from .._l2_search import histogram_qparams
from .._qparams import QParams
from .._validate import check_bool

__all__ = ["STATE_KEYS", "Config", "State", "init", "merge", "qparams", "update", "update_counting"]

State = HistogramState
#: torch's state_dict keys of the state (torch's buffers also hold ``eps``, which is ``config.spec.eps``).
STATE_KEYS = ("histogram", "min_val", "max_val")


@dataclass(frozen=True)
class Config:
    """``bins`` (1..2**24), ``upsample_rate`` (1..65536), ``spec`` (per-tensor, an integer dtype),
    ``ignore_nonfinite`` (skip NaN; +/-inf are always skipped)."""

    bins: int = 2048
    upsample_rate: int = 16
    spec: QuantSpec = QuantSpec()
    ignore_nonfinite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "bins", check_bins(self.bins))
        object.__setattr__(self, "upsample_rate", check_upsample_rate(self.upsample_rate))
        object.__setattr__(self, "ignore_nonfinite", check_bool(self.ignore_nonfinite, "ignore_nonfinite"))
        if not isinstance(self.spec, QuantSpec):
            raise TypeError(f"spec must be a QuantSpec, got {type(self.spec).__name__}")
        if not self.spec.qscheme.is_per_tensor:
            raise ValueError(f"spec.qscheme={self.spec.qscheme.value} is not supported; allowed: "
                             "per_tensor_affine, per_tensor_symmetric")  # fmt: skip
        if self.spec.dtype not in DST_BITS:
            raise ValueError(f"spec.dtype={self.spec.dtype} is not supported; allowed: {', '.join(DST_BITS)}")


def init(config: Config, /, *, num_channels: int | None = None, device: Any = None, xp: Any = None) -> State:
    """Zero counts, ``min_val = +inf``, ``max_val = -inf`` (per-tensor only: ``num_channels`` is None)."""
    if num_channels is not None:
        raise ValueError(f"num_channels must be None for the histogram family, got {num_channels!r}")
    if xp is None:
        import array_api_compat.numpy as xp
    return histogram_init(bins=config.bins, xp=xp, device=device)


def update(config: Config, state: State, x: Any, /, *, collective: Any = None) -> State:
    """``histogram_update(state, x)``: torch's ``HistogramObserver.forward`` (with a
    :class:`~observers_core.Collective`: on every member's ``x``, range first, then summed counts)."""
    return histogram_update(state, x, upsample_rate=config.upsample_rate, ignore_nonfinite=config.ignore_nonfinite,
                            collective=collective)  # fmt: skip


def update_counting(config: Config, state: State, x: Any, /, *, collective: Any = None) -> tuple[State, Any]:
    """``(update(config, state, x), [number of +/-inf, number of NaN in x])`` (for torch's warnings)."""
    return histogram_update_counting(state, x, upsample_rate=config.upsample_rate,
                                     ignore_nonfinite=config.ignore_nonfinite, collective=collective)  # fmt: skip


def merge(config: Config, a: State, b: State, /) -> State:
    """Both histograms moved onto ``[min(a.min, b.min), max(a.max, b.max)]`` and added (module docstring:
    exact on a shared range, bound otherwise)."""
    return histogram_merge(a, b, upsample_rate=config.upsample_rate)


def qparams(config: Config, state: State, /) -> QParams:
    """torch's ``calculate_qparams``: the L2 search's range, then ``calculate_qparams(new_min, new_max)``."""
    return histogram_qparams(state, config.spec)
