"""Calibration observers (Horizon ``observer_v2``: KL, MSE, percentile, mix) over one array namespace.

Used directly (``xp=numpy`` by default, or ``array_api_strict``) they are plain NumPy observers;
``observers_core.adapters.jax`` and ``.cupy`` add only ``jax.jit`` and device handling, and
``observers_core.adapters.torch`` reuses the functions of this module (:func:`make_config`,
:func:`batch_update`, :func:`kl_init`, :func:`kl_accumulate`, :func:`kl_update`) behind ``nn.Module``
buffers.

Every method picks a clipping magnitude ``amax`` from a histogram of ``|x|``
(:class:`~observers_core.CalibHistogram`, ``bins`` bins on an exact power-of-two grid) with the core's
searches, then clips the observed (finite) range into ``[-amax, amax]``:
``lo = clip(min(X), -amax, amax)``, ``hi = clip(max(X), -amax, amax)``. That range is moving-averaged,
``x_min = x_min + c * (lo - x_min)`` (likewise ``x_max``, ``c = averaging_constant``; the first result
initialises), and the qparams are :func:`~observers_core.calculate_qparams` of ``(x_min, x_max)``.

- ``PercentileObserver``: ``amax`` = :func:`~observers_core.percentile_range` (symmetric) of each batch.
- ``MSEObserver``: ``amax`` = :func:`~observers_core.mse_threshold` of each batch (candidates every
  ``stride`` bins, quantizer ``calculate_qparams(0, amax)``).
- ``KLObserver``: the histogram (and the observed range) accumulate over every batch; every
  ``update_interval``-th batch ``amax`` = :func:`~observers_core.kl_threshold` of the accumulated
  histogram (``num_levels``: the levels ``|x|`` reaches), and the clipped accumulated range is averaged
  in. Before the first KL update ``calculate_qparams`` warns and returns ``scale=1, zero_point=0``.
- ``MixObserver``: per batch, the candidates ``minmax`` (no clipping), ``percentile``, ``kl`` and
  ``mse`` (that order breaks ties) are each turned into qparams and the one with the least measured
  error is kept: the error is the direct fake-quantization error of the batch itself,
  ``E_k = sum((fq_k(x) - x)**2) / n`` over the finite values (per channel), ``fq_k`` =
  :func:`~observers_core.fake_quantize` with ``calculate_qparams(lo_k, hi_k)``: exact for the data
  seen, with no binning error. The pick is kept in ``last_choice`` (indices into :data:`MIX_CANDIDATES`).

The searches model the quantization of ``|x|`` over ``[0, amax]`` (the levels ``z .. quant_max`` with
``z`` the zero point of ``calculate_qparams(0, amax)``): exact for the symmetric schemes (Horizon's
default, ``qint8`` + ``per_tensor_symmetric``) and for non-negative data under affine schemes; for
signed data under affine schemes they model half the levels' spacing optimistically.

Horizon conventions kept: ``ch_axis=-1`` means per tensor, ``ch_axis >= 0`` per channel (with a
``per_channel_*`` qscheme); ``dtype`` ``"qint8"`` and ``qscheme`` ``per_tensor_symmetric`` by default.
Differences, all deliberate:

- NaN and +/-Inf are always skipped (the histograms cannot count them); a batch (or channel) with no
  finite value leaves the statistics as they are. Empty inputs are no-ops (and no KL step).
- ``is_sync_quantize=True`` raises ``NotImplementedError``: nothing is synchronised across devices
  here. Combine replicas' statistics yourself (``observers_core.moving_average_merge`` on the
  min/max, ``calib_histogram_merge`` on KL histograms) before computing qparams.
- Histograms are not saved (as in Horizon): the state dict holds ``eps``, ``min_val`` and ``max_val``.
- ``bins`` must be at least the number of levels ``|x|`` reaches (128 for ``qint8`` symmetric);
  ``MSEObserver`` and ``MixObserver`` take ``bins`` (default 2048) as a keyword-only extension.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from observers_core._calibration import (
    CalibHistogram,
    mse_window,
    work_dtype,
    calib_histogram_edges,
    calib_histogram_init,
    calib_histogram_update,
    error_norm,
    kl_threshold,
    mse_threshold,
    percentile_range,
)
from observers_core._compiled import abs_max_kernel, fq_errors_kernel, host_view
from observers_core._dtypes import QScheme, QuantSpec, quant_spec
from observers_core._minmax import MinMaxState, aminmax, minmax_init, minmax_update, moving_average_update
from observers_core._namespace import device_of, size
from observers_core._qparams import QParams, calculate_qparams
from observers_core._quantize import fake_quantize

from observers_core._validate import check_averaging_constant, check_bool, check_int

from ._array_observers import UniformQuantizationObserverBase

__all__ = ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"]

Array = Any
INF = float("inf")

#: MixObserver's candidates, in the order that breaks ties (``last_choice`` indexes this tuple).
MIX_CANDIDATES = ("minmax", "percentile", "kl", "mse")


# ------------------------------------------------------------------------ shared by every adapter


@dataclasses.dataclass(frozen=True)
class CalibConfig:
    """A validated calibration configuration (hashable: a static ``jax.jit`` argument).

    ``method``: ``"kl"``, ``"mse"``, ``"percentile"`` or ``"mix"``; ``levels``: the quantized levels
    ``|x|`` reaches (the KL search's ``num_levels``)."""

    method: str
    spec: QuantSpec
    averaging_constant: float
    bins: int
    levels: int
    percentile: float = 99.99
    stride: int = 1
    update_interval: int = 1


def positive_levels(spec: QuantSpec) -> int:
    """Levels ``z .. quant_max`` that ``[0, amax]`` is quantized to (``z``: the zero point of
    ``calculate_qparams(0, amax)``): 128 for qint8 symmetric, 256 for quint8 affine."""
    low, high = mse_window(spec)
    return high - low + 1


def make_config(
    owner: str,
    method: str,
    *,
    dtype: Any,
    qscheme: Any,
    quant_min: int | None,
    quant_max: int | None,
    ch_axis: Any,
    averaging_constant: Any,
    bins: Any,
    percentile: Any = 99.99,
    stride: Any = 1,
    update_interval: Any = 1,
    is_sync_quantize: Any = False,
) -> tuple[CalibConfig, bool]:
    """Validate an observer's arguments: ``(config, per_channel)``. ``ValueError``/``TypeError`` name the
    argument; ``is_sync_quantize=True`` raises ``NotImplementedError``."""
    if isinstance(ch_axis, bool) or not isinstance(ch_axis, numbers.Integral):
        raise TypeError(f"ch_axis must be an int, got {type(ch_axis).__name__} {ch_axis!r}")
    if ch_axis < -1:
        raise ValueError(f"ch_axis={ch_axis} is not allowed; allowed: -1 (per tensor, Horizon's convention) or >= 0")
    per_channel = ch_axis >= 0
    spec = quant_spec(dtype, qscheme, quant_min=quant_min, quant_max=quant_max)
    if spec.qscheme.is_per_channel != per_channel:
        wanted = "a per_channel_* qscheme" if per_channel else "per_tensor_symmetric or per_tensor_affine"
        raise ValueError(
            f"ch_axis={ch_axis} observes {'per channel' if per_channel else 'per tensor'} and needs {wanted}, "
            f"got qscheme={spec.qscheme.value!r} ({owner})"
        )
    averaging_constant = check_averaging_constant(averaging_constant)
    if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real):
        raise TypeError(f"percentile must be a float in (0, 100], got {type(percentile).__name__} {percentile!r}")
    if not 0.0 < float(percentile) <= 100.0:
        raise ValueError(f"percentile={percentile!r} is out of range; allowed: 0 < percentile <= 100")
    levels = positive_levels(spec)
    bins = check_int(bins, "bins", minimum=2)
    if bins < levels:
        raise ValueError(
            f"bins={bins} is smaller than the {levels} quantized levels |x| reaches with dtype={spec.dtype!r}, "
            f"qscheme={spec.qscheme.value!r}, quant_min={spec.quant_min}, quant_max={spec.quant_max}; "
            f"allowed: bins >= {levels}"
        )
    stride = check_int(stride, "stride", minimum=1)
    update_interval = check_int(update_interval, "update_interval", minimum=1)
    if check_bool(is_sync_quantize, "is_sync_quantize"):
        raise NotImplementedError(
            "is_sync_quantize=True is not implemented: statistics are not synchronised across devices. "
            "Merge replicas' min/max with observers_core.moving_average_merge (and KL histograms with "
            "calib_histogram_merge) yourself"
        )
    config = CalibConfig(method, spec, float(averaging_constant), bins, levels, float(percentile), stride, update_interval)
    return config, per_channel


