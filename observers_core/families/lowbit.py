"""The low-bit family: per-group integers, fp8 scaling, OCP MX and BFP16 (Quark, torchao).

The statistics are a :class:`~observers_core.MinMaxState` of per-group arrays (shape: the input's with
``axis`` replaced by the number of groups/blocks; ``()`` per tensor, ``(C,)`` per channel):

- static mode (``is_dynamic=False``): ``state = minmax_merge(state, lowbit_stats(x))`` over every batch;
- dynamic mode (``is_dynamic=True``): ``state = lowbit_stats(x)``, the last batch alone.

``qparams`` is :func:`observers_core.lowbit_qparams`: ``QParams(scale, zero_point)`` for integers and fp8,
``BlockScale(scale, exponent)`` for MX and BFP16. ``merge`` is ``minmax_merge`` in both modes: exactly
the statistics of the concatenated batches (shards of one calibration set, or devices of one step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dtypes import FLOAT32_EPS
from .._lowbit import (
    BFP_DTYPES,
    FP8_MAX,
    INT_RANGES,
    MX_DTYPES,
    LowBitSpec,
    lowbit_fake_quantize,
    lowbit_qparams,
    lowbit_spec,
    lowbit_stats,
)
from .._collective import check_collective, reduce_range
from .._minmax import MinMaxState, minmax_init, minmax_merge
from .._mx import BlockScale, check_block_size
from .._namespace import array_namespace, normalize_axis, size
from .._qparams import UNINITIALIZED_WARNING, QParams
from .._validate import INF, check_bool

__all__ = [
    "Config",
    "State",
    "STATE_KEYS",
    "FAMILY_DTYPES",
    "UNINITIALIZED_WARNING",
    "init",
    "update",
    "merge",
    "qparams",
    "fake_quantize",
    "make_spec",
    "check_axis",
    "observe",
    "unobserved_state",
    "check_fake_quantize_input",
    "check_loaded_stats",
    "describe",
]

Array = Any
State = MinMaxState
#: The state-dict keys of the statistics (torch's names).
STATE_KEYS = ("min_val", "max_val")


#: The dtypes each observer family accepts (``None``: any low-bit dtype).
FAMILY_DTYPES: dict[str, tuple[str, ...]] = {
    "int": tuple(INT_RANGES),
    "fp8": tuple(FP8_MAX),
    "mx": tuple(MX_DTYPES),
    "bfp": tuple(BFP_DTYPES),
}


def make_spec(
    owner: str,
    family: str | None,
    dtype: Any,
    *,
    granularity: str | None = None,
    axis: int | None = None,
    group_size: int | None = None,
    block_size: int | None = None,
    symmetric: bool | None = None,
    rounding: str | None = None,
    eps: float = FLOAT32_EPS,
) -> LowBitSpec:
    """:func:`observers_core.lowbit_spec` for an observer class ``owner`` that takes the dtypes of
    ``family`` only; ``block_size`` is the block formats' name for ``group_size`` (named in errors)."""
    key = dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype
    if family is not None and key not in FAMILY_DTYPES[family]:
        raise ValueError(f"dtype={dtype!r} is not supported by {owner}; allowed: {', '.join(FAMILY_DTYPES[family])}")
    if block_size is not None:
        if group_size is not None:
            raise ValueError(f"give block_size or group_size, not both (got {block_size} and {group_size})")
        group_size = check_block_size(block_size, name="block_size")
    return lowbit_spec(
        key, granularity=granularity, axis=axis, group_size=group_size, symmetric=symmetric, rounding=rounding, eps=eps
    )


def check_axis(x: Array, spec: LowBitSpec) -> None:
    """``ValueError`` naming ``axis`` unless the spec's axis exists in ``x`` (checked for empty inputs too)."""
    if spec.axis is not None:
        normalize_axis(spec.axis, x.ndim)


