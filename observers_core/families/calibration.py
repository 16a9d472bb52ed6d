"""The calibration family (Horizon ``observer_v2``: KL, MSE, percentile, Mix; ModelOpt's searches).

Every method picks a clipping magnitude ``amax`` from a histogram of ``|x|``
(:class:`~observers_core.CalibHistogram`, ``bins`` bins on an exact power-of-two grid) with the core's
searches, then clips the observed finite range into ``[-amax, amax]`` and moving-averages it into the
state, ``x_min = x_min + c * (lo - x_min)`` (the first range initialises); qparams are
:func:`~observers_core.calculate_qparams` of ``(x_min, x_max)``. The per-method details, the conventions
and the deliberate differences from Horizon are in :mod:`observers_core.adapters._array_calibration`,
whose classes (and the JAX, CuPy and torch ones) are thin state holders over these functions.

- :func:`batch_update`: one batch of a per-batch method (percentile, MSE, Mix).
- :class:`KLAccumulator` (:func:`kl_init`, :func:`kl_accumulate`, :func:`kl_merge`, :func:`kl_update`):
  what KLObserver accumulates between KL steps; ``kl_merge`` of shard accumulators equals one
  accumulator over all the shards' data, exactly (the histogram grid is canonical, the range a min/max).
- :class:`KLState` (:func:`kl_state_init`, :func:`kl_state_update`, :func:`kl_state_merge`): KLObserver's
  whole state, the averaged range with the accumulator and the batch count, so that KL takes one
  ``update(state, x)`` step as the other methods do (the KL update every ``update_interval``-th batch).
- ``STATE_KEYS``: the state-dict keys (``min_val``, ``max_val``; histograms are not saved, as in Horizon).
- The family shape shared with the other families: ``Config`` (:class:`CalibConfig`), ``State`` (the
  averaged range, a :class:`~observers_core.MinMaxState`; for ``method="kl"`` a :class:`KLState`),
  :func:`init`, :func:`update` (one batch), :func:`merge` (replicas' averaged ranges: their mean; KL's
  accumulators exactly) and :func:`qparams`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, NamedTuple

import numpy as np

from .._calibration import (
    CalibHistogram,
    abs_histogram_update,
    check_calib_bins,
    calib_histogram_edges,
    calib_histogram_init,
    calib_histogram_merge,
    calib_histogram_update,
    error_norm,
    kl_threshold,
    mse_threshold,
    mse_window,
    percentile_range,
    work_dtype,
)
from .._compiled import (
    abs_max_kernel, fq_block_sums_kernel, host_view, pairwise_blocks, pairwise_combine, split_ranges, threads,
)
from .._dtypes import QScheme, QuantSpec, quant_spec
from .._minmax import (
    MinMaxState, aminmax, minmax_init, minmax_merge, minmax_qparams, minmax_update, moving_average_merge,
    moving_average_update,
)
from .._namespace import (
    array_namespace, channel_rows, device_of, explicit_replicated, is_finite, is_numpy_namespace, is_torch_namespace,
    rounded, size, torch_cuda_path, triton_route,
)
from .._qparams import calculate_qparams
from .._quantize import fake_quantize
from .._validate import INF, check_averaging_constant, check_bool, check_channel_count, check_int

__all__ = [
    "MIX_CANDIDATES", "STATE_KEYS", "CalibConfig", "Config", "State", "init", "merge", "qparams", "update", "KLAccumulator", "abs_histogram", "average_range",
    "batch_update", "candidate_errors", "check_accumulator_channels", "clip_range", "describe", "kl_accumulate",
    "kl_channels_differ", "kl_init", "kl_merge",
    "kl_pending_message", "kl_update", "KLState", "kl_state_init", "kl_state_update", "kl_state_merge", "make_config", "mix_range", "observed_range", "positive_levels",
    "search_amax", "tree_sum", "with_spec",
]  # fmt: skip

Array = Any
#: The state-dict keys of the averaged range.
STATE_KEYS = ("min_val", "max_val")

#: MixObserver's candidates, in the order that breaks ties (``last_choice`` indexes this tuple).
MIX_CANDIDATES = ("minmax", "percentile", "kl", "mse")


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
    """Levels ``z .. top`` that ``[0, amax]`` is quantized to (``z``: the zero point of
    ``calculate_qparams(0, amax)``): affine ``top = quant_max``; symmetric ``amax`` is at level
    ``z + (quant_max - quant_min) / 2``, so ``top = min(quant_max, z + round((quant_max - quant_min) / 2))``
    (half to even, as the quantizer rounds). 128 for qint8 and quint8 symmetric, 256 for quint8 affine,
    9 for quint4x2 symmetric."""
    low, high = mse_window(spec)
    if spec.qscheme.is_symmetric:
        high = min(high, low + round((spec.quant_max - spec.quant_min) / 2))
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
    argument; ``is_sync_quantize=True`` raises ``NotImplementedError`` (the array observers sync through
    ``update(state, x, collective=...)``; the torch adapter handles the flag before calling this)."""
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
    bins = check_calib_bins(bins)
    levels = _checked_levels(spec, bins)
    stride = check_int(stride, "stride", minimum=1)
    update_interval = check_int(update_interval, "update_interval", minimum=1)
    if check_bool(is_sync_quantize, "is_sync_quantize"):
        raise NotImplementedError(
            "is_sync_quantize=True is not implemented by the array observers: sync a step with "
            "obs.update(state, x, collective=...) (JAX: axis_name=... inside shard_map/pmap), or use the torch "
            "observers, which take is_sync_quantize=True (torch.distributed)"
        )
    config = CalibConfig(method, spec, float(averaging_constant), bins, levels, float(percentile), stride, update_interval)
    return config, per_channel


