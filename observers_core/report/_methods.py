"""One calibration of one tensor: each method through the core functions the observers use.

A *case* is ``(format, granularity, method)``. Uniform 8-bit formats (``int8``: ``qint8`` symmetric,
``uint8``: ``quint8`` affine, torch's ``QuantSpec``) take every method of :data:`UNIFORM_METHODS`;
``histogram`` (torch's HistogramObserver) is per tensor only. The low-bit formats (int4/uint4, per
group int8/uint8, fp8, MX, BFP) are min/max observers (Quark's) and take ``minmax`` only:
``lowbit_stats`` -> ``lowbit_qparams`` -> ``lowbit_fake_quantize``.

Methods on a list of batches ``X_1..X_B`` (a file's tensor is one batch):

- ``minmax``: :func:`observers_core.minmax_update` over the batches, :func:`minmax_qparams`;
- ``moving_average``: :func:`moving_average_update` (``c = 0.01``, torch's default; the first batch
  initialises, so one batch equals ``minmax``), :func:`moving_average_qparams`;
- ``histogram``: :func:`histogram_init` (2048 bins) / :func:`histogram_update` / :func:`histogram_qparams`
  (torch's L2 search); NaN gives an error as torch's observer raises;
- ``kl``, ``mse``, ``percentile``, ``mix``: the array calibration observers
  (``observers_core.adapters._array_calibration``: Horizon's ``observer_v2`` with their defaults), which
  call :func:`kl_threshold`, :func:`mse_threshold`, :func:`percentile_range` and, for ``mix``, the direct
  fake-quantization error of each candidate;
- ``mse_grid``, ``imatrix_mse`` (:data:`LLM_METHODS`, not in the default set): llm-compressor's MSE grid
  search (``memoryless_mse``) and its importance-weighted one (``imatrix_mse``: error times normalised
  ``E[x^2]`` per input channel of the layer ``inputs``; without them, llm-compressor's fallback, the uniform
  search) through :mod:`observers_core.families.llm` (:func:`llm_config`), on the formats of
  :data:`LLM_FORMATS`; each batch's searched range kept as a running min/max.
- ``nvfp4`` (E2M1 in blocks of 16, E4M3 block scales, float32 global scale ``448 * 6 / amax``) is an LLM
  family format: ``minmax`` and both LLM methods, per block of the last axis.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

import observers_core as oc
from observers_core.families import calibration

UNIFORM_METHODS = ("minmax", "moving_average", "histogram", "kl", "mse", "percentile", "mix")
#: the default methods
METHODS = UNIFORM_METHODS
#: the LLM family's searches (opt-in: ``--methods mse_grid,imatrix_mse`` or ``all``)
LLM_METHODS = ("mse_grid", "imatrix_mse")
ALL_METHODS = METHODS + LLM_METHODS
UNIFORM_FORMATS = {"int8": ("qint8", "symmetric"), "uint8": ("quint8", "affine")}
FORMATS = (("int8", "uint8", "int4", "uint4", "float8_e4m3fn", "float8_e5m2") + tuple(oc.MX_DTYPES) + oc.BFP_DTYPES
           + ("nvfp4",))
#: formats the LLM family computes: :class:`observers_core.families.llm.Config` fields (the strategy of
#: block formats is fixed; the others take the case's granularity)
LLM_FORMATS: dict[str, dict[str, Any]] = {
    "int8": {"num_bits": 8}, "uint8": {"num_bits": 8, "symmetric": False},
    "int4": {"num_bits": 4}, "uint4": {"num_bits": 4, "symmetric": False},
    "float8_e4m3fn": {"num_bits": 8, "type": "float"},
    "mxfp4": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "scale_dtype": "uint8",
              "zp_dtype": "uint8"},
    "mxfp8_e4m3": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32, "scale_dtype": "uint8",
                   "zp_dtype": "uint8"},
    "nvfp4": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
              "scale_dtype": "float8_e4m3fn"},
}
_LLM_STRATEGY = {"per_tensor": "tensor", "per_channel": "channel", "per_group": "group"}
_LLM_SEARCH = {"minmax": None, "mse_grid": "mse", "imatrix_mse": "imatrix"}
GRANULARITIES = ("per_tensor", "per_channel", "per_group")
MOVING_AVERAGE_CONSTANT = 0.01
HISTOGRAM_BINS = 2048
#: A magnitude past every format's range: ``fq(+-BIG)`` is the saturation value of each element.
BIG = 1e30


@dataclass(frozen=True)
class Case:
    """One way to quantize a tensor: ``format``, ``granularity`` (``per_block`` for MX/BFP), ``method``."""

    format: str
    granularity: str
    method: str


@dataclass
class Calibrated:
    """What a case gives: the range, qparams (numpy) and the fake-quantized tensor (backend array)."""

    range_min: np.ndarray
    range_max: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    exponent: np.ndarray | None
    fq: Any
    saturation: Any
    seconds: float
    note: str = ""
    #: integer formats: ``(fq(+BIG) - fq(-BIG)) / (Q_max - Q_min)``, the scale of each element
    step: Any = None


def cases_for(shape: tuple[int, ...], formats: tuple[str, ...], granularities: tuple[str, ...],
              methods: tuple[str, ...], group_size: int) -> tuple[list[Case], list[str]]:
    """The cases that apply to a tensor of ``shape``, and a note for each one left out."""
    cases, skipped = [], []
    ndim = len(shape)
    for fmt in formats:
        if fmt in oc.MX_DTYPES or fmt in oc.BFP_DTYPES or fmt == "nvfp4":
            block = LLM_FORMATS.get(fmt, {}).get("group_size")
            llm_ok = block is not None and shape[-1] % block == 0
            if block is not None and not llm_ok:
                skipped.append(f"{fmt} LLM methods: last axis {shape[-1]} is not a multiple of the block {block}")
            for m in methods:
                if (m == "minmax" and fmt != "nvfp4") or (m in _LLM_SEARCH and llm_ok):
                    cases.append(Case(fmt, "per_block", m))
            continue
        for gran in granularities:
            if gran == "per_channel" and ndim < 2:
                skipped.append(f"{fmt} per_channel: a {ndim}-d tensor has no channel axis")
                continue
            if gran == "per_group":
                if shape[-1] % group_size:
                    skipped.append(f"{fmt} per_group: last axis {shape[-1]} is not a multiple of --group-size {group_size}")
                    continue
            uniform = fmt in UNIFORM_FORMATS and gran != "per_group"
            for m in methods:
                if m in LLM_METHODS:
                    if fmt in LLM_FORMATS:
                        cases.append(Case(fmt, gran, m))
                    continue
                if not uniform and m != "minmax":
                    continue
                if m == "histogram" and gran != "per_tensor":
                    continue
                cases.append(Case(fmt, gran, m))
    return cases, skipped


def host_numpy(a: Any) -> np.ndarray:
    """A backend array as numpy (torch, cupy, jax, numpy)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
    if hasattr(a, "get"):
        a = a.get()
    return np.asarray(a)