def observe(state: MinMaxState | None, x: Array, /, *, spec: LowBitSpec, ignore_nonfinite: bool, xp: Any,
            collective: Any = None) -> MinMaxState:
    """``minmax_merge(state, lowbit_stats(x))`` (``state=None``: ``lowbit_stats(x)``, the dynamic mode and
    the first batch). The batch's statistics are cast to the state's dtype; a batch whose statistics
    have another shape than the state's raises ``ValueError`` (shapes are static: safe under jit).

    With a :class:`~observers_core.Collective` the batch statistics are every member's, merged
    elementwise (``x`` must have the same shape on every member: the statistics of per-group and
    per-block specs are positional), which is what observing the members' batches one after another
    gives in the static mode; an empty ``x`` takes part as "nothing seen" once the state exists)."""
    if check_collective(collective) is not None and size(x) == 0 and state is not None:
        new = MinMaxState(xp.full_like(state.min_val, INF), xp.full_like(state.max_val, -INF))  # takes part
    else:
        new = lowbit_stats(x, spec, ignore_nonfinite=ignore_nonfinite, xp=xp)
    if collective is not None:
        new = MinMaxState(*reduce_range(new.min_val, new.max_val, collective))
    if state is None:
        return new
    if tuple(new.min_val.shape) != tuple(state.min_val.shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} gives statistics of shape {tuple(new.min_val.shape)} "
            f"({spec.granularity}, axis={spec.axis}, group_size={spec.group_size}) but the observer holds "
            f"{tuple(state.min_val.shape)}; observe inputs of one shape, or call reset_min_max_vals() first"
        )
    if new.min_val.dtype != state.min_val.dtype:
        new = MinMaxState(xp.astype(new.min_val, state.min_val.dtype), xp.astype(new.max_val, state.max_val.dtype))
    return minmax_merge(state, new, xp=xp)


def unobserved_state(xp: Any, device: Any = None) -> MinMaxState:
    """One entry that has seen nothing (``+inf``/``-inf``): its qparams are the defaults returned before
    any input (integers ``s = 1, z = 0`` as torch; fp8 ``s = eps``; MX/BFP16 code 0)."""
    return minmax_init(num_channels=1, device=device, xp=xp)


def check_fake_quantize_input(x: Array, state: MinMaxState, spec: LowBitSpec) -> None:
    """Per channel: ``ValueError`` unless ``x`` has the state's channel count (the core checks groups
    and blocks itself)."""
    if spec.granularity == "per_channel":
        axis = normalize_axis(spec.axis, x.ndim)
        if (x.shape[axis],) != tuple(state.min_val.shape):
            raise ValueError(
                f"x has {x.shape[axis]} channels along axis={spec.axis} but the observer holds "
                f"{tuple(state.min_val.shape)}"
            )