def describe(config: CalibConfig, ch_axis: int) -> str:
    """The ``repr`` of a configuration."""
    parts = [f"dtype={config.spec.dtype!r}", f"qscheme={config.spec.qscheme.value!r}", f"ch_axis={ch_axis}",
             f"averaging_constant={config.averaging_constant}", f"bins={config.bins}"]
    if config.method in ("percentile", "mix"):
        parts.append(f"percentile={config.percentile}")
    if config.method in ("mse", "mix"):
        parts.append(f"stride={config.stride}")
    if config.method == "kl":
        parts.append(f"update_interval={config.update_interval}")
    return ", ".join(parts)


def abs_histogram(x: Array, *, axis: int | None, bins: int, xp: Any) -> CalibHistogram:
    """A fresh :class:`~observers_core.CalibHistogram` of ``|x|`` (per channel along ``axis``)."""
    channels = None if axis is None else x.shape[axis]
    state = calib_histogram_init(bins=bins, num_channels=channels, device=device_of(x), xp=xp)
    return calib_histogram_update(state, x, axis=axis, absolute=True, xp=xp)


def search_amax(method: str, hist: CalibHistogram, config: CalibConfig, xp: Any) -> Array:
    """The clipping magnitude of ``method`` for the histogram of ``|x|`` (``+inf`` for ``"minmax"``)."""
    if method == "minmax":
        return xp.full(tuple(hist.max_val.shape), INF, dtype=hist.max_val.dtype, device=device_of(hist.max_val))
    edges = calib_histogram_edges(hist, xp=xp)  # the observer's own histogram: valid, no check (host read)
    if method == "kl":
        return kl_threshold(hist.counts, edges, num_levels=config.levels, check=False, xp=xp)
    if method == "mse":
        return mse_threshold(hist.counts, edges, spec=config.spec, stride=config.stride, check=False, xp=xp)
    if method == "percentile":
        return percentile_range(hist.counts, edges, percentile=config.percentile, check=False, xp=xp)[1]
    raise ValueError(f"unknown calibration method {method!r}")