def quant_spec_of(fmt: str, granularity: str) -> oc.QuantSpec:
    """torch's ``QuantSpec`` of a uniform format: ``int8`` -> qint8 symmetric, ``uint8`` -> quint8 affine."""
    dtype, kind = UNIFORM_FORMATS[fmt]
    scope = "per_tensor" if granularity == "per_tensor" else "per_channel"
    return oc.quant_spec(dtype, f"{scope}_{kind}")


#: Horizon ``observer_v2``'s defaults: the moving average's constant; KL's bins (512), the others' (2048)
CALIBRATION_AVERAGING, CALIBRATION_BINS = 0.01, {"kl": 512, "mse": 2048, "percentile": 2048, "mix": 2048}


def calibration_config(method: str, fmt: str, granularity: str) -> Any:
    """The calibration family's configuration (Horizon ``observer_v2``'s defaults) of a uniform case."""
    spec = quant_spec_of(fmt, granularity)
    config, _ = calibration.make_config(
        "observers-core report", method, dtype=spec.dtype, qscheme=spec.qscheme, quant_min=None, quant_max=None,
        ch_axis=-1 if granularity == "per_tensor" else 0, averaging_constant=CALIBRATION_AVERAGING,
        bins=CALIBRATION_BINS[method],
    )
    return config