def _checked_levels(spec: QuantSpec, bins: int, given: str = "") -> int:
    """:func:`positive_levels` of ``spec``; ``ValueError`` where there is none (a symmetric zero point above
    ``quant_max``: uint16's 2**15 with a narrower custom range) or ``bins`` is below it."""
    levels = positive_levels(spec)
    if levels < 1:
        raise ValueError(
            f"dtype={spec.dtype!r}, qscheme={spec.qscheme.value!r}, quant_min={spec.quant_min}, "
            f"quant_max={spec.quant_max}{given} put the symmetric zero point {spec.symmetric_zero_point} above "
            "quant_max: no level holds |x| >= 0; allowed: a range that contains the zero point"
        )
    if bins < levels:
        raise ValueError(
            f"bins={bins} is smaller than the {levels} quantized levels |x| reaches with dtype={spec.dtype!r}, "
            f"qscheme={spec.qscheme.value!r}, quant_min={spec.quant_min}, quant_max={spec.quant_max}{given}; "
            f"allowed: bins >= {levels}"
        )
    return levels


def with_spec(config: CalibConfig, spec: QuantSpec) -> CalibConfig:
    """``config`` for the quantizer ``spec`` (an observer's ``quant_min``/``quant_max``/``qscheme``/``dtype``
    set after construction, or a loaded ``eps``): the same checks as :func:`make_config` (per channel stays
    per channel; ``bins`` covers the levels), ``ValueError`` otherwise."""
    if spec == config.spec:
        return config
    if spec.qscheme.is_per_channel != config.spec.qscheme.is_per_channel:
        raise ValueError(f"qscheme={spec.qscheme.value!r} (set after construction) must stay "
                         f"{'per channel' if config.spec.qscheme.is_per_channel else 'per tensor'}: "
                         f"it was {config.spec.qscheme.value!r}")
    levels = _checked_levels(spec, config.bins, " (set after construction)")
    return dataclasses.replace(config, spec=spec, levels=levels)


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


def abs_histogram(x: Array, *, axis: int | None, bins: int, xp: Any, collective: Any = None,
                  seen: tuple[Array, Array] | None = None) -> CalibHistogram:
    """A fresh :class:`~observers_core.CalibHistogram` of ``|x|`` (per channel along ``axis``; with a
    collective, of every member's ``x``). ``seen``: :func:`observed_range` of ``x``, when the caller has it."""
    channels = None if axis is None else x.shape[axis]
    state = calib_histogram_init(bins=bins, num_channels=channels, device=device_of(x), xp=xp)
    return _abs_update(state, x, axis, xp, collective, seen, fresh=True)


def _abs_update(state: CalibHistogram, x: Array, axis: int | None, xp: Any, collective: Any,
                seen: tuple[Array, Array] | None, fresh: bool = False) -> CalibHistogram:
    """``x`` counted into the histogram of ``|x|``; from the batch's finite range ``seen`` where that is
    exact (:func:`~observers_core._calibration.abs_histogram_update`: no collective, ``x`` not float64,
    whose cast to float32 may overflow), one pass over ``x`` fewer; ``fresh``: ``state`` is a new one."""
    if seen is not None and collective is None and size(x) > 0 and x.dtype != xp.float64:
        return abs_histogram_update(state, x, seen, axis=axis, xp=xp, fresh=fresh)
    return calib_histogram_update(state, x, axis=axis, absolute=True, xp=xp, collective=collective)