def observed_range(x: Array, *, axis: int | None, xp: Any) -> tuple[Array, Array]:
    """The finite range of ``x`` as float32 (``(+inf, -inf)`` where nothing finite was seen)."""
    lo, hi = aminmax(x, axis=axis, ignore_nonfinite=True, xp=xp)
    return xp.astype(lo, xp.float32), xp.astype(hi, xp.float32)


def clip_range(lo: Array, hi: Array, amax: Array, xp: Any) -> tuple[Array, Array]:
    """``lo``, ``hi`` clipped into ``[-amax, amax]``; an unseen range (``lo > hi``) is kept as it is."""
    amax = xp.astype(amax, lo.dtype)
    seen = lo <= hi
    return (
        xp.where(seen, xp.minimum(xp.maximum(lo, -amax), amax), lo),
        xp.where(seen, xp.minimum(xp.maximum(hi, -amax), amax), hi),
    )


def average_range(state: MinMaxState, lo: Array, hi: Array, averaging_constant: float, xp: Any) -> MinMaxState:
    """The core's moving average of the range ``(lo, hi)`` (:func:`observers_core.moving_average_update`
    of the pairs ``[lo, hi]``, whose min and max they are): ``x_min = x_min + c * (lo - x_min)``, the
    first range initialises, an unseen one (``lo > hi``) changes nothing."""
    pairs = xp.stack([lo, hi], axis=-1)
    return moving_average_update(
        state, pairs, averaging_constant=averaging_constant, axis=None if lo.ndim == 0 else 0,
        ignore_nonfinite=True, xp=xp,
    )