def _uniform(case: Case, batches: list[Any], xp: Any) -> tuple[Any, Any, Any, Any, str]:
    """``(range_min, range_max, scale, zero_point, note)`` of a uniform case."""
    spec = quant_spec_of(case.format, case.granularity)
    axis = None if case.granularity == "per_tensor" else 0
    channels = None if axis is None else batches[0].shape[0]
    note = ""
    if case.method in ("minmax", "moving_average"):
        if case.method == "minmax":
            state = oc.minmax_init(num_channels=channels, xp=xp)
            for b in batches:
                state = oc.minmax_update(state, b, axis=axis, xp=xp)
            q = oc.minmax_qparams(state, spec, xp=xp)
        else:
            state = oc.moving_average_init(num_channels=channels, xp=xp)
            for b in batches:
                state = oc.moving_average_update(state, b, averaging_constant=MOVING_AVERAGE_CONSTANT, axis=axis, xp=xp)
            q = oc.moving_average_qparams(state, spec, xp=xp)
        return state.min_val, state.max_val, q.scale, q.zero_point, note
    if case.method == "histogram":
        state = oc.histogram_init(bins=HISTOGRAM_BINS, xp=xp)
        for b in batches:
            state = oc.histogram_update(state, b, xp=xp)
        if bool(np.isnan(host_numpy(state.min_val))):
            raise ValueError("NaN in the input: torch's HistogramObserver raises (ignore_nonfinite=True skips it)")
        q = oc.histogram_qparams(state, spec, xp=xp)
        zpf = xp.astype(q.zero_point, q.scale.dtype)
        lo, hi = (spec.quant_min - zpf) * q.scale, (spec.quant_max - zpf) * q.scale
        return lo, hi, q.scale, q.zero_point, note  # range: the quantizer's [qmin, qmax] after the L2 search
    config = calibration_config(case.method, case.format, case.granularity)  # the family's steps, as every
    state = calibration.init(config, num_channels=channels, device=array_api_compat.device(batches[0]), xp=xp)
    last_choice = None  # adapter's observers take them
    for b in batches:
        if case.method == "mix":  # (batch_update: the state and the Mix pick)
            state, last_choice = calibration.batch_update(state, b, axis=axis, config=config,
                                                                xp=array_api_compat.array_namespace(b))
        else:
            state = calibration.update(config, state, b, axis=axis)
    q = calibration.qparams(config, state)
    if last_choice is not None:
        picks = host_numpy(last_choice).reshape(-1)
        note = "mix: " + ",".join(sorted({calibration.MIX_CANDIDATES[int(i)] for i in picks}))
    rng = state.range if isinstance(state, calibration.KLState) else state
    return rng.min_val, rng.max_val, q.scale, q.zero_point, note


def llm_config(case: Case, group_size: int) -> Any:
    """The LLM family's :class:`~observers_core.families.llm.Config` of an LLM case (``mode="static"``)."""
    from observers_core.families import llm

    fields = dict(LLM_FORMATS[case.format])
    if "strategy" not in fields:
        fields["strategy"] = _LLM_STRATEGY[case.granularity]
        if case.granularity == "per_group":
            fields["group_size"] = group_size
    return llm.Config(**fields, mode="static", search=_LLM_SEARCH[case.method])


def _as_weight(a: Any, granularity: str, xp: Any) -> Any:
    """The 2-D ``(rows, cols)`` view the LLM family observes: rows = axis 0 per channel, else the last
    axis is the columns (groups, blocks)."""
    if granularity == "per_channel":
        return xp.reshape(a, (a.shape[0], -1))
    return xp.reshape(a, (-1, a.shape[-1]))


