"""Helpers of ``test_adversarial_stateful.py``: the observer classes, their configurations, adversarial
batches, backend conversion, bitwise comparison and float64/NumPy shadow models.

A batch is described by ``(kind, seed, shape, dtype)`` and built on the host by :func:`make_batch`, so
every backend sees the same values (float16/bfloat16/float64 batches are rounded on the host first;
array_api_strict, which has no float16/bfloat16, gets the exact float32 upcast of those values).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
from typing import Any, Callable

import ml_dtypes
import numpy as np

BACKENDS = ("numpy", "array_api_strict", "torch", "jax")
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32; below it XLA:CPU flushes to zero

#: the array module of each family (numpy / array_api_strict use these classes directly).
_ARRAY_MODULES = {
    "observers": "observers_core.adapters._array_observers",
    "histogram": "observers_core.adapters._array_histogram",
    "calibration": "observers_core.adapters._array_calibration",
    "lowbit": "observers_core.adapters._array_lowbit",
}

# ------------------------------------------------------------------------------------------ batches

KINDS = (
    "normal", "small", "large", "float32_max", "subnormal", "zeros", "nan", "inf", "dead_channel", "wide",
    "mixed", "constant",
)
#: each accepted (shape, dtype) pair costs JAX one compilation (~1-2 s for the histogram observers),
#: so the lists are short.
DTYPES = ("float32", "float32", "float32", "float64", "float16", "bfloat16", "int8", "int32", "bool", "complex64")


def make_batch(kind: str, seed: int, shape: tuple[int, ...], dtype: str, ch_axis: int | None = None) -> np.ndarray:
    """An adversarial host batch: float32 values of ``kind`` rounded to ``dtype`` (bool/complex: the
    rejected dtypes; ints: in their own range)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == "int8":
        return rng.integers(-128, 128, size=shape).astype(np.int8)
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    if dtype == "int32":
        lim = 2**31 - 1 if kind in ("large", "float32_max", "wide") else 1000
        return rng.integers(-lim, lim, size=shape, dtype=np.int64).astype(np.int32)
    if kind == "normal":
        v = rng.standard_normal(n)
    elif kind == "small":
        v = rng.standard_normal(n) * 1e-3
    elif kind == "large":
        v = rng.uniform(-1, 1, n) * 3e38
    elif kind == "float32_max":
        v = rng.choice([-F32_MAX, F32_MAX, 0.5 * F32_MAX, -0.999 * F32_MAX, 1.0], n)
    elif kind == "subnormal":
        v = rng.uniform(-1, 1, n) * 1e-39  # float32 subnormals (and signed zeros after rounding)
    elif kind == "zeros":
        v = np.zeros(n)
    elif kind == "nan":
        v = rng.standard_normal(n)
        v[rng.integers(0, max(n, 1)) if n else slice(0)] = np.nan
    elif kind == "inf":
        v = rng.standard_normal(n)
        v[rng.integers(0, max(n, 1)) if n else slice(0)] = rng.choice([np.inf, -np.inf])
    elif kind == "dead_channel":
        v = np.maximum(rng.standard_normal(n), 0.0)  # ReLU output; channel 0 all zeros below
    elif kind == "wide":
        v = np.linspace(-3000.0, 3000.0, n) * rng.uniform(0.5, 2)
    elif kind == "mixed":
        v = rng.choice([0.0, -0.0, 1e-39, -1e-39, 1.0, -2.5, 3e38, -3e38, 65504.0, 1e-8], n)
    elif kind == "constant":
        v = np.full(n, rng.choice([0.0, 1.0, -7.25, 1e-40, 3e38]))
    else:
        raise AssertionError(kind)
    a = v.astype(np.float32).reshape(shape)
    if kind == "dead_channel" and a.size:
        axis = 0 if ch_axis is None or a.ndim == 0 else ch_axis % max(a.ndim, 1)
        if a.ndim:
            idx = [slice(None)] * a.ndim
            idx[axis] = 0
            a[tuple(idx)] = 0.0
    if dtype == "float32":
        return a
    if dtype == "float64":
        return a.astype(np.float64)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16)
    if dtype == "bfloat16":
        return a.astype(ml_dtypes.bfloat16)
    if dtype == "complex64":
        return a.astype(np.complex64)
    raise AssertionError(dtype)