def candidate_errors(x: Array, lo: Array, hi: Array, *, axis: int | None, spec: QuantSpec, xp: Any) -> Array:
    """Mean squared fake-quantization error of ``x`` for each candidate range ``(lo[..., k], hi[..., k])``:
    ``E_k = sum((fq_k(x) - x)**2) / n`` over the finite values (per channel), divided by the squared
    power of two at or above the channel's largest magnitude (:func:`~observers_core._calibration.error_norm`:
    huge ranges neither overflow nor vanish under XLA's flush to zero; the ranking is unchanged), with
    ``fq_k`` = :func:`~observers_core.fake_quantize` by ``calculate_qparams(lo_k, hi_k, spec)``.
    float64 where the namespace has it. Shape of ``lo``."""
    host = host_view(x, xp)
    if host is not None and host.dtype in (np.float32, np.float64):
        return _host_candidate_errors(host, lo, hi, axis=axis, spec=spec, xp=xp)
    rows = xp.reshape(x, (1, -1)) if axis is None else xp.reshape(xp.moveaxis(x, axis, 0), (x.shape[axis], -1))
    dtype = work_dtype(xp, device_of(x))
    rows = xp.astype(rows, dtype)
    finite = xp.isfinite(rows)
    rows = xp.where(finite, rows, 0.0)
    count = xp.sum(xp.astype(finite, dtype), axis=-1)
    norm = error_norm(rows, xp)
    lo2, hi2 = xp.reshape(lo, (rows.shape[0], -1)), xp.reshape(hi, (rows.shape[0], -1))
    scale, zero_point = calculate_qparams(lo2, hi2, spec, xp=xp)
    errors = []
    for k in range(lo2.shape[-1]):  # a static loop over the (few) candidates: one (C, N) temporary each
        fq = fake_quantize(rows, scale[:, k:k + 1], zero_point[:, k:k + 1],
                           quant_min=spec.quant_min, quant_max=spec.quant_max, xp=xp)
        d = xp.where(finite, (fq - rows) / norm[:, None], 0.0)
        errors.append(xp.sum(d * d, axis=-1) / xp.where(count > 0, count, 1.0))
    return xp.reshape(xp.stack(errors, axis=-1), tuple(lo.shape))


def _host_candidate_errors(host: np.ndarray, lo: Array, hi: Array, *, axis: int | None, spec: QuantSpec, xp: Any
                           ) -> Array:
    """:func:`candidate_errors` for host memory through the compiled kernels: one pass for the norm, one
    for every candidate's error (no (C, N) float64 temporaries). The element values are the array
    code's; only the order of the float64 sums differs."""
    rows = host.reshape(1, -1) if axis is None else np.moveaxis(host, axis, 0).reshape(host.shape[axis], -1)
    norm = error_norm(xp.asarray(abs_max_kernel(rows))[:, None], xp)
    lo2, hi2 = xp.reshape(lo, (rows.shape[0], -1)), xp.reshape(hi, (rows.shape[0], -1))
    scale, zero_point = calculate_qparams(lo2, hi2, spec, xp=xp)
    scale = np.asarray(host_view(scale, xp), dtype=np.float64)
    errors = fq_errors_kernel(
        rows, 1 / scale, scale, np.asarray(host_view(zero_point, xp), dtype=np.float64),
        np.asarray(host_view(norm, xp), dtype=np.float64), float(spec.quant_min), float(spec.quant_max),
    )
    return xp.reshape(xp.asarray(errors), tuple(lo.shape))


def mix_range(x: Array, hist: CalibHistogram, lo: Array, hi: Array, *, axis: int | None, config: CalibConfig,
              xp: Any) -> tuple[Array, Array, Array]:
    """MixObserver's batch result: every candidate of :data:`MIX_CANDIDATES` clips ``(lo, hi)``; the one
    of least :func:`candidate_errors` wins (the first among equals). ``(lo, hi, choice)``."""
    ranges = [clip_range(lo, hi, search_amax(m, hist, config, xp), xp) for m in MIX_CANDIDATES]
    lo_k = xp.stack([r[0] for r in ranges], axis=-1)
    hi_k = xp.stack([r[1] for r in ranges], axis=-1)
    choice = xp.argmin(candidate_errors(x, lo_k, hi_k, axis=axis, spec=config.spec, xp=xp), axis=-1)
    picked = xp.arange(len(MIX_CANDIDATES), device=device_of(lo)) == choice[..., None]
    return xp.min(xp.where(picked, lo_k, INF), axis=-1), xp.max(xp.where(picked, hi_k, -INF), axis=-1), choice