def _llm(case: Case, batches: list[Any], x: Any, xp: Any, group_size: int, inputs: list[Any] | None
         ) -> Calibrated:
    """An LLM-family case: ``llm.update`` per batch, ``llm.qparams``, ``llm.fake_quantize``; ``imatrix_mse``
    weights the error by ``llm.importance_weights`` of ``inputs`` (the layer's inputs)."""
    import array_api_compat

    from observers_core.families import llm

    cfg = llm_config(case, group_size)
    if cfg.strategy in ("group", "tensor_group"):
        batches = [x]  # per element position: the tensor's own groups/blocks, as the other group formats
    note, weights = "", None
    start = time.perf_counter()
    if cfg.search == "imatrix":
        w2 = _as_weight(x, case.granularity, xp)
        imp = llm.importance_init(w2.shape[1], device=array_api_compat.device(w2), xp=xp)
        for b in inputs or []:
            imp = llm.importance_update(imp, b, xp=xp)  # a channel count other than the columns: ValueError
        weights, reason = llm.importance_weights(imp, cfg, tuple(w2.shape), xp=xp)
        note = f"uniform MSE: {reason}" if weights is None else "weighted by E[x^2] of the layer inputs"
    state = None
    for b in batches:
        o = llm.flatten(_as_weight(b, case.granularity, xp), cfg, xp=xp)
        if state is None:
            state = llm.init(cfg, qparam_shape=tuple(o.shape[1:-1]), dtype=o.dtype, xp=xp)
        state = llm.update(cfg, state, o, weights=weights, xp=xp)
    qp = llm.qparams(cfg, state, xp=xp)
    result = [host_numpy(state.min_vals), host_numpy(state.max_vals), host_numpy(qp.scale)]
    seconds = time.perf_counter() - start
    if qp.global_scale is not None:
        note = (note + "; " if note else "") + f"global scale {float(host_numpy(qp.global_scale)[0]):.6g}"

    def fq(a: Any) -> Any:
        o = llm.flatten(_as_weight(a, case.granularity, xp), cfg, xp=xp)
        shape = (1, *o.shape[1:-1], 1)
        zp = None if cfg.symmetric else xp.reshape(xp.astype(qp.zero_point, o.dtype), shape)
        out = llm.fake_quantize(o, xp.reshape(qp.scale, shape), zp, cfg, global_scale=qp.global_scale, xp=xp)
        return xp.reshape(out, a.shape)

    ones = xp.ones_like(x) * BIG
    step = None
    if cfg.type == "int":
        qmin, qmax = llm.quant_range(cfg)
        step = (fq(ones) - fq(-ones)) / (qmax - qmin)
    zp = host_numpy(qp.zero_point).astype(np.int64) if cfg.type == "int" else None
    return Calibrated(*result, zp, None, fq(x), fq(xp.where(x >= 0, ones, -ones)), seconds, note, step)