def to_backend(backend: str, a: np.ndarray) -> Any:
    """The host batch ``a`` as an array of ``backend`` with the same values."""
    if backend == "numpy":
        return a
    if backend == "array_api_strict":
        import array_api_strict as xps

        if a.dtype.name in ("float16", "bfloat16"):  # not array-API dtypes: the exact float32 upcast
            a = a.astype(np.float32)
        return xps.asarray(a)
    if backend == "torch":
        import torch

        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())
    if backend == "jax":
        import jax.numpy as jnp

        if a.dtype == np.float64:  # JAX without x64 would round it; the values are float32 already
            a = a.astype(np.float32)
        return jnp.asarray(a)
    raise AssertionError(backend)


def to_host(a: Any) -> np.ndarray:
    """Any backend's array (or scalar) as a numpy array with the same bits."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch

        # a copy first: .numpy() on a live buffer pins its storage (torch then cannot resize it)
        t = a.detach().cpu().clone()

        if t.dtype == torch.bfloat16:
            return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy().copy()
    if mod.startswith("array_api_strict"):
        import array_api_strict

        return np.asarray(array_api_strict.asarray(a, copy=True)._array)
    return np.array(a, copy=True)


# ------------------------------------------------------------------------------------------ comparison


def _canonical(a: np.ndarray, *, state: bool) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = a.copy()
        a[np.isnan(a)] = np.nan  # one NaN payload
        if state:
            a[a == 0] = 0.0  # the sign of a zero min/max depends on the reduction order (docs/exactness.md)
    return a


def bits_differ(a: Any, b: Any, *, state: bool = True, ftz: bool = False, narrow: bool = False) -> str | None:
    """``None`` when ``a`` and ``b`` hold the same bits (one NaN; with ``state`` +0 == -0); else why not.

    ``ftz``: ``b`` may hold zero where ``a`` holds a float32 subnormal (XLA:CPU flushes them).
    ``narrow``: ``b`` may be float32 where ``a`` is float64 (JAX without x64), compared after rounding.
    Integer arrays (zero points) compare by value: int32 vs int64 is a documented difference.
    """
    a, b = np.asarray(to_host(a)), np.asarray(to_host(b))
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if narrow and a.dtype == np.float64 and b.dtype == np.float32:
        a = a.astype(np.float32)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        bad = a.astype(np.int64) != b.astype(np.int64)
    else:
        if a.dtype != b.dtype:
            return f"dtype {a.dtype} != {b.dtype}"
        ca, cb = _canonical(a, state=state), _canonical(b, state=state)
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        bad = ca.view(width) != cb.view(width)
        if ftz and a.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                sub = (np.abs(a) < F32_TINY) & (a != 0)
                # flushed operands: any result of a computation on flushed values differs in the
                # low bits at most where the reference is tiny
                bad &= ~(sub & (b == 0))
    if np.any(bad):
        return f"values differ at {np.argwhere(np.atleast_1d(bad))[:4].tolist()}: {a!r} vs {b!r}"
    return None


# ------------------------------------------------------------------------------------------ shadows


def _batch_range(a: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """float64 min/max of the batch (NaN propagates), per tensor or per channel along ``axis``."""
    a = np.asarray(a, dtype=np.float64) if a.dtype != ml_dtypes.bfloat16 else a.astype(np.float64)
    if axis is None:
        return np.min(a), np.max(a)
    if a.ndim == 1:
        return a.copy(), a.copy()
    other = tuple(i for i in range(a.ndim) if i != axis % a.ndim)
    return np.min(a, axis=other), np.max(a, axis=other)


def _f32(v: Any) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(v, dtype=np.float64).astype(np.float32)


class RunningMinMaxShadow:
    """``x_min = min(x_min, min(X))`` (NaN poisons, inf counts) in float64, rounded to float32."""

    def __init__(self, axis: int | None) -> None:
        self.axis, self.lo, self.hi = axis, None, None

    def update(self, a: np.ndarray) -> None:
        lo, hi = _batch_range(a, self.axis)
        if self.lo is None or np.shape(self.lo) != np.shape(lo):
            self.lo, self.hi = lo, hi
        else:
            self.lo, self.hi = np.minimum(self.lo, lo), np.maximum(self.hi, hi)

    def expected(self) -> dict[str, np.ndarray] | None:
        return None if self.lo is None else {"min_val": _f32(self.lo), "max_val": _f32(self.hi)}

    def sync(self, sd: dict[str, np.ndarray]) -> None:
        lo, hi = np.asarray(sd["min_val"], np.float64), np.asarray(sd["max_val"], np.float64)
        self.lo, self.hi = (None, None) if lo.shape == (0,) else (lo, hi)


class MovingAverageShadow(RunningMinMaxShadow):
    """torch's ``x_min = x_min + c * (min(X) - x_min)`` in float32 (the first batch sets the range)."""

    def __init__(self, axis: int | None, c: float) -> None:
        super().__init__(axis)
        self.c = np.float32(c)

    def update(self, a: np.ndarray) -> None:
        lo, hi = (_f32(v) for v in _batch_range(a, self.axis))
        with np.errstate(invalid="ignore", over="ignore"):
            if self.lo is None:
                self.lo, self.hi = lo, hi
                return
            lo0, hi0 = _f32(self.lo), _f32(self.hi)
            fresh = (lo0 == np.inf) & (hi0 == -np.inf)  # never updated (not min_val = +inf from an overflow)
            self.lo = np.where(fresh, lo, lo0 + np.float32(self.c * (lo - lo0)))
            self.hi = np.where(fresh, hi, hi0 + np.float32(self.c * (hi - hi0)))


