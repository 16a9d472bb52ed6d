"""Plain float64 NumPy references of the calibration searches: one candidate at a time, written from
the algorithms' descriptions (TensorRT / ModelOpt entropy, ModelOpt / Quark MSE, percentile), with
no code shared with ``observers_core``. Slow on purpose; for tests only."""

from __future__ import annotations

import math

import numpy as np

FLOAT32_EPS = float(np.finfo(np.float32).eps)


# --- KL ----------------------------------------------------------------------------------------


def _smooth(x: np.ndarray, eps: float):
    """MXNet / ONNX Runtime smooth_distribution: zeros -> eps, non-zeros -= eps * n_zero / n_nonzero;
    None when every entry is zero or a value ends <= 0."""
    is_zero = x == 0
    n_zero = int(is_zero.sum())
    n_nonzero = x.size - n_zero
    if n_nonzero == 0:
        return None
    eps1 = eps * n_zero / n_nonzero
    y = np.where(is_zero, eps, x - eps1)
    if (y <= 0).any():
        return None
    return y


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) of the normalised vectors; 0 log 0 = 0; inf where p > 0 = q or a vector sums to 0."""
    if p.sum() <= 0 or q.sum() <= 0:
        return math.inf
    p = p / p.sum()
    q = q / q.sum()
    if np.any((p > 0) & (q <= 0)):
        return math.inf
    used = p > 0
    return float(np.sum(p[used] * np.log(p[used] / q[used])))


def kl_divergences_ref(hist, *, num_levels, start_bin, stride=1, smoothing=0.0, flatten_first_bin=True):
    """``[(i, KL_i)]`` for i = start_bin, start_bin + stride, ..., <= bins (bins kept)."""
    b = np.array(hist, dtype=np.float64)
    if flatten_first_bin and b.size > 1:
        b[0] = b[1]
    out = []
    for i in range(start_bin, b.size + 1, stride):
        p = b[:i].copy()
        p[-1] += b[i:].sum()  # the clipped tail joins the last kept bin
        group = (np.arange(i) * num_levels) // i  # bin j of the kept i merges into level floor(j L / i)
        level_count = np.bincount(group, weights=b[:i], minlength=num_levels)
        level_nonempty = np.bincount(group, weights=b[:i] > 0, minlength=num_levels)
        q = np.where(b[:i] > 0, level_count[group] / np.maximum(level_nonempty[group], 1), 0.0)
        if smoothing > 0:
            p, q = _smooth(p, smoothing), _smooth(q, smoothing)
            out.append((i, math.inf if p is None or q is None else _kl(p, q)))
        else:
            out.append((i, _kl(p, q)))
    return out


def pick_ref(values, *, tol, ties):
    """Index of the least value; values within ``tol`` of it tie; 'last' or 'first' among ties."""
    values = list(values)
    best = min(values)
    near = [k for k, v in enumerate(values) if v <= best + tol]
    return near[-1] if ties == "last" else near[0]


def kl_threshold_ref(hist, edges, *, num_levels, start_bin, stride=1, smoothing=0.0, flatten_first_bin=True,
                     ties="last", tol=2.0**-40):
    curve = kl_divergences_ref(hist, num_levels=num_levels, start_bin=start_bin, stride=stride,
                               smoothing=smoothing, flatten_first_bin=flatten_first_bin)
    k = pick_ref([v for _, v in curve], tol=tol, ties=ties)
    return float(np.asarray(edges, dtype=np.float64)[curve[k][0]])


# --- MSE ---------------------------------------------------------------------------------------


def qparams_ref(amax: float, *, quant_min: int, quant_max: int, symmetric: bool, zero_point_sym: int = 0,
                float_qparams: bool = False, eps: float = FLOAT32_EPS):
    """torch's scale / zero point for the range [0, amax] (amax >= 0)."""
    if float_qparams:
        scale = amax / (quant_max - quant_min)
        return (scale if scale > eps else 1.0), 0.0
    if symmetric:
        return max(amax / ((quant_max - quant_min) / 2), eps), float(zero_point_sym)
    scale = max(amax / (quant_max - quant_min), eps)
    return scale, float(min(max(quant_min - round(0.0 / scale), quant_min), quant_max))


def quant_error_ref(hist, edges, scale, zero_point, *, quant_min, quant_max) -> float:
    """sum_j h_j (dequant(quant(c_j)) - c_j)**2 / sum_j h_j over the bin centers c_j."""
    h = np.asarray(hist, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    if h.sum() <= 0:
        return 0.0
    c = (e[1:] + e[:-1]) / 2
    q = np.clip(np.round(c / scale) + zero_point, quant_min, quant_max)  # np.round: half to even
    return float(np.sum(h * ((q - zero_point) * scale - c) ** 2) / h.sum())


def mse_errors_ref(hist, edges, *, quant_min, quant_max, symmetric, zero_point_sym=0, float_qparams=False,
                   start_bin, stride=1):
    """``[(k, amax_k, E_k)]`` for candidate centers k = start_bin, start_bin + stride, ..., < bins."""
    e = np.asarray(edges, dtype=np.float64)
    centers = (e[1:] + e[:-1]) / 2
    out = []
    for k in range(start_bin, centers.size, stride):
        scale, zp = qparams_ref(centers[k], quant_min=quant_min, quant_max=quant_max, symmetric=symmetric,
                                zero_point_sym=zero_point_sym, float_qparams=float_qparams)
        out.append((k, centers[k], quant_error_ref(hist, edges, scale, zp, quant_min=quant_min, quant_max=quant_max)))
    return out


# --- percentile --------------------------------------------------------------------------------


def percentile_range_ref(hist, edges, *, percentile, symmetric=True):
    h = np.asarray(hist, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    total = float(h.sum())
    keep = percentile / 100 if symmetric else 1 - (100 - percentile) / 200
    cum, hi = 0.0, float(e[-1])
    for i, c in enumerate(h):
        cum += c
        if cum >= keep * total:
            hi = float(e[i])  # left edge of the bin where the cumulative count reaches the target
            break
    if symmetric:
        return 0.0, hi
    cum, lo = 0.0, float(e[0])
    for r in range(h.size):  # the mirror image, from the top
        cum += h[h.size - 1 - r]
        if cum >= keep * total:
            lo = float(e[h.size - r])
            break
    return lo, hi