def calibrate(case: Case, batches: list[Any], x: Any, xp: Any, group_size: int, *,
              inputs: list[Any] | None = None) -> Calibrated:
    """Run ``case`` on ``batches`` (timed: statistics and qparams), then fake-quantize ``x``; ``inputs``:
    the layer's inputs (``imatrix_mse``)."""
    if case.method in LLM_METHODS or case.format == "nvfp4":
        return _llm(case, batches, x, xp, group_size, inputs)
    axis = None if case.granularity == "per_tensor" else 0
    ones = xp.ones_like(x) * BIG
    big = xp.where(x >= 0, ones, -ones)
    start = time.perf_counter()
    if case.format in UNIFORM_FORMATS and case.granularity != "per_group":
        lo, hi, scale, zp, note = _uniform(case, batches, xp)
        spec = quant_spec_of(case.format, case.granularity)
        result = [host_numpy(lo), host_numpy(hi), host_numpy(scale), host_numpy(zp)]  # to host: the backend's work is done
        seconds = time.perf_counter() - start
        kw = dict(quant_min=spec.quant_min, quant_max=spec.quant_max, axis=axis, xp=xp)
        fq = oc.fake_quantize(x, scale, zp, **kw)
        sat = oc.fake_quantize(big, scale, zp, **kw)
        step = (oc.fake_quantize(ones, scale, zp, **kw) - oc.fake_quantize(-ones, scale, zp, **kw)) / (spec.quant_max - spec.quant_min)
        return Calibrated(*result, None, fq, sat, seconds, note, step)
    if case.granularity == "per_block":
        spec = oc.lowbit_spec(case.format)
    elif case.granularity == "per_group":
        spec = oc.lowbit_spec(case.format, axis=-1, group_size=group_size)
    else:
        spec = oc.lowbit_spec(case.format, axis=axis)
    if spec.granularity in ("per_group", "per_block"):
        batches = [x]  # per element position: the tensor's own groups/blocks (dynamic, as MX is used)
    state = oc.lowbit_stats(batches[0], spec, xp=xp)
    for b in batches[1:]:
        state = oc.minmax_merge(state, oc.lowbit_stats(b, spec, xp=xp), xp=xp)
    q = oc.lowbit_qparams(state, spec, xp=xp)
    exponent = host_numpy(q.exponent) if isinstance(q, oc.BlockScale) else None
    zp = None if isinstance(q, oc.BlockScale) else host_numpy(q.zero_point)
    lo, hi, scale = host_numpy(state.min_val), host_numpy(state.max_val), host_numpy(q.scale)
    seconds = time.perf_counter() - start
    fq = oc.lowbit_fake_quantize(x, q, spec, xp=xp)
    sat = oc.lowbit_fake_quantize(big, q, spec, xp=xp)
    step = None
    if case.format in oc.INT_RANGES:
        qmin, qmax = oc.INT_RANGES[case.format]
        step = (oc.lowbit_fake_quantize(ones, q, spec, xp=xp) - oc.lowbit_fake_quantize(-ones, q, spec, xp=xp)) / (qmax - qmin)
    return Calibrated(lo, hi, scale, zp, exponent, fq, sat, seconds, "", step)


def errors(x: np.ndarray, fq: np.ndarray, sat: np.ndarray, step: np.ndarray | None = None) -> tuple[float, float, float]:
    """``(mse, sqnr_db, clipped)`` over the finite values of ``x``: ``mse = mean((fq - x)**2)``,
    ``sqnr = 10 log10(sum x**2 / sum (fq - x)**2)``, ``clipped`` = fraction with ``|x| > |fq(+-BIG)|``
    (past the largest representable magnitude of its tensor/channel/group/block, on its side); for
    integer formats (``step``: each element's scale ``s``) past it by more than ``s / 2``, so values
    that only round to the largest level do not count. For fp8/MX/BFP any value past it counts."""
    x = x.astype(np.float64).reshape(-1)
    fq = fq.astype(np.float64).reshape(-1)
    sat = np.abs(sat.astype(np.float64).reshape(-1))
    if step is not None:
        sat = (sat + 0.5 * np.abs(step.astype(np.float64).reshape(-1))) * (1 + 1e-6)  # float32 ties
    finite = np.isfinite(x)
    if not finite.any():
        return float("nan"), float("nan"), float("nan")
    x, fq, sat = x[finite], fq[finite], sat[finite]
    with np.errstate(all="ignore"):
        d = fq - x
        noise = float(np.sum(d * d))
        signal = float(np.sum(x * x))
        mse = noise / x.size
        if noise == 0.0:
            sqnr = float("inf")
        elif np.isfinite(noise):
            sqnr = 10.0 * np.log10(signal / noise) if signal > 0 else float("-inf")
        else:
            sqnr = float("nan")
        clipped = float(np.mean(np.abs(x) > sat))
    return mse, float(sqnr), clipped