def batch_update(state: MinMaxState, x: Array, /, *, axis: int | None, config: CalibConfig, xp: Any
                 ) -> tuple[MinMaxState, Array | None]:
    """One batch of a per-batch method (percentile, MSE, mix): its clipped range averaged into ``state``;
    also MixObserver's choice (``None`` otherwise). ``x`` must not be empty."""
    hist = abs_histogram(x, axis=axis, bins=config.bins, xp=xp)
    lo, hi = observed_range(x, axis=axis, xp=xp)
    choice = None
    if config.method == "mix":
        lo, hi, choice = mix_range(x, hist, lo, hi, axis=axis, config=config, xp=xp)
    else:
        lo, hi = clip_range(lo, hi, search_amax(config.method, hist, config, xp), xp)
    return average_range(state, lo, hi, config.averaging_constant, xp), choice


class KLAccumulator(NamedTuple):
    """What KLObserver accumulates between KL updates: the histogram of ``|x|`` and the finite range."""

    hist: CalibHistogram
    seen: MinMaxState


def kl_init(num_channels: int | None, *, bins: int, device: Any, xp: Any) -> KLAccumulator:
    """An empty accumulator (per tensor, or of ``num_channels`` channels)."""
    return KLAccumulator(
        calib_histogram_init(bins=bins, num_channels=num_channels, device=device, xp=xp),
        minmax_init(num_channels=num_channels, device=device, xp=xp),
    )


def kl_accumulate(acc: KLAccumulator, x: Array, /, *, axis: int | None, xp: Any) -> KLAccumulator:
    """``x`` counted into the histogram of ``|x|`` and the running finite range."""
    return KLAccumulator(
        calib_histogram_update(acc.hist, x, axis=axis, absolute=True, xp=xp),
        minmax_update(acc.seen, x, axis=axis, ignore_nonfinite=True, xp=xp),
    )


def kl_update(state: MinMaxState, acc: KLAccumulator, /, *, config: CalibConfig, xp: Any) -> MinMaxState:
    """A KL update: the accumulated range clipped to the KL threshold of the accumulated histogram,
    averaged into ``state``."""
    lo, hi = clip_range(acc.seen.min_val, acc.seen.max_val, search_amax("kl", acc.hist, config, xp), xp)
    return average_range(state, lo, hi, config.averaging_constant, xp)


def kl_pending_message(owner: str, steps: int, update_interval: int) -> str:
    return (
        f"{owner} has not run a KL update yet: it runs every update_interval={update_interval} observed "
        f"batches and has seen {steps}; returning default values (scale=1, zero_point=0). Observe more "
        "batches or use a smaller update_interval"
    )


# ---------------------------------------------------------------------------------------- classes