def check_loaded_stats(lo: np.ndarray, hi: np.ndarray, spec: LowBitSpec, owner: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Validated ``min_val``/``max_val`` (numpy) of a state dict, as float32 (float64 stays float64);
    ``None`` for the never-updated ``(0,)`` entries.

    Checked: equal shapes; ``()`` per tensor, ``(C,)`` per channel, at least one dimension per group or
    block; ``min_val <= max_val`` unless NaN or never updated (``+inf``/``-inf``)."""
    if lo.shape != hi.shape:
        raise ValueError(f"state_dict['min_val'] and ['max_val'] must have one shape for {owner}, got {lo.shape} and {hi.shape}")
    if lo.shape == (0,):
        return None
    ndim_ok = {"per_tensor": lo.ndim == 0, "per_channel": lo.ndim == 1}.get(spec.granularity, lo.ndim >= 1)
    if not ndim_ok:
        raise ValueError(
            f"state_dict['min_val'] of shape {lo.shape} does not fit {owner} ({spec.granularity}); "
            "allowed: () per tensor, (C,) per channel, the input's shape with the axis grouped otherwise"
        )
    dtype = np.float64 if lo.dtype == np.float64 and hi.dtype == np.float64 else np.float32
    lo, hi = lo.astype(dtype), hi.astype(dtype)
    with np.errstate(invalid="ignore"):
        never = (lo == np.inf) & (hi == -np.inf)
        bad = (lo > hi) & ~never
    if np.any(bad):
        raise ValueError(f"state_dict has min_val > max_val at {np.argwhere(bad).tolist()}: {lo[bad].tolist()} > {hi[bad].tolist()}")
    return lo, hi


def describe(spec: LowBitSpec, is_dynamic: bool, ignore_nonfinite: bool) -> str:
    """The ``repr`` of a configuration."""
    parts = [f"dtype={spec.dtype!r}", f"granularity={spec.granularity!r}"]
    if spec.axis is not None:
        parts.append(f"axis={spec.axis}")
    if spec.group_size is not None:
        parts.append(f"{'block_size' if spec.granularity == 'per_block' else 'group_size'}={spec.group_size}")
    if spec.family == "int":
        parts.append(f"symmetric={spec.symmetric}")
    if spec.rounding is not None:
        parts.append(f"rounding={spec.rounding!r}")
    parts.append(f"is_dynamic={is_dynamic}")
    if ignore_nonfinite:
        parts.append("ignore_nonfinite=True")
    return ", ".join(parts)


@dataclass(frozen=True)
class Config:
    """A low-bit observer's whole configuration (hashable: a ``jax.jit`` static argument)."""

    spec: LowBitSpec
    is_dynamic: bool = False
    ignore_nonfinite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.spec, LowBitSpec):
            raise TypeError(f"spec must be a LowBitSpec (see lowbit_spec(...)), got {type(self.spec).__name__}")
        object.__setattr__(self, "is_dynamic", check_bool(self.is_dynamic, "is_dynamic"))
        object.__setattr__(self, "ignore_nonfinite", check_bool(self.ignore_nonfinite, "ignore_nonfinite"))


def init(config: Config, /, *, num_channels: int | None = None, device: Any = None, xp: Any = None) -> State:
    """``num_channels`` entries (one by default) that have seen nothing (``+inf``/``-inf``); one such entry
    gives the qparams returned before any input. The statistics' real shape comes from the first batch:
    ``update(config, None, x)`` starts a state, as adapters do."""
    if xp is None:
        import array_api_compat.numpy as xp
    return minmax_init(num_channels=1 if num_channels is None else num_channels, device=device, xp=xp)


def update(config: Config, state: State | None, x: Array, /, *, collective: Any = None, xp: Any = None) -> State:
    """Static: ``minmax_merge(state, lowbit_stats(x))``; dynamic (or ``state=None``): ``lowbit_stats(x)``.
    ``ValueError`` if ``x``'s statistics have another shape than ``state``'s. With a collective, the
    statistics of every member's ``x`` (see :func:`observe`). ``xp``: ``x``'s namespace by default."""
    xp = array_namespace(x, xp=xp)
    return observe(None if config.is_dynamic else state, x, spec=config.spec,
                   ignore_nonfinite=config.ignore_nonfinite, xp=xp, collective=collective)


def merge(config: Config, a: State, b: State, /) -> State:
    """``minmax_merge(a, b)``: the statistics of both shards' data (exact, associative, commutative)."""
    return minmax_merge(a, b)


def qparams(config: Config, state: State, /, *, xp: Any = None) -> QParams | BlockScale:
    """:func:`observers_core.lowbit_qparams` of the state."""
    return lowbit_qparams(state, config.spec, xp=xp)


def fake_quantize(config: Config, state: State, x: Array, /, *, xp: Any = None) -> Array:
    """``x`` quantized and dequantized with the state's qparams (:func:`observers_core.lowbit_fake_quantize`)."""
    check_fake_quantize_input(x, state, config.spec)
    return lowbit_fake_quantize(x, qparams(config, state, xp=xp), config.spec, xp=xp)