class HistogramRangeShadow(RunningMinMaxShadow):
    """The HistogramObserver's range: running min/max of the finite values; a NaN makes both NaN for good."""

    def update(self, a: np.ndarray) -> None:
        a = np.asarray(a).astype(np.float64)
        if self.lo is not None and np.isnan(self.lo):
            return
        if np.isnan(a).any():
            self.lo = self.hi = np.float64(np.nan)
            return
        fin = a[np.isfinite(a)]
        if fin.size:
            lo, hi = fin.min(), fin.max()
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)

    def expected(self) -> dict[str, np.ndarray] | None:
        if self.lo is None:
            return {"min_val": np.float32(np.inf), "max_val": np.float32(-np.inf)}
        return super().expected()


class GroupShadow(RunningMinMaxShadow):
    """Low-bit per-group (``group_size`` along ``axis``; per tensor when ``axis is None``) stats merged with
    ``minmax`` (static) or the last batch's (dynamic); a batch's stats are float32 (float64 for a float64
    batch) and are cast to the state's dtype when merged (a float64 first batch, or a float64 batch in
    dynamic mode, gives a float64 state; an int32 batch merged into it brings float32-rounded stats)."""

    def __init__(self, axis: int | None, group_size: int | None, dynamic: bool) -> None:
        super().__init__(axis)
        self.group_size, self.dynamic, self.dtype = group_size, dynamic, np.float32

    def update(self, a: np.ndarray) -> None:
        dtype = np.float64 if a.dtype == np.float64 else np.float32
        x = a.astype(np.float64)
        if self.axis is None:
            lo, hi = x.min(), x.max()
        else:
            ax = self.axis % x.ndim
            n = x.shape[ax]
            g = n if self.group_size in (None, -1) else self.group_size
            x = np.moveaxis(x, ax, -1)
            x = x.reshape(x.shape[:-1] + (n // g, g))
            lo, hi = np.moveaxis(x.min(-1), -1, ax), np.moveaxis(x.max(-1), -1, ax)
        with np.errstate(over="ignore"):  # the batch's statistics in its own dtype, then merged
            lo, hi = np.asarray(lo).astype(dtype).astype(np.float64), np.asarray(hi).astype(dtype).astype(np.float64)
        if self.dynamic or self.lo is None:
            self.lo, self.hi, self.dtype = lo, hi, dtype
        else:
            assert np.shape(lo) == np.shape(self.lo), "accepted statistics of another shape"
            self.lo, self.hi = np.minimum(self.lo, lo), np.maximum(self.hi, hi)  # the state keeps its dtype

    def expected(self) -> dict[str, np.ndarray] | None:
        if self.lo is None:
            return {"min_val": np.zeros((0,), np.float32), "max_val": np.zeros((0,), np.float32)}
        with np.errstate(over="ignore"):
            return {"min_val": np.asarray(self.lo).astype(self.dtype), "max_val": np.asarray(self.hi).astype(self.dtype)}

    def sync(self, sd: dict[str, np.ndarray]) -> None:
        super().sync(sd)
        self.dtype = np.asarray(sd["min_val"]).dtype


# ------------------------------------------------------------------------------------------ classes


@dataclasses.dataclass(frozen=True)
class ClassSpec:
    """One public observer class: its family module, configurations to draw from, the batch shapes to
    draw from (valid and invalid mixed: the observers decide, all backends must agree), its channel axis,
    its shadow model and its torch.ao counterpart."""

    name: str
    family: str
    configs: tuple[dict, ...]
    shapes: Callable[[dict], tuple[tuple[int, ...], ...]]
    ch_axis: Callable[[dict], int | None] = lambda cfg: None
    shadow: Callable[[dict], Any] | None = None
    torch_ao: bool = False
    resettable: bool = True


def _pt_shapes(cfg: dict) -> tuple[tuple[int, ...], ...]:
    return ((4, 8), (8,), (), (0,))


def _pc_shapes(cfg: dict) -> tuple[tuple[int, ...], ...]:
    a = cfg.get("ch_axis", 0)
    if a == 0:  # 3 channels; (4, 5): another count; (3,): 1-d, one element per channel
        return ((3, 5), (3,), (4, 5), (3, 0))
    return ((2, 3), (3,), (2, 4), (2, 0))  # ch_axis=1: (3,) has no axis 1


def _calib_ch(cfg: dict) -> int | None:
    a = cfg.get("ch_axis", -1)
    return None if a < 0 else a


def _calib_shapes(cfg: dict) -> tuple[tuple[int, ...], ...]:
    return _pt_shapes(cfg) if _calib_ch(cfg) is None else _pc_shapes(cfg)


def _mm_shadow(cfg):
    return RunningMinMaxShadow(None)


def _pc_shadow(cfg):
    return RunningMinMaxShadow(cfg.get("ch_axis", 0))


def _ma_shadow(cfg):
    return MovingAverageShadow(None, cfg.get("averaging_constant", 0.01))


def _mapc_shadow(cfg):
    return MovingAverageShadow(cfg.get("ch_axis", 0), cfg.get("averaging_constant", 0.01))


_PC = dict(qscheme="per_channel_affine")
_PCS = dict(dtype="qint8", qscheme="per_channel_symmetric")

CLASSES: dict[str, ClassSpec] = {
    s.name: s
    for s in (
        ClassSpec(
            "MinMaxObserver", "observers",
            ({}, dict(dtype="qint8", qscheme="per_tensor_symmetric"), dict(reduce_range=True),
             dict(quant_min=0, quant_max=15)),
            _pt_shapes, shadow=_mm_shadow, torch_ao=True,
        ),
        ClassSpec(
            "MovingAverageMinMaxObserver", "observers",
            ({}, dict(averaging_constant=0.5, dtype="qint8", qscheme="per_tensor_symmetric"), dict(averaging_constant=1.0)),
            _pt_shapes, shadow=_ma_shadow, torch_ao=True,
        ),
        ClassSpec(
            "PerChannelMinMaxObserver", "observers",
            (dict(ch_axis=0), dict(ch_axis=1, **_PCS), dict(ch_axis=0, qscheme="per_channel_affine_float_qparams")),
            _pc_shapes, ch_axis=lambda c: c["ch_axis"], shadow=_pc_shadow, torch_ao=True,
        ),
        ClassSpec(
            "MovingAveragePerChannelMinMaxObserver", "observers",
            (dict(ch_axis=0), dict(ch_axis=1, averaging_constant=0.25, **_PCS)),
            _pc_shapes, ch_axis=lambda c: c["ch_axis"], shadow=_mapc_shadow, torch_ao=True,
        ),
        ClassSpec(
            "FixedQParamsObserver", "observers",
            (dict(scale=1.0 / 256.0, zero_point=0), dict(scale=2.0 / 256.0, zero_point=128)),
            _pt_shapes, torch_ao=True, resettable=False,
        ),
        ClassSpec(
            "HistogramObserver", "histogram",
            (dict(bins=128), dict(bins=64, dtype="qint8", qscheme="per_tensor_symmetric")),
            _pt_shapes, shadow=lambda cfg: HistogramRangeShadow(None), torch_ao=True,
            resettable=False,  # torch.ao's HistogramObserver.reset_min_max_vals raises NotImplementedError; ours too
        ),
        ClassSpec(
            "KLObserver", "calibration",
            (dict(bins=256), dict(bins=256, update_interval=2, averaging_constant=0.5), dict(bins=256, ch_axis=0, qscheme="per_channel_symmetric")),
            _calib_shapes, ch_axis=_calib_ch,
        ),
        ClassSpec(
            "MSEObserver", "calibration",
            (dict(bins=256), dict(bins=256, stride=4, ch_axis=1, qscheme="per_channel_symmetric")),
            _calib_shapes, ch_axis=_calib_ch,
        ),
        ClassSpec(
            "PercentileObserver", "calibration",
            (dict(bins=256), dict(bins=256, percentile=90.0, averaging_constant=1.0, ch_axis=0, qscheme="per_channel_symmetric")),
            _calib_shapes, ch_axis=_calib_ch,
        ),
        ClassSpec(
            "MixObserver", "calibration",
            (dict(bins=256), dict(bins=256, ch_axis=0, qscheme="per_channel_symmetric")),
            _calib_shapes, ch_axis=_calib_ch,
        ),
        ClassSpec(
            "PerGroupMinMaxObserver", "lowbit",
            (dict(group_size=4), dict(dtype="int8", group_size=4, symmetric=True), dict(group_size=4, is_dynamic=True)),
            lambda cfg: ((3, 8), (3, 8), (2, 8), (3, 6), (0, 8)),
            shadow=lambda cfg: GroupShadow(-1, cfg["group_size"], cfg.get("is_dynamic", False)),
        ),
        ClassSpec(
            "FP8Observer", "lowbit",
            ({}, dict(dtype="float8_e5m2")),
            lambda cfg: ((4, 8), (8,), (0,)),
            shadow=lambda cfg: GroupShadow(None, None, False),
        ),
        ClassSpec(
            "PerBlockMXObserver", "lowbit",
            ({}, dict(dtype="mxfp4", rounding="even")),
            lambda cfg: ((2, 32), (2, 32), (3, 32), (2, 40), (2, 0)),
        ),
        ClassSpec(
            "PerBlockBFPObserver", "lowbit",
            ({},),
            lambda cfg: ((2, 8), (2, 16), (3, 8), (2, 12), (0, 8)),
        ),
    )
}


def make_observer(backend: str, spec: ClassSpec, cfg: dict) -> Any:
    """``spec``'s class on ``backend`` built from ``cfg`` (the same names on every backend)."""
    if backend in ("numpy", "array_api_strict"):
        cls = getattr(importlib.import_module(_ARRAY_MODULES[spec.family]), spec.name)
        if backend == "array_api_strict":
            import array_api_strict

            return cls(**cfg, xp=array_api_strict)
        return cls(**cfg)
    mod = importlib.import_module(f"observers_core.adapters.{backend}")
    return getattr(mod, spec.name)(**cfg)


def make_torch_ao(spec: ClassSpec, cfg: dict) -> Any:
    """torch.ao's own observer with ``cfg`` (names turned into torch dtypes/qschemes)."""
    import torch
    from torch.ao.quantization import observer as tao

    kw = dict(cfg)
    for key in ("dtype", "qscheme"):
        if key in kw:
            kw[key] = getattr(torch, kw[key])
    return getattr(tao, spec.name)(**kw)


def state_of(obs: Any) -> dict[str, np.ndarray]:
    """The observer's state_dict as host arrays (keys in order)."""
    return {k: to_host(v) for k, v in obs.state_dict().items()}


def clone(obs: Any, how: str) -> Any:
    """``copy.deepcopy`` or a pickle round trip of ``obs``."""
    if how == "deepcopy":
        return copy.deepcopy(obs)
    return pickle.loads(pickle.dumps(obs))