class _CalibrationObserver(UniformQuantizationObserverBase):
    """Shared by the four observers: configuration, the observe loop and the pure hooks
    (``_compute_batch``, ``_compute_accumulate``, ``_compute_kl``) that JAX jits and CuPy runs on the
    state's device."""

    _METHOD = ""

    def __init__(
        self,
        averaging_constant: float,
        ch_axis: int,
        dtype: Any,
        qscheme: QScheme | str,
        quant_min: int | None,
        quant_max: int | None,
        is_sync_quantize: bool,
        factory_kwargs: Mapping[str, Any] | None,
        *,
        bins: int,
        percentile: float = 99.99,
        stride: int = 1,
        update_interval: int = 1,
        xp: Any = None,
    ) -> None:
        config, per_channel = make_config(
            type(self).__name__, self._METHOD, dtype=dtype, qscheme=qscheme, quant_min=quant_min,
            quant_max=quant_max, ch_axis=ch_axis, averaging_constant=averaging_constant, bins=bins,
            percentile=percentile, stride=stride, update_interval=update_interval, is_sync_quantize=is_sync_quantize,
        )
        self._PER_CHANNEL = per_channel  # per instance: Horizon chooses by ch_axis
        super().__init__(dtype, qscheme, False, quant_min, quant_max, factory_kwargs, xp=xp)
        self.ch_axis = int(ch_axis)
        self.is_sync_quantize = False
        self._averaging_constant = config.averaging_constant
        self._config = config
        self.last_choice: Array | None = None

    @property
    def config(self) -> CalibConfig:
        """The validated, hashable calibration configuration."""
        return self._config

    # -- hooks ---------------------------------------------------------------------------------
    def _compute_batch(self, state: MinMaxState, x: Array, axis: int | None) -> tuple[MinMaxState, Array | None]:
        return batch_update(state, x, axis=axis, config=self._config, xp=self._xp)

    def _compute_update(self, state: MinMaxState, x: Array, axis: int | None) -> MinMaxState:
        return self._compute_batch(state, x, axis)[0]

    # -- observe -------------------------------------------------------------------------------
    def __call__(self, x: Array) -> Array:
        """Observe ``x`` and return it (the same object). Errors leave the state untouched."""
        x_arr, axis = self._check_input(x)
        if size(x_arr) == 0:
            return x
        state = self._state
        if state is None:
            state = self._new_state(x_arr, x_arr.shape[axis] if self._PER_CHANNEL else None)
        self._check_fits(state, x_arr, axis)
        self._observe(state, x_arr, axis)
        return x

    def _observe(self, state: MinMaxState, x: Array, axis: int | None) -> None:
        self._state, self.last_choice = self._compute_batch(state, x, axis)

    def reset_min_max_vals(self) -> None:
        """Forget everything seen (per channel, the channel count too)."""
        super().reset_min_max_vals()
        self.last_choice = None

    def extra_repr(self) -> str:
        s = self._state
        return (
            describe(self._config, self.ch_axis)
            + f", min_val={None if s is None else s.min_val}, max_val={None if s is None else s.max_val}"
        )


class PercentileObserver(_CalibrationObserver):
    """Per batch, ``amax`` = the ``percentile`` of ``|x|`` (:func:`~observers_core.percentile_range` of
    a ``bins``-bin histogram: the left edge of the bin where the cumulative count reaches it); the
    range ``clip([min(X), max(X)], -amax, amax)`` is moving-averaged:
    ``x_min = x_min + c * (lo - x_min)``. Horizon's signature; see the module docstring."""

    _METHOD = "percentile"

    def __init__(
        self,
        percentile: float = 99.99,
        bins: int = 2048,
        averaging_constant: float = 0.01,
        ch_axis: int = -1,
        dtype: Any = "qint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_SYMMETRIC,
        quant_min: int | None = None,
        quant_max: int | None = None,
        is_sync_quantize: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
        *,
        xp: Any = None,
    ) -> None:
        super().__init__(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, percentile=percentile, xp=xp,
        )


class MSEObserver(_CalibrationObserver):
    """Per batch, ``amax`` = the bin center of least expected squared error
    ``E(amax) = sum_j h_j (fq(c_j) - c_j)**2 / sum_j h_j`` over a ``bins``-bin histogram of ``|x|``
    (:func:`~observers_core.mse_threshold`, candidates every ``stride`` bins); the clipped range is
    moving-averaged. Horizon's signature plus keyword-only ``bins``."""

    _METHOD = "mse"

    def __init__(
        self,
        stride: int = 1,
        averaging_constant: float = 0.01,
        ch_axis: int = -1,
        dtype: Any = "qint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_SYMMETRIC,
        quant_min: int | None = None,
        quant_max: int | None = None,
        is_sync_quantize: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
        *,
        bins: int = 2048,
        xp: Any = None,
    ) -> None:
        super().__init__(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, stride=stride, xp=xp,
        )


class MixObserver(_CalibrationObserver):
    """Per batch, the candidates ``minmax``, ``percentile``, ``kl`` and ``mse`` (:data:`MIX_CANDIDATES`)
    each give a clipped range; the one whose qparams fake-quantize the batch with the least squared
    error wins (per channel; the first among equals) and is moving-averaged. ``last_choice`` holds the
    winners' indices. Horizon's signature plus keyword-only ``bins``, ``percentile`` and ``stride``."""

    _METHOD = "mix"

    def __init__(
        self,
        averaging_constant: float = 0.01,
        ch_axis: int = -1,
        dtype: Any = "qint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_SYMMETRIC,
        quant_min: int | None = None,
        quant_max: int | None = None,
        is_sync_quantize: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
        *,
        bins: int = 2048,
        percentile: float = 99.99,
        stride: int = 1,
        xp: Any = None,
    ) -> None:
        super().__init__(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, percentile=percentile, stride=stride, xp=xp,
        )