def search_amax(method: str, hist: CalibHistogram, config: CalibConfig, xp: Any) -> Array:
    """The clipping magnitude of ``method`` for the histogram of ``|x|`` (``+inf`` for ``"minmax"``)."""
    if method == "minmax":
        return xp.full(tuple(hist.max_val.shape), INF, dtype=hist.max_val.dtype, device=device_of(hist.max_val))
    if method == "kl" and _kl_kernel_applies(hist, config, xp):
        from .. import _triton_kernels  # torch CUDA: the KL search in three kernels, no host read

        return _triton_kernels.kl_search_amax(hist.counts, hist.lo, hist.width, config.levels)
    routed = _kernel_amax(method, hist, config, xp)
    if routed is not None:
        return routed
    edges = calib_histogram_edges(hist, xp=xp)  # the observer's own histogram: valid, no check (host read)
    if method == "kl":
        return kl_threshold(hist.counts, edges, num_levels=config.levels, check=False, xp=xp)
    if method == "mse":
        return mse_threshold(hist.counts, edges, spec=config.spec, stride=config.stride, check=False, xp=xp)
    if method == "percentile":
        return percentile_range(hist.counts, edges, percentile=config.percentile, check=False, xp=xp)[1]
    raise ValueError(f"unknown calibration method {method!r}")


def _kernel_amax(method: str, hist: CalibHistogram, config: CalibConfig, xp: Any) -> Array | None:
    """:func:`search_amax` on the torch CUDA path in Triton kernels (the array code's result, bit for bit):
    the percentile in one kernel, the MSE search in three; ``None`` where they do not apply (other paths,
    a percentile or MSE divisor that float32 parts cannot carry exactly, more MSE levels than bins)."""
    if (method not in ("percentile", "mse") or hist.counts.dtype != xp.int64 or hist.lo.dtype != xp.float32
            or not triton_route(hist.counts, xp=xp)):
        return None
    from .. import _triton_kernels

    if method == "percentile":
        if not _percentile_kernel_applies(config):
            return None
        return _triton_kernels.percentile_amax(hist.counts, hist.lo, hist.width, config.percentile / 100)
    spec = config.spec
    low, high = mse_window(spec)
    qrange = float(spec.quant_max - spec.quant_min)
    float_qparams = spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS
    divisor = qrange / 2 if spec.qscheme.is_symmetric else qrange
    if not _triton_kernels.mse_applies(hist.counts.shape[-1], high - low + 1, divisor):
        return None
    return _triton_kernels.mse_amax(hist.counts, hist.lo, hist.width, start=min(128, hist.counts.shape[-1] - 1),
                                    stride=config.stride, levels=high - low + 1, mode=int(float_qparams),
                                    divisor=divisor, eps=float(np.float32(spec.eps)))


def _kl_kernel_applies(hist: CalibHistogram, config: CalibConfig, xp: Any) -> bool:
    """Whether the KL search of ``hist`` runs the Triton kernels: the torch CUDA path, int64 counts on a
    float32 grid, and ``levels`` whose group sums the kernel adds in NumPy's order (``kl_search_applies``)."""
    if not (hist.counts.dtype == xp.int64 and hist.lo.dtype == xp.float32 and triton_route(hist.counts, xp=xp)):
        return False
    from .. import _triton_kernels

    return _triton_kernels.kl_search_applies(config.levels)


