"""Low-bit observers over one array-API namespace: per-group integers, fp8 scaling, OCP MX and BFP16.

Used directly (``xp=numpy`` by default, or ``array_api_strict``) they are plain NumPy observers;
``observers_core.adapters.jax`` and ``.cupy`` subclass them on their backend (``jax.jit``, devices), and
``observers_core.adapters.torch`` holds the same statistics in ``nn.Module`` buffers; the pure parts
(:func:`~observers_core.families.lowbit.make_spec`, ``observe``, ``check_loaded_stats``...) live in
:mod:`observers_core.families.lowbit`.

Configuration is backend-neutral: the keywords of :func:`observers_core.lowbit_spec` (``dtype`` name,
``granularity``, ``axis``, ``group_size`` or ``block_size``, ``symmetric``, ``rounding``, ``eps``).
Statistics are a :class:`~observers_core.MinMaxState` of per-group arrays (shape: the input's with
``axis`` replaced by the number of groups/blocks; ``()`` per tensor, ``(C,)`` per channel):

- static mode (``is_dynamic=False``, the default): ``state = minmax_merge(state, lowbit_stats(x))``
  over every batch, so all batches must give statistics of one shape;
- dynamic mode (``is_dynamic=True``): ``state = lowbit_stats(x)``, the last batch alone.

``calculate_qparams()`` is :func:`observers_core.lowbit_qparams` of the state: ``QParams(scale,
zero_point)`` for integers (int32 zero points) and fp8 (zero points 0), ``BlockScale(scale, exponent)``
for MX and BFP16 (``exponent``: uint8 E8M0 codes ``e + 127``, ``scale = 2**e``).
``fake_quantize(x)`` quantizes and dequantizes ``x`` with them. Calling the observer returns its input
unchanged; bad inputs (bool/complex, ``axis`` out of range, a group size that does not divide the
axis, statistics of another shape than the state's, another device) raise and leave the state untouched.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from observers_core._dtypes import FLOAT32_EPS
from observers_core._minmax import MinMaxState
from observers_core._mx import BlockScale
from observers_core._qparams import QParams
from observers_core._quantize import extension_float
from observers_core._state_dict import check_entry
from observers_core.families import lowbit as family
from observers_core.families.lowbit import (
    STATE_KEYS,
    UNINITIALIZED_WARNING,
    check_axis,
    check_loaded_stats,
    describe,
    make_spec,
    unobserved_state,
)

from ._array_observers import ObserveLoop, StatefulObserver, refuse_unknown
from ._backend import plain_ndarray

__all__ = [
    "LowBitObserver",
    "PerGroupMinMaxObserver",
    "FP8Observer",
    "PerBlockMXObserver",
    "PerBlockBFPObserver",
]

Array = Any
#: the keywords of :func:`~observers_core.families.lowbit.make_spec` a constructor forwards
_LAYOUT_KEYWORDS = frozenset({"granularity", "axis", "group_size", "block_size", "symmetric", "rounding", "eps"})

# ------------------------------------------------------------- the observe steps, every framework


class LowBitSteps(ObserveLoop):
    """The low-bit observer of every framework (the array observers here, the torch ones in
    ``adapters.torch``), over the storage the framework gives it: the statistics are read by
    ``_read_state()`` and committed by ``_write_state`` (the observe step, :class:`ObserveLoop`), and every
    pure step of :mod:`observers_core.families.lowbit` runs through ``_run_family(fn, *args)``, which
    calls ``fn(config, *args)``. Needs ``spec``, ``is_dynamic``, ``ignore_nonfinite`` and ``_backend``."""

    _FAMILY: str | None = None

    def _make_spec(self, dtype: Any, layout: Mapping[str, Any]) -> Any:
        """The validated :class:`~observers_core.LowBitSpec` of a constructor's ``dtype`` and ``layout``
        (``make_spec``'s keywords), for this class's family."""
        return make_spec(type(self).__name__, self._FAMILY, dtype, **layout)

    @property
    def config(self) -> family.Config:
        """The low-bit family's configuration (:class:`observers_core.families.lowbit.Config`)."""
        return family.Config(self.spec, self.is_dynamic, self.ignore_nonfinite)

    @property
    def _step_config(self) -> family.Config:
        """The configuration the core steps run with: the dynamic mode is the observer's (``update`` drops
        the state), so static and dynamic observers share one compiled update under JAX."""
        return family.Config(self.spec, False, self.ignore_nonfinite)

    def _check_input(self, x: Array) -> Array:
        x = super()._check_input(x)  # the framework's: an array of its namespace, on the state's device
        check_axis(x, self.spec)
        return x

    def _fitting_state(self, state: MinMaxState | None, x: Array, axis: None) -> MinMaxState | None:
        """What the update starts from: ``state`` (on ``x``'s device), or for ``None`` and in dynamic mode
        the backend's identity start (``None``; JAX: the identity, so every batch shares one compile)."""
        if state is None or self.is_dynamic:
            return self._backend.identity_start(family.update, self._step_config, x)
        self._backend.check_device(x, state.min_val)
        return state

    def _compute_update(self, state: MinMaxState | None, x: Array, axis: None, collective: Any = None) -> MinMaxState:
        return self._run_family(family.update, state, x, collective=collective)

    def calculate_qparams(self) -> QParams | BlockScale:
        """``QParams(scale, zero_point)`` (integers, fp8) or ``BlockScale(scale, exponent)`` (MX, BFP16) of
        the observed statistics, one entry per tensor / channel / group / block; see
        :func:`observers_core.lowbit_qparams`. Before any input: a warning and the qparams of one
        entry that has seen nothing (integers ``[1.], [0]`` as torch)."""
        state = self._read_state()
        if state is None:
            warnings.warn(UNINITIALIZED_WARNING, UserWarning, stacklevel=2)
            state = unobserved_state(self._backend.xp, self._home_device())
        return self._run_family(family.qparams, state)

    def fake_quantize(self, x: Array) -> Array:
        """Quantize-dequantize ``x`` with :meth:`calculate_qparams` (``x`` must fit the statistics'
        shape); see :func:`observers_core.lowbit_fake_quantize`. Output dtype: ``x``'s floating dtype
        (float32 for integers; NumPy's ml_dtypes bfloat16/float8 included, computed as JAX computes them and
        torch its bfloat16; the torch observers return float32 for float8 inputs, README "Exactness notes")."""
        state = self._read_state()
        checked = self._check_input(x)
        if state is None:
            raise RuntimeError(f"{type(self).__name__}.fake_quantize needs observed statistics; call the observer on data first")
        self._backend.check_device(checked, state.min_val)
        if isinstance(x, np.ndarray) and extension_float(x, self._backend.xp):
            checked = plain_ndarray(x)  # the statistics' float32 copy (coerce) would lose the dtype
        return self._run_family(family.fake_quantize, state, checked)

    def _checked_stats(self, state_dict: Mapping[str, Any], prefix: str = "") -> tuple[np.ndarray, np.ndarray] | None:
        """The ``min_val``/``max_val`` entries of a state dict as validated host arrays
        (:func:`check_loaded_stats`; ``None``: never updated), before anything is loaded."""
        lo = check_entry(state_dict[prefix + "min_val"], "min_val", None)
        hi = check_entry(state_dict[prefix + "max_val"], "max_val", None)
        return check_loaded_stats(lo, hi, self.spec, type(self).__name__)

    def extra_repr(self) -> str:
        state = self._read_state()
        shape = None if state is None else tuple(state.min_val.shape)
        return describe(self.spec, self.is_dynamic, self.ignore_nonfinite) + f", stats_shape={shape}"


# ---------------------------------------------------------------------------------------- classes


class LowBitObserver(LowBitSteps, StatefulObserver):
    """Any low-bit format of :func:`observers_core.lowbit_spec` (the four classes below fix the family).

    ``obs(x)`` records ``lowbit_stats(x)`` (merged with ``minmax_merge``, or alone when ``is_dynamic``)
    and returns ``x``; ``calculate_qparams()`` is ``lowbit_qparams(state)``; ``fake_quantize(x)`` is
    ``lowbit_fake_quantize(x, calculate_qparams())``. ``ignore_nonfinite=True`` skips NaN/+-Inf (BFP16
    always does); by default NaN propagates (integer scale NaN, MX code 255).
    """

    def __init__(
        self,
        dtype: str,
        *,
        granularity: str | None = None,
        axis: int | None = None,
        group_size: int | None = None,
        block_size: int | None = None,
        symmetric: bool | None = None,
        rounding: str | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            dtype, granularity=granularity, axis=axis, group_size=group_size, block_size=block_size,
            symmetric=symmetric, rounding=rounding, eps=eps, is_dynamic=is_dynamic, ignore_nonfinite=ignore_nonfinite,
            **backend,
        )

    #: the keywords that are the framework's, not the layout's (torch: ``factory_kwargs``, ``sync``, ``process_group``)
    _BACKEND_KEYWORDS: tuple[str, ...] = ("xp",)

    def _setup(self, dtype: str, *, is_dynamic: bool = False, ignore_nonfinite: bool = False, **layout: Any) -> None:
        """What the public constructors forward to, on every framework: ``layout`` (``make_spec``'s keywords)
        checked into a spec, then stored by the framework (``_init_lowbit``)."""
        backend = {k: layout.pop(k) for k in self._BACKEND_KEYWORDS if k in layout}
        refuse_unknown(type(self).__name__, {k: v for k, v in layout.items() if k not in _LAYOUT_KEYWORDS})
        self._init_lowbit(self._make_spec(self._parse_lowbit_dtype(dtype), layout), is_dynamic, ignore_nonfinite,
                          **backend)

    #: a ``dtype`` argument as the core's name (torch: ``torch.int4``... too)
    _parse_lowbit_dtype = staticmethod(lambda dtype: dtype)

    def _init_lowbit(self, spec: Any, is_dynamic: bool, ignore_nonfinite: bool, *, xp: Any = None) -> None:
        """The configuration's storage (here attributes, the statistics ``None`` until the first batch)."""
        StatefulObserver.__init__(self, spec, is_dynamic, ignore_nonfinite=ignore_nonfinite, xp=xp)

    def _home_device(self) -> Any:
        return self._device

    def _run_family(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return self._backend.run(fn, self._step_config, *args, **kwargs)

    # -- state (``None`` before the first non-empty input) ----------------------------------------
    def _as_state(self, state: Any) -> MinMaxState:
        state = self._state_tuple(state, MinMaxState)
        if tuple(state.min_val.shape) != tuple(state.max_val.shape):
            raise ValueError(
                f"state must hold min_val and max_val of one shape, got {tuple(state.min_val.shape)} "
                f"and {tuple(state.max_val.shape)}"
            )
        return state

    def update(self, state: MinMaxState | None, x: Array, *, collective: Any = None,
               axis_name: Any = None) -> MinMaxState | None:
        """Pure: the state after observing ``x`` (``state=None``: nothing seen yet; dynamic mode ignores
        ``state``). Empty ``x`` returns ``state``. With a :class:`~observers_core.Collective` (JAX:
        ``axis_name=`` inside ``shard_map``/``pmap``) the batch statistics are every member's, merged
        elementwise (``x`` of one shape on every member; an empty ``x`` still takes part once the state
        exists)."""
        return super().update(state, x, collective=collective, axis_name=axis_name)

    def _compute_qparams(self, state: MinMaxState) -> QParams | BlockScale:
        """:func:`observers_core.lowbit_qparams` of ``state``."""
        return self._run_family(family.qparams, state)

    # -- state dict: ``{"min_val", "max_val"}``, ``(0,)`` float32 arrays before any input ----------------
    _STATE_KEYS = STATE_KEYS

    def _unseen_state(self) -> MinMaxState:
        empty = np.zeros((0,), np.float32)
        return MinMaxState(self._place(empty, None), self._place(empty, None))

    def _checked_entries(self, state_dict: Mapping[str, Any]) -> MinMaxState | None:
        """:func:`check_loaded_stats` of the entries."""
        checked = self._checked_stats(state_dict)
        return None if checked is None else MinMaxState(*checked)


class PerGroupMinMaxObserver(LowBitObserver):
    """Integer (``int2``..``int8``, ``uint4``, ``uint8``) min/max per group of ``group_size``
    consecutive elements along ``axis`` (``-1``: one group spanning the axis), torchao's
    ``choose_qparams_affine(block_size=(1, ..., group_size))``: asymmetric
    ``s = max((M - m) / (Q_max - Q_min), eps)``, ``z = clip(Q_min - round(m / s), Q_min, Q_max)``;
    symmetric ``s = max(max(-m, M) / ((Q_max - Q_min) / 2), eps)``, with ``m = min(x_min, 0)``,
    ``M = max(x_max, 0)``. ``group_size`` defaults to 128 (torchao's int4 weight-only default)."""

    _FAMILY = "int"

    def __init__(
        self,
        dtype: str = "int4",
        axis: int = -1,
        group_size: int = 128,
        symmetric: bool = False,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            dtype, granularity="per_group", axis=axis, group_size=group_size, symmetric=symmetric, eps=eps,
            is_dynamic=is_dynamic, ignore_nonfinite=ignore_nonfinite, **backend,
        )


class FP8Observer(LowBitObserver):
    """fp8 scaling (``float8_e4m3fn``, ``float8_e5m2``): ``s = amax / max_fp8`` (448 / 57344) with
    ``amax = max(-x_min, x_max)`` per tensor (no ``axis``), per channel (``axis``) or per group
    (``axis`` and ``group_size``); an all-zero range gets ``s = eps``. ``calculate_qparams()`` gives
    ``QParams(scale, zero_point=0)``; ``fake_quantize`` is ``fp8(clip(x / s, -max_fp8, max_fp8)) * s``."""

    _FAMILY = "fp8"

    def __init__(
        self,
        dtype: str = "float8_e4m3fn",
        granularity: str | None = None,
        axis: int | None = None,
        group_size: int | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            dtype, granularity=granularity, axis=axis, group_size=group_size, eps=eps, is_dynamic=is_dynamic,
            ignore_nonfinite=ignore_nonfinite, **backend,
        )


class PerBlockMXObserver(LowBitObserver):
    """OCP MX (``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e3m2``, ``mxfp6_e2m3``, ``mxfp4``, ``mxint8``):
    one shared E8M0 exponent per block of ``block_size`` elements along ``axis`` (the last block
    zero-padded), ``e = floor(log2(amax)) - emax_elem`` for ``rounding="floor"`` (the spec; also
    ``"ceil"``, ``"even"``, ``"rceil"``, see :func:`observers_core.mx_scale`). ``calculate_qparams()``
    gives ``BlockScale(scale=2**e, exponent=e + 127)`` (uint8 codes)."""

    _FAMILY = "mx"

    def __init__(
        self,
        dtype: str = "mxfp8_e4m3",
        axis: int = -1,
        block_size: int = 32,
        rounding: str = "floor",
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            dtype, axis=axis, block_size=block_size, rounding=rounding, is_dynamic=is_dynamic,
            ignore_nonfinite=ignore_nonfinite, **backend,
        )


class PerBlockBFPObserver(LowBitObserver):
    """BFP16 (AMD Quark): one shared exponent per block of ``block_size`` (8) along ``axis``, 8-bit
    signed mantissas: ``e = floor(log2(amax))``, plus one where the largest value's mantissa would round
    to 128 (Quark's rule, :func:`observers_core.bfp_scale`). NaN/Inf are always skipped (Quark zeroes
    them). ``calculate_qparams()`` gives ``BlockScale(scale=2**e, exponent=e + 127)``."""

    _FAMILY = "bfp"

    def __init__(
        self, dtype: str = "bfp16", axis: int = -1, block_size: int = 8, is_dynamic: bool = False, **backend: Any
    ) -> None:
        self._setup(dtype, axis=axis, block_size=block_size, is_dynamic=is_dynamic, **backend)
