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

import numpy as np

from .._dtypes import QScheme, QuantSpec, check_granularity
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
from .._validate import UnsupportedConfigError, check_bool

__all__ = [
    "STATE_KEYS", "Config", "State", "check_dtype", "check_loaded_state", "check_observer_args", "init", "merge",
    "qparams", "update", "update_counting",
]

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


def check_observer_args(owner: str, qscheme: QScheme, *, bins: Any, upsample_rate: Any, is_dynamic: Any
                        ) -> tuple[int, int]:
    """``HistogramObserver``'s arguments that :func:`~observers_core.quant_spec` does not hold, in torch's
    order (every framework's class checks these): ``bins``, ``upsample_rate``, a per-tensor ``qscheme``, no
    dynamic quantization (the last two ``UnsupportedConfigError``: torch raises ``NotImplementedError``).
    Returns ``(bins, upsample_rate)``; the dtype is checked with the spec (:func:`check_dtype`)."""
    bins, upsample_rate = check_bins(bins), check_upsample_rate(upsample_rate)
    check_granularity(qscheme, owner, per_channel=False)
    if check_bool(is_dynamic, "is_dynamic"):
        raise UnsupportedConfigError(f"is_dynamic=True is not supported by {owner} (no dynamic quantization)")
    return bins, upsample_rate


def check_dtype(dtype: str, owner: str) -> int:
    """``dst_nbins = 2**bits`` of a quantized dtype name (torch: ``2 ** torch.iinfo(dtype).bits``);
    ``ValueError`` naming ``dtype`` for formats the histogram search does not handle (floats)."""
    if dtype not in DST_BITS:
        raise ValueError(f"dtype={dtype!r} is not supported by {owner}; allowed: {', '.join(DST_BITS)}")
    return 2 ** DST_BITS[dtype]


def check_loaded_state(
    histogram: np.ndarray, min_val: np.ndarray, max_val: np.ndarray, bins: int, owner: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated state_dict entries as float32 numpy arrays ``(histogram, min_val, max_val)``.

    ``min_val``/``max_val`` of shape ``(0,)`` (torch's uninitialised buffers before version 3) become
    ``+inf``/``-inf``. Checked: ``histogram`` of shape ``(bins,)`` with finite non-negative counts;
    ``min_val``/``max_val`` 0-d and either never updated (``+inf``, ``-inf``), NaN (an observer that saw
    NaN) or finite with ``min_val <= max_val``."""
    if histogram.shape != (bins,):
        raise ValueError(f"state_dict['histogram'] must have shape ({bins},) for {owner} with bins={bins}, "
                         f"got {histogram.shape}")  # fmt: skip
    hist = histogram.astype(np.float32)
    if not (np.all(np.isfinite(hist)) and np.all(hist >= 0)):
        raise ValueError("state_dict['histogram'] must hold finite, non-negative counts")
    bounds = []
    for name, value, fill in (("min_val", min_val, np.inf), ("max_val", max_val, -np.inf)):
        if value.shape == (0,):
            value = np.asarray(fill)
        if value.shape != ():
            raise ValueError(f"state_dict[{name!r}] must be 0-d (or (0,): never updated), got shape {value.shape}")
        bounds.append(value.astype(np.float32))
    lo, hi = bounds
    never = lo == np.inf and hi == -np.inf
    poisoned = np.isnan(lo) and np.isnan(hi)
    if not (never or poisoned or (np.isfinite(lo) and np.isfinite(hi) and lo <= hi)):
        raise ValueError(f"state_dict has min_val={float(lo)} and max_val={float(hi)}; allowed: finite with "
                         "min_val <= max_val, both NaN, or inf and -inf (never updated)")  # fmt: skip
    return hist, lo, hi


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