class KLObserver(_CalibrationObserver):
    """Accumulates a ``bins``-bin histogram of ``|x|`` and the finite range over every batch; every
    ``update_interval``-th batch, ``amax`` = :func:`~observers_core.kl_threshold` of the accumulated
    histogram (TensorRT's entropy calibration with ``num_levels`` = the levels ``|x|`` reaches) and the
    accumulated range clipped to ``[-amax, amax]`` is moving-averaged into ``min_val``/``max_val`` (the
    first KL update initialises). Before it, ``calculate_qparams`` warns and returns ``scale=1,
    zero_point=0``. Horizon's signature; the pure ``update(state, x)`` is not offered (the step
    depends on the accumulated histogram and the batch count)."""

    _METHOD = "kl"

    def __init__(
        self,
        bins: int = 512,
        update_interval: int = 1,
        averaging_constant: float = 0.01,
        ch_axis: int = -1,
        dtype: Any = "qint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_SYMMETRIC,
        quant_min: int | None = None,
        quant_max: int | None = None,
        is_sync_quantize: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
        *,
        xp: Any = None,
    ) -> None:
        super().__init__(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, update_interval=update_interval, xp=xp,
        )
        self._acc: KLAccumulator | None = None
        self.num_steps = 0

    @property
    def update_interval(self) -> int:
        return self._config.update_interval

    @property
    def accumulator(self) -> KLAccumulator | None:
        """The accumulated histogram and range (``None`` before the first batch; not in the state dict)."""
        return self._acc

    # -- hooks ---------------------------------------------------------------------------------
    def _new_accumulator(self, x: Array, num_channels: int | None) -> KLAccumulator:
        device = self._device if self._device is not None else device_of(x)
        return kl_init(num_channels, bins=self._config.bins, device=device, xp=self._xp)

    def _compute_accumulate(self, acc: KLAccumulator, x: Array, axis: int | None) -> KLAccumulator:
        return kl_accumulate(acc, x, axis=axis, xp=self._xp)

    def _compute_kl(self, state: MinMaxState, acc: KLAccumulator) -> MinMaxState:
        return kl_update(state, acc, config=self._config, xp=self._xp)

    def _observe(self, state: MinMaxState, x: Array, axis: int | None) -> None:
        channels = x.shape[axis] if self._PER_CHANNEL else None
        acc = self._acc if self._acc is not None else self._new_accumulator(x, channels)
        if self._PER_CHANNEL and tuple(acc.seen.min_val.shape) != (channels,):
            raise ValueError(
                f"x has {channels} channels along ch_axis={self.ch_axis} but the KL histogram holds "
                f"{acc.seen.min_val.shape[0]}; call reset_min_max_vals() to observe a different channel count"
            )
        self._acc = self._compute_accumulate(acc, x, axis)
        self.num_steps += 1
        if self.num_steps % self._config.update_interval == 0:
            self._state = self._compute_kl(state, self._acc)

    def update(self, state: MinMaxState, x: Array) -> MinMaxState:
        raise NotImplementedError(
            "KLObserver has no pure update(state, x): its KL step depends on the histogram accumulated over "
            "all batches and on the batch count; call the observer, or use observers_core.calib_histogram_update "
            "and kl_threshold directly"
        )

    def calculate_qparams(self) -> QParams:
        """``calculate_qparams(x_min, x_max)`` of the averaged KL range; before the first KL update a
        warning that says so and ``scale=[1.], zero_point=[0]``."""
        if self._state is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                default = super().calculate_qparams()
            warnings.warn(kl_pending_message(type(self).__name__, self.num_steps, self.update_interval), UserWarning,
                          stacklevel=2)
            return default
        return super().calculate_qparams()

    def reset_min_max_vals(self) -> None:
        """Forget everything seen: the averaged range, the histogram and the batch count."""
        super().reset_min_max_vals()
        self._acc = None
        self.num_steps = 0

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_steps={self.num_steps}"