def observed_range(x: Array, *, axis: int | None, xp: Any, collective: Any = None) -> tuple[Array, Array]:
    """The finite range of ``x`` as float32 (``(+inf, -inf)`` where nothing finite was seen; with a
    collective, of every member's ``x``). JAX, channels sharded over Explicit mesh axes: replicated."""
    if is_numpy_namespace(xp) and axis is None and collective is None and size(x) > 0:  # no state to fold in
        return tuple(np.asarray(v, dtype=np.float32) for v in aminmax(x, ignore_nonfinite=True, xp=xp))
    state = minmax_init(num_channels=None if axis is None else x.shape[axis], device=device_of(x), xp=xp)
    lo, hi = minmax_update(state, x, axis=axis, ignore_nonfinite=True, xp=xp, collective=collective)
    replicated = explicit_replicated(lo, xp)  # JAX, channels sharded over Explicit mesh axes: replicated,
    if replicated is not None:  # as the histogram rows (the searches gather by channel)
        lo, hi = (xp.reshape(a, tuple(a.shape), out_sharding=replicated) for a in (lo, hi))
    return lo, hi


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
    first range initialises, an unseen one (``lo > hi``) changes nothing. Two rounding accidents of the
    formula are replaced by the convex ``x_min (1 - c) + lo c`` (which keeps ``x_min <= x_max``: rounding
    is monotone): where ``lo - x_min`` overflows float32 (finite values of opposite signs beyond 8.5e37;
    the formula's infinity would leave, say, ``max_val = -inf`` beside a finite ``min_val``), that side;
    where the result has ``min_val > max_val`` (cancellation: ``1e30 + 1 * (0.125 - 1e30)`` is 0, not
    0.125), both sides."""
    fast = _average_on_host(state, lo, hi, float(averaging_constant), xp)
    if fast is not None:
        return fast
    pairs = xp.stack([lo, hi], axis=-1)
    new = moving_average_update(
        state, pairs, averaging_constant=averaging_constant, axis=None if lo.ndim == 0 else 0,
        ignore_nonfinite=True, xp=xp,
    )
    c = float(averaging_constant)
    convex, averaged = [], []
    for old, target, value in ((state.min_val, lo, new.min_val), (state.max_val, hi, new.max_val)):
        convex.append(rounded(old * (1.0 - c), xp) + rounded(target * c, xp))  # (no fused multiply-add)
        overflow = is_finite(old, xp) & is_finite(target, xp) & ~is_finite(value, xp)
        averaged.append(xp.where(overflow, convex[-1], value))
    disordered = (averaged[0] > averaged[1]) & (lo <= hi)
    return MinMaxState(*(xp.where(disordered, a, b) for a, b in zip(convex, averaged)))


def _average_on_host(state: MinMaxState, lo: Array, hi: Array, c: float, xp: Any) -> MinMaxState | None:
    """:func:`average_range` of 0-d float32 NumPy values with a finite range ``lo < hi`` (per tensor, the
    common case): the array code's float32 operations on NumPy scalars, the branches decided in Python
    (the array code spends some 50 NumPy calls on two numbers). ``None`` otherwise, and with the compiled
    kernels off (the host paths' switch). ``lo == hi`` is left to the array code: NumPy's min of
    ``[-0.0, 0.0]`` is ``0.0``, which it keeps."""
    if not is_numpy_namespace(xp) or host_view(lo, xp) is None:  # (None: the kernels are off)
        return None
    values = [np.asarray(v) for v in (state.min_val, state.max_val, lo, hi)]
    if any(v.ndim != 0 or v.dtype != np.float32 for v in values):
        return None
    old_min, old_max, lo, hi = (np.float32(v) for v in values)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        return None
    if old_min == INF and old_max == -INF:  # the first range initialises
        return MinMaxState(np.asarray(lo), np.asarray(hi))
    convex, averaged = [], []
    with np.errstate(all="ignore"):
        for old, target in ((old_min, lo), (old_max, hi)):
            convex.append(old * (1.0 - c) + target * c)
            value = old + c * (target - old)
            overflow = np.isfinite(old) and np.isfinite(target) and not np.isfinite(value)
            averaged.append(convex[-1] if overflow else value)
    new_min, new_max = convex if averaged[0] > averaged[1] else averaged
    return MinMaxState(np.asarray(new_min), np.asarray(new_max))


def candidate_errors(x: Array, lo: Array, hi: Array, *, axis: int | None, spec: QuantSpec, xp: Any,
                     collective: Any = None, amax: Array | None = None) -> Array:
    """Mean squared fake-quantization error of ``x`` for each candidate range ``(lo[..., k], hi[..., k])``:
    ``E_k = sum((fq_k(x) - x)**2) / n`` over the finite values (per channel), divided by the squared
    power of two at or above the channel's largest magnitude (:func:`~observers_core._calibration.error_norm`:
    huge ranges neither overflow nor vanish under XLA's flush to zero; the ranking is unchanged), with
    ``fq_k`` = :func:`~observers_core.fake_quantize` by ``calculate_qparams(lo_k, hi_k, spec)``.
    float64 where the namespace has it. Shape of ``lo``. ``amax``: that largest finite ``|x|`` per
    channel (every member's), where the caller has it exactly.

    Host memory with the compiled kernels: the same float64 values summed in NumPy's order
    (:func:`~observers_core._compiled.fq_block_sums_kernel`), blocks shared by threads; the results equal
    the NumPy array code's bit for bit. With a collective the norm, sums and counts are every member's
    (the float64 sums then add in another order than one process's: the errors may differ in the last bits)."""
    rows = channel_rows(x, axis, xp)
    lo2, hi2 = xp.reshape(lo, (rows.shape[0], -1)), xp.reshape(hi, (rows.shape[0], -1))
    scale, zero_point = calculate_qparams(lo2, hi2, spec, xp=xp)
    host = host_view(rows, xp) if size(rows) > 0 else None
    if amax is not None:
        amax = xp.reshape(xp.astype(amax, work_dtype(xp, device_of(x))), (-1, 1))
    if host is not None and host.dtype in (np.float32, np.float64):
        if amax is None:
            amax = _reduced(xp.asarray(abs_max_kernel(host))[:, None], "max", collective)
        norm = error_norm(amax, xp)
        scale64, zero_point64, norm64 = (np.asarray(host_view(a, xp), dtype=np.float64) for a in (scale, zero_point, norm))
        sums = _fq_sums(host, scale64, zero_point64, xp.isdtype(zero_point.dtype, "real floating"), norm64,
                        float(spec.quant_min), float(spec.quant_max))
        sums, count = xp.asarray(sums[:, :-1]), xp.asarray(sums[:, -1])
    else:
        dtype = work_dtype(xp, device_of(x))
        rows = xp.astype(rows, dtype)
        finite = xp.isfinite(rows)
        rows = xp.where(finite, rows, 0.0)
        count = xp.sum(xp.astype(finite, dtype), axis=-1)
        if amax is None:
            amax = _reduced(xp.max(xp.abs(rows), axis=-1, keepdims=True) if size(rows) else
                            xp.zeros((rows.shape[0], 1), dtype=dtype, device=device_of(rows)), "max", collective)
        norm = error_norm(amax, xp)
        tree = is_torch_namespace(xp) and torch_cuda_path(rows)  # (the Mix kernel's order)
        sums = []
        for k in range(lo2.shape[-1]):  # a static loop over the (few) candidates: one (C, N) temporary each
            fq = fake_quantize(rows, scale[:, k:k + 1], zero_point[:, k:k + 1],
                               quant_min=spec.quant_min, quant_max=spec.quant_max, xp=xp)
            d = xp.where(finite, (fq - rows) / norm[:, None], 0.0)
            sums.append(tree_sum(d * d, xp) if tree else xp.sum(d * d, axis=-1))
        sums = xp.stack(sums, axis=-1)
    sums, count = _reduced(sums, "sum", collective), _reduced(count, "sum", collective)
    return xp.reshape(sums / xp.where(count > 0, count, 1.0)[:, None], tuple(lo.shape))


def tree_sum(v: Array, xp: Any) -> Array:
    """The sum along the last axis as a fixed tree, the order of the torch CUDA path's Mix kernel: ``v``
    zero-padded to a power of two, then adjacent pairs ``v[2i] + v[2i + 1]`` added level by level."""
    n = v.shape[-1]
    size = 1 << max(0, n - 1).bit_length()
    if size > n:
        v = xp.concat([v, xp.zeros(tuple(v.shape[:-1]) + (size - n,), dtype=v.dtype, device=device_of(v))], axis=-1)
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def _fq_sums(rows: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, float_zero_point: bool, norm: np.ndarray,
             quant_min: float, quant_max: float) -> np.ndarray:
    """:func:`candidate_errors`' sums (C, K) and finite counts, (C, K + 1), of host ``rows`` (C, N) with the
    compiled kernels: the blocks of NumPy's pairwise sum on up to :func:`~observers_core._compiled.threads`
    threads, then added in NumPy's order (one walk for all rows). Candidates whose scales and zero points are
    bitwise those of an earlier one in every row have its sums (the same operations on the same values):
    computed once."""
    keys = [scale[:, k].tobytes() + zero_point[:, k].tobytes() for k in range(scale.shape[1])]
    source = [keys.index(key) for key in keys]  # the first candidate of each key
    distinct = sorted(set(source))
    scale, zero_point = scale[:, distinct], zero_point[:, distinct]
    blocks = pairwise_blocks(rows.shape[1])
    out = np.empty((rows.shape[0], scale.shape[1] + 1, blocks.shape[0]), dtype=np.float64)
    split_ranges(fq_block_sums_kernel, blocks.shape[0], threads(rows.size), rows, blocks, 1 / scale, scale, zero_point,
                 float_zero_point, 1 / norm, quant_min, quant_max, out, chunk=256)
    sums = pairwise_combine(out.reshape(-1, blocks.shape[0]), rows.shape[1]).reshape(out.shape[:2])
    return sums[:, [distinct.index(k) for k in source] + [len(distinct)]]


def _reduced(x: Array, op: str, collective: Any) -> Array:
    """``collective.<op>(x)``, or ``x`` itself without a collective."""
    return x if collective is None else getattr(collective, op)(x)


def mix_range(x: Array, hist: CalibHistogram, lo: Array, hi: Array, *, axis: int | None, config: CalibConfig,
              xp: Any, collective: Any = None) -> tuple[Array, Array, Array]:
    """MixObserver's batch result: every candidate of :data:`MIX_CANDIDATES` clips ``(lo, hi)``; the one
    of least :func:`candidate_errors` wins (the first among equals). ``(lo, hi, choice)``."""
    kernels = (collective is None and size(x) > 0 and x.dtype == xp.float32 and lo.dtype == xp.float32
               and triton_route(x, lo, xp=xp))
    amaxes = [search_amax(m, hist, config, xp) for m in MIX_CANDIDATES[kernels:]]  # (kernels: minmax's +inf inside)
    if kernels:
        from .. import _triton_kernels  # torch CUDA: the candidates' errors in one pass over x, the pick

        spec = config.spec
        qrange = float(spec.quant_max - spec.quant_min)
        mode = 0 if spec.qscheme.is_symmetric else 2 if spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS else 1
        return _triton_kernels.mix_pick(
            x, None if axis is None else axis % x.ndim, lo, hi, amaxes, mode=mode, quant_min=spec.quant_min,
            quant_max=spec.quant_max, zero_point=spec.symmetric_zero_point, divisor=qrange / 2 if mode == 0 else qrange,
            eps=float(np.float32(spec.eps)))[:3]
    ranges = [clip_range(lo, hi, a, xp) for a in amaxes]
    lo_k = xp.stack([r[0] for r in ranges], axis=-1)
    hi_k = xp.stack([r[1] for r in ranges], axis=-1)
    amax = xp.maximum(-lo, hi) if x.dtype == lo.dtype else None  # exact: the range of x itself (as float32)
    choice = xp.argmin(candidate_errors(x, lo_k, hi_k, axis=axis, spec=config.spec, xp=xp, collective=collective,
                                        amax=amax), axis=-1)
    picked = xp.arange(len(MIX_CANDIDATES), device=device_of(lo)) == choice[..., None]
    return xp.min(xp.where(picked, lo_k, INF), axis=-1), xp.max(xp.where(picked, hi_k, -INF), axis=-1), choice


def as_float32(x: Array, xp: Any) -> Array:
    """A float64 batch as float32, the dtype of the calibration statistics: every framework then observes
    the same values (JAX without x64 casts so itself), and one that float32 cannot hold is ``±inf``,
    skipped as every non-finite value (kept float64, the range and the histogram disagreed: a NaN Mix
    range from finite data)."""
    return xp.astype(x, xp.float32) if x.dtype == xp.float64 else x


def batch_update(state: MinMaxState, x: Array, /, *, axis: int | None, config: CalibConfig, xp: Any,
                 collective: Any = None) -> tuple[MinMaxState, Array | None]:
    """One batch of a per-batch method (percentile, MSE, mix): its clipped range averaged into ``state``;
    also MixObserver's choice (``None`` otherwise). ``x`` must not be empty, unless a collective makes
    the batch every member's (then the histogram, range and Mix errors are every member's). float64
    ``x`` is observed as float32 (:func:`as_float32`)."""
    x = as_float32(x, xp)
    if collective is None and size(x) > 0 and x.dtype == xp.float32 and triton_route(x, xp=xp):
        from .. import _triton_kernels  # torch CUDA: observed_range and abs_histogram in two kernels

        lo, hi, parts = _triton_kernels.range_abs_histogram(x, None if axis is None else axis % x.ndim, config.bins)
        hist = CalibHistogram(*parts)
    else:
        lo, hi = observed_range(x, axis=axis, xp=xp, collective=collective)
        hist = abs_histogram(x, axis=axis, bins=config.bins, xp=xp, collective=collective, seen=(lo, hi))
    choice = amax = None
    if config.method == "mix":
        lo, hi, choice = mix_range(x, hist, lo, hi, axis=axis, config=config, xp=xp, collective=collective)
    else:
        amax = search_amax(config.method, hist, config, xp)
    return _clipped_average(state, lo, hi, amax, config.averaging_constant, xp), choice


def _clipped_average(state: MinMaxState, lo: Array, hi: Array, amax: Array | None, averaging_constant: float,
                     xp: Any) -> MinMaxState:
    """:func:`clip_range` of ``(lo, hi)`` (``amax`` None: not clipped), then :func:`average_range` into ``state``."""
    if state.min_val.dtype == xp.float32 and lo.dtype == xp.float32 and triton_route(state.min_val, lo, xp=xp):
        from .. import _triton_kernels  # torch CUDA: clip_range and average_range in one kernel

        return MinMaxState(*_triton_kernels.clip_average(*state, lo, hi, amax, averaging_constant))
    if amax is not None:
        lo, hi = clip_range(lo, hi, amax, xp)
    return average_range(state, lo, hi, averaging_constant, xp)


def _percentile_kernel_applies(config: CalibConfig) -> bool:
    """Whether the percentile's ``keep`` goes into the Triton kernel exactly (three float32 parts)."""
    from .. import _triton_kernels

    try:
        _triton_kernels.float32_parts(config.percentile / 100)
    except ValueError:
        return False
    return True


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


def kl_channels_differ(acc: KLAccumulator, state: MinMaxState) -> bool:
    """Whether a per-channel ``state`` (e.g. a loaded one) has another channel count than ``acc``."""
    return tuple(acc.seen.min_val.shape) != tuple(state.min_val.shape)


def check_accumulator_channels(acc: KLAccumulator, channels: int | None, ch_axis: int) -> None:
    """``ValueError`` unless the accumulator holds ``channels`` channels (``None``: per tensor, no check)."""
    if channels is not None:
        check_channel_count(channels, tuple(acc.seen.min_val.shape), ch_axis)


def kl_accumulate(acc: KLAccumulator, x: Array, /, *, axis: int | None, xp: Any, collective: Any = None
                  ) -> KLAccumulator:
    """``x`` counted into the histogram of ``|x|`` and the running finite range (with a collective,
    every member's ``x``: exactly the accumulator of the concatenated batch). float64 ``x`` is observed as
    float32 (:func:`as_float32`)."""
    x = as_float32(x, xp)
    if _kl_accumulate_kernel_applies(acc, x, axis, xp, collective):
        from .. import _triton_kernels  # torch CUDA: the range, the counts and the re-binning in two kernels

        hist, seen = _triton_kernels.kl_accumulate(acc.hist, acc.seen, x, None if axis is None else axis % x.ndim)
        return KLAccumulator(CalibHistogram(*hist), MinMaxState(*seen))
    lo, hi = observed_range(x, axis=axis, xp=xp, collective=collective)
    hist = _abs_update(acc.hist, x, axis, xp, collective, (lo, hi))  # (checks the channel count)
    # minmax_update(acc.seen, x)'s operations, in its order
    return KLAccumulator(hist, MinMaxState(xp.minimum(lo, acc.seen.min_val), xp.maximum(hi, acc.seen.max_val)))


def _kl_accumulate_kernel_applies(acc: KLAccumulator, x: Array, axis: int | None, xp: Any, collective: Any) -> bool:
    """Whether :func:`kl_accumulate` runs the Triton kernels: the torch CUDA path, no collective, non-empty
    float32 ``x`` with the accumulator's channel count (else the array code, which raises for a wrong one),
    int64 counts on a float32 grid and range."""
    channels = () if axis is None else (x.shape[axis % x.ndim],) if x.ndim else None
    return (collective is None and size(x) > 0 and x.dtype == xp.float32 and tuple(acc.hist.lo.shape) == channels
            and acc.hist.counts.dtype == xp.int64
            and all(a.dtype == xp.float32 for a in (*acc.hist[1:], *acc.seen))
            and triton_route(x, acc.hist.counts, xp=xp))


def kl_merge(a: KLAccumulator, b: KLAccumulator, /, *, xp: Any = None) -> KLAccumulator:
    """Two accumulators as one: ``calib_histogram_merge`` of the histograms and ``minmax_merge`` of the
    ranges. Exactly the accumulator of both shards' data (in any order and grouping)."""
    return KLAccumulator(calib_histogram_merge(a.hist, b.hist, xp=xp), minmax_merge(a.seen, b.seen, xp=xp))


def kl_update(state: MinMaxState, acc: KLAccumulator, /, *, config: CalibConfig, xp: Any) -> MinMaxState:
    """A KL update: the accumulated range clipped to the KL threshold of the accumulated histogram,
    averaged into ``state``."""
    return _clipped_average(state, *acc.seen, search_amax("kl", acc.hist, config, xp), config.averaging_constant, xp)


class KLState(NamedTuple):
    """KLObserver's whole state: ``range`` (the averaged range, what the qparams read), ``acc`` (the
    histogram of ``|x|`` and the finite range accumulated over every batch) and ``steps`` (0-d int32: the
    batches counted)."""

    range: MinMaxState
    acc: KLAccumulator
    steps: Array


def kl_state_init(num_channels: int | None, *, bins: int, device: Any, xp: Any) -> KLState:
    """A KL state that has seen nothing (per tensor, or of ``num_channels`` channels)."""
    return KLState(minmax_init(num_channels=num_channels, device=device, xp=xp),
                   kl_init(num_channels, bins=bins, device=device, xp=xp),
                   xp.asarray(0, dtype=xp.int32, device=device))


def kl_state_update(state: KLState, x: Array, /, *, axis: int | None, config: CalibConfig, xp: Any,
                    collective: Any = None) -> KLState:
    """One batch of KLObserver: ``x`` counted into the accumulator (:func:`kl_accumulate`), and on every
    ``update_interval``-th batch the KL update of the range (:func:`kl_update`), chosen with ``where`` (no
    host branch: the same under ``jit``). The stateful observers' result, bit for bit."""
    acc = kl_accumulate(state.acc, x, axis=axis, xp=xp, collective=collective)
    steps = state.steps + 1
    due = (steps % config.update_interval) == 0
    new = kl_update(state.range, acc, config=config, xp=xp)
    kept = MinMaxState(*(xp.where(due, n, o) for n, o in zip(new, state.range)))
    return KLState(kept, acc, steps)


def kl_state_merge(a: KLState, b: KLState, /, *, xp: Any = None) -> KLState:
    """Replicas' KL states: the mean of the averaged ranges (:func:`~observers_core.moving_average_merge`),
    the accumulators merged exactly (:func:`kl_merge`), the larger batch count."""
    xp = array_namespace(a.steps) if xp is None else xp
    return KLState(moving_average_merge(a.range, b.range), kl_merge(a.acc, b.acc, xp=xp), xp.maximum(a.steps, b.steps))


def kl_pending_message(owner: str, steps: int, update_interval: int) -> str:
    return (
        f"{owner} has not run a KL update yet: it runs every update_interval={update_interval} observed "
        f"batches and has seen {steps}; returning default values (scale=1, zero_point=0). Observe more "
        "batches or use a smaller update_interval"
    )


# -- the family shape (Config, State, init / update / merge / qparams) ---------------------------------
Config = CalibConfig
State = MinMaxState


def init(config: Config, /, *, num_channels: int | None = None, device: Any = None, xp: Any = None) -> State:
    """The averaged range before any step (``+inf``/``-inf``): 0-d, or ``(num_channels,)`` per channel (KL:
    a :class:`KLState`)."""
    if xp is None:
        import array_api_compat.numpy as xp
    if config.method == "kl":
        return kl_state_init(num_channels, bins=config.bins, device=device, xp=xp)
    return minmax_init(num_channels=num_channels, device=device, xp=xp)


def update(config: Config, state: State, x: Array, /, *, axis: int | None = None, collective: Any = None) -> State:
    """One batch (``axis``: the channel axis of ``x`` per channel): :func:`batch_update`'s state for the
    per-batch methods (percentile, MSE, Mix), :func:`kl_state_update` for KL (a :class:`KLState`)."""
    if config.method == "kl":
        return kl_state_update(state, x, axis=axis, config=config, xp=array_namespace(x), collective=collective)
    return batch_update(state, x, axis=axis, config=config, xp=array_namespace(x), collective=collective)[0]


def merge(config: Config, a: State, b: State, /) -> State:
    """Data-parallel replicas' averaged ranges: their mean (:func:`~observers_core.moving_average_merge`),
    as for the min/max family's moving average (not one pass over both shards; sync each step with a
    collective for that). KL states: :func:`kl_state_merge` (accumulators exactly)."""
    if config.method == "kl":
        return kl_state_merge(a, b)
    return moving_average_merge(a, b)


def qparams(config: Config, state: State, /) -> Any:
    """``calculate_qparams(min_val, max_val, config.spec)`` of the averaged range."""
    return minmax_qparams(state.range if isinstance(state, KLState) else state, config.spec)
