"""Stateful observers over one array-API namespace: everything the JAX and CuPy adapters share.

The classes mirror ``torch.ao.quantization.observer`` (class names, constructor arguments and defaults,
``state_dict`` keys and shapes) with backend-neutral configuration: ``dtype`` is a name (``"quint8"``,
``"qint8"``, ``"torch.qint8"``...), ``qscheme`` a :class:`~observers_core.QScheme` or its name
(``"per_tensor_affine"``...). They keep their statistics as a :class:`~observers_core.MinMaxState` of
arrays of one namespace and call the pure core for every update and for the qparams.

Used directly (``xp=numpy`` by default, or ``array_api_strict``) they are plain NumPy observers;
``observers_core.adapters.jax`` and ``.cupy`` subclass them on their
:class:`~observers_core.adapters._backend.Backend` (``jax.jit``, devices) and add nothing else. Deliberate differences from torch are listed in README.md ("Differences from
torch.ao"); zero points are int32 (affine) or the namespace's index dtype (symmetric, and the defaults of
an observer that has seen nothing), where torch has int32/int64.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from collections.abc import Mapping
from typing import Any

import array_api_compat
import numpy as np

from observers_core._dtypes import FLOAT32_EPS, QScheme, QuantSpec, parse_dtype, quant_spec
from observers_core._minmax import MinMaxState, minmax_init
from observers_core._namespace import check_real, device_of, index_dtype, normalize_axis, size
from observers_core._qparams import UNINITIALIZED_WARNING, QParams
from observers_core._fixed import check_fixed_observer, check_fixed_qparams
from observers_core._state_dict import check_eps_entry, check_keys, check_minmax_entries
from observers_core._validate import check_bool, check_channel_count, check_float
from observers_core.families import minmax as family

from ._backend import Backend

__all__ = [
    "ObserverBase",
    "UniformQuantizationObserverBase",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "FixedQParamsObserver",
    "PlaceholderObserver",
    "NoopObserver",
]

Array = Any


def refuse_unknown(owner: str, unknown: Mapping[str, Any]) -> None:
    """``TypeError`` naming the class and the first keyword its constructor does not take (a constructor
    forwards every keyword to ``_setup``, whose own name would otherwise be in Python's message)."""
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {next(iter(unknown))!r}")


def read_only(path: str, doc: str | None = None) -> property:
    """A read-only property returning the attribute at ``path`` (dotted: ``"_spec.quant_min"``)."""
    return property(operator.attrgetter(path), doc=doc)


class ObserveLoop:
    """The observe step of every stateful observer of every framework, written once.

    ``_observe_input(x)``: ``x`` checked (``_check_input``); an empty batch is a no-op unless a collective
    takes part (``_collective()``: torch's ``sync``; ``None`` here); the state read (``_read_state()``, a
    fresh ``_new_state(x, channels)`` before the first batch) and checked against ``x`` (``_check_fits``);
    then the family's step, which commits through ``_write_state`` (``_observe``). Nothing is written
    before every check has passed, so errors leave the state untouched.

    The array observers keep the state in ``_state``; the torch observers (``adapters.torch``) in
    ``nn.Module`` buffers: each framework supplies ``_read_state``/``_write_state``/``_new_state``.
    """

    #: per channel: the state has one entry per channel of ``x`` along ``ch_axis``
    _PER_CHANNEL = False

    def _collective(self) -> Any:
        """The collective a stateful call reduces the batch with (``None``: this process only)."""
        return None

    def _channel_axis(self, x: Array) -> int | None:
        if not self._PER_CHANNEL:
            return None
        return normalize_axis(self.ch_axis, x.ndim, name="ch_axis")

    def _fitting_state(self, state: Any, x: Array, axis: int | None) -> Any:
        """``state`` (a fresh one for ``None``: before the first batch), checked against ``x``."""
        if state is None:
            state = self._new_state(x, None if axis is None else x.shape[axis])
        self._check_fits(state, x, axis)
        return state

    def _observe_input(self, x: Array) -> Array:
        x_arr = self._check_input(x)
        collective = self._collective()
        if collective is None and size(x_arr) == 0:
            return x
        axis = self._channel_axis(x_arr)
        self._observe(self._fitting_state(self._read_state(), x_arr, axis), x_arr, axis, collective)
        return x

    def _observe(self, state: Any, x: Array, axis: int | None, collective: Any) -> None:
        self._write_state(self._compute_update(state, x, axis, collective))


class ObserverBase:
    """What every observer shares: its :class:`~observers_core.adapters._backend.Backend` (the array
    library: input coercion, devices, how the pure core runs), ``dtype`` and ``is_dynamic``.

    A framework's class is the generic one with its ``_BACKEND_TYPE`` (JAX, CuPy: a one-line subclass); the
    torch classes add torch's storage (``adapters/_torch_minmax.py``: ``TorchBuffers``).
    """

    _BACKEND_TYPE: type[Backend] = Backend
    #: configuration attributes that assignment and ``del`` refuse (``AttributeError``, nothing changed): the
    #: computations use the configuration validated at construction, so a new value would be ignored. Set
    #: through :meth:`_configure`. The torch classes take ``nn.Module``'s ``__setattr__`` instead: torch.ao's
    #: attributes are assignable and re-read at each call (``adapters/_torch_minmax.py``: ``TorchModule``).
    _READ_ONLY: frozenset[str] = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._READ_ONLY:
            raise AttributeError(f"{type(self).__name__}.{name} is read-only (fixed at construction; make a new observer)")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._READ_ONLY:
            raise AttributeError(f"{type(self).__name__}.{name} is read-only (fixed at construction; make a new observer)")
        super().__delattr__(name)

    def _configure(self, **attrs: Any) -> None:
        """Set configuration attributes, the read-only ones (``_READ_ONLY``) included: construction and loads."""
        for name, value in attrs.items():
            super().__setattr__(name, value)

    def __init__(self, dtype: Any, is_dynamic: bool = False, *, xp: Any = None, device: Any = None) -> None:
        self.dtype = dtype
        self.is_dynamic = check_bool(is_dynamic, "is_dynamic")
        self._backend = self._BACKEND_TYPE.namespace(xp)
        self._device = self._backend.normalize_device(device)

    @property
    def _xp(self) -> Any:
        return self._backend.xp

    def __call__(self, x: Array) -> Array:
        """Observe ``x`` and return it (the same object). Errors leave the state untouched."""
        self._backend.check_stateful_call(x, type(self).__name__)
        return self._observe_input(x)

    def _observe_input(self, x: Array) -> Array:
        return x

    def _check_input(self, x: Array) -> Array:
        """``x`` in this backend's namespace, real-valued (``TypeError`` otherwise)."""
        x = self._backend.coerce(x)
        check_real(x, self._xp, name="x")
        return x

    def _place(self, host: np.ndarray, dtype: Any, like: Array | None = None) -> Array:
        """A host array on ``like``'s device (or the observer's)."""
        return self._backend.place(host, dtype, like, self._device)

    def forward(self, x: Array) -> Array:
        """Alias of ``__call__`` (the name torch's observers use)."""
        return self(x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def extra_repr(self) -> str:
        return f"dtype={self.dtype!r}"


class StatefulObserver(ObserveLoop, ObserverBase):
    """An observer with a validated configuration (:attr:`spec`), ``ignore_nonfinite`` and statistics
    (``_state``; ``None``: nothing seen yet) kept in its ``state_dict``."""

    _state: Any = None

    def __init__(
        self, spec: Any, is_dynamic: bool = False, *, ignore_nonfinite: bool = False, xp: Any = None, device: Any = None
    ) -> None:
        super().__init__(spec.dtype, is_dynamic, xp=xp, device=device)
        self.ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
        self._spec = spec
        self._state = None

    spec = read_only("_spec", "The validated, hashable configuration.")

    @property
    def min_val(self) -> Array:
        return self.state_dict()["min_val"]

    @property
    def max_val(self) -> Array:
        return self.state_dict()["max_val"]

    def reset_min_max_vals(self) -> None:
        """Forget everything seen (per channel, the channel count too)."""
        self._state = None

    def _state_tuple(self, state: Any, kind: type, name: str = "state",
                     kinds: str | tuple[str, ...] = "real floating") -> Any:
        """``state`` as the NamedTuple ``kind`` (``TypeError`` naming ``name`` unless it is a tuple of as many
        arrays of this observer's namespace, each of a dtype of ``kinds``). The pure steps return such
        states: an integer state would truncate every later update, a NumPy array in a JAX observer would
        stay one."""
        if not isinstance(state, tuple) or len(state) != len(kind._fields):
            raise TypeError(f"{name} must be a {kind.__name__}({', '.join(kind._fields)}), got {type(state).__name__}")
        state = kind(*state)
        for field, value in zip(state._fields, state):
            try:
                same = array_api_compat.array_namespace(value) is self._xp
            except TypeError:
                same = False
            if not same or not self._xp.isdtype(value.dtype, kinds):
                allowed = kinds if isinstance(kinds, str) else " or ".join(kinds)
                raise TypeError(f"{name}.{field} must be a {allowed} array of {self._xp.__name__}, got "
                                f"{type(value).__module__}.{type(value).__name__} {getattr(value, 'dtype', '')}")
        return state

    def _as_state(self, state: Any) -> Any:
        """``state`` checked as this observer's statistics (type, namespace, dtype, shapes): what the
        ``state`` setter and the pure steps (``update``, ``qparams``) take."""
        raise NotImplementedError

    def _read_state(self) -> Any:
        return self._state

    def _write_state(self, state: Any) -> None:
        self._state = state

    @property
    def state(self) -> Any:
        """The statistics (a NamedTuple of this namespace's arrays, a JAX pytree); before the first input
        the family's empty state, or ``None`` where its shape comes from the input (per channel, low-bit)."""
        return self._state_or_empty()

    @state.setter
    def state(self, state: Any) -> None:
        self._state = None if state is None else self._as_state(state)

    def _state_or_empty(self) -> Any:
        return self._state

    def qparams(self, state: Any) -> Any:
        """Pure: the qparams of ``state`` (``calculate_qparams``'s, without its warnings)."""
        return self._compute_qparams(self._as_state(state))

    # -- state dict: every family's, from its keys and its entries' check ------------------------------
    #: the state-dict keys: torch's names and order (``eps``, where the configuration has one, first)
    _STATE_KEYS: tuple[str, ...] = ("eps", "min_val", "max_val")

    def state_dict(self) -> dict[str, Array]:
        """The statistics under torch's key names, order and shapes (``_STATE_KEYS``; ``eps`` a ``(1,)``
        float32 array), the family's never-updated entries before the first input."""
        state = self._state if self._state is not None else self._unseen_state()
        entries = state._asdict()
        if "eps" in self._STATE_KEYS:
            xp = self._xp
            entries["eps"] = xp.asarray([self._spec.eps], dtype=xp.float32, device=device_of(state[-1]))
        return {key: entries[key] for key in self._STATE_KEYS}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` gives (numpy arrays, this framework's arrays or torch CPU tensors: a
        ``torch.ao`` observer's ``state_dict()`` loads as is). Everything is checked before anything
        changes: exactly ``_STATE_KEYS``; ``eps`` a positive float32 normal; the family's entries
        (``_checked_entries``: shapes, dtypes, order)."""
        check_keys(state_dict, self._STATE_KEYS, type(self).__name__)
        eps = check_eps_entry(state_dict["eps"]) if "eps" in self._STATE_KEYS else None
        host = self._checked_entries(state_dict)
        # Everything checked: commit.
        like = None if self._state is None else self._state[-1]
        if eps is not None:
            self._store_spec(dataclasses.replace(self._spec, eps=eps))
        self._state = None if host is None else host._make(self._place(a, None, like) for a in host)

    def _checked_entries(self, state_dict: Mapping[str, Any]) -> Any:
        """The state of a state dict's entries as host (NumPy) arrays, checked (``None``: never updated)."""
        raise NotImplementedError

    def update(self, state: Any, x: Array, *, collective: Any = None, axis_name: Any = None) -> Any:
        """Pure: the state after observing ``x`` (``state`` is not modified; ``None``: nothing seen yet);
        an empty ``x`` returns ``state``. With a :class:`~observers_core.Collective` (JAX: ``axis_name=``
        inside ``jax.shard_map``/``jax.pmap``; other backends refuse it) the batch is every member's and
        an empty ``x`` still takes part. The stateful ``obs(x)`` is this step on the observer's state."""
        state = None if state is None else self._as_state(state)
        x = self._check_input(x)
        collective = self._backend.collective(collective, axis_name)
        if collective is None and size(x) == 0:
            return state
        axis = self._channel_axis(x)
        return self._compute_update(self._fitting_state(state, x, axis), x, axis, collective)


class UniformQuantizationObserverBase(StatefulObserver):
    """Configuration of the uniform (scale, zero point) observers, validated by
    :func:`observers_core.quant_spec` and resolved exactly as torch does: ``qscheme``, ``quant_min``,
    ``quant_max``, ``has_customized_qrange``, ``eps``, ``reduce_range`` are attributes, as torch.ao's.
    Here the computations use the hashable :attr:`spec` fixed at construction, so the configuration
    attributes are read-only (``_READ_ONLY``: assigning one raises ``AttributeError``); the torch
    observers' are assignable and re-read at each call, as torch.ao's.

    Every framework shares the checks; what a framework stores is its own: ``_init_uniform`` (the
    configuration) and ``_init_range`` (the statistics' storage) are the hooks ``adapters.torch``'s
    ``TorchBuffers`` overrides (torch objects, the ``eps`` buffer, registered ``min_val``/``max_val``)."""

    def __init__(
        self,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._init_uniform(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic,
                           ignore_nonfinite=ignore_nonfinite, **backend)

    def _init_uniform(self, dtype: Any, qscheme: Any, reduce_range: bool, quant_min: int | None, quant_max: int | None,
                      factory_kwargs: Mapping[str, Any] | None, eps: float, is_dynamic: bool, *,
                      ignore_nonfinite: bool, xp: Any = None, **unknown: Any) -> QuantSpec:
        """Check and store the configuration; returns the resolved :class:`~observers_core.QuantSpec`."""
        refuse_unknown(type(self).__name__, unknown)
        device = None
        if factory_kwargs is not None:
            if not isinstance(factory_kwargs, Mapping) or set(factory_kwargs) - {"device"}:
                raise ValueError(
                    f"factory_kwargs={factory_kwargs!r} is not supported; allowed: None or {{'device': ...}}"
                )
            device = factory_kwargs.get("device")
        spec = quant_spec(dtype, qscheme, reduce_range=reduce_range, quant_min=quant_min, quant_max=quant_max, eps=eps)
        StatefulObserver.__init__(self, spec, is_dynamic, ignore_nonfinite=ignore_nonfinite, xp=xp, device=device)
        self.reduce_range = bool(reduce_range)
        self._store_spec(spec)
        return spec

    def _store_spec(self, spec: QuantSpec) -> None:
        """``spec`` and its fields as the attributes torch.ao's observers have."""
        self._spec = spec
        self._configure(qscheme=spec.qscheme, quant_min=spec.quant_min, quant_max=spec.quant_max,
                        has_customized_qrange=spec.has_customized_qrange, eps=spec.eps)

    #: a ``qscheme`` argument as the core's :class:`~observers_core.QScheme` (torch: its objects too)
    _parse_qscheme = staticmethod(QScheme.parse)
    #: a ``dtype`` argument as the core's name (torch: its dtype objects too)
    _parse_dtype = staticmethod(parse_dtype)

    def _init_range(self, factory_kwargs: Mapping[str, Any] | None) -> None:
        """The statistics' storage (here ``_state``, ``None`` until the first batch; torch: buffers)."""

    def _current_spec(self) -> QuantSpec:
        """The configuration the steps use (here the one fixed at construction; torch re-reads its attributes)."""
        return self._spec

    _READ_ONLY = frozenset({"qscheme", "quant_min", "quant_max", "has_customized_qrange", "eps", "averaging_constant"})
    #: ``c`` of the moving average ``x_min <- x_min + c * (min(X) - x_min)``; ``None``: running min/max
    averaging_constant: float | None = None
    #: the min/max moving averages (torch's formula; its states can hold ``min_val > max_val``)
    _AVERAGING = False
    #: loaded ranges must be finite (or +inf/-inf, nothing seen): the calibration observers' averages
    _FINITE_RANGE = False

    # -- state ---------------------------------------------------------------------------------------
    def init_state(self, num_channels: int | None = None) -> MinMaxState:
        """A state that has seen nothing (``+inf``/``-inf``): 0-d, or ``(num_channels,)`` per channel."""
        if self._PER_CHANNEL:
            if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 0:
                raise TypeError(f"num_channels must be a non-negative int for {type(self).__name__}, got {num_channels!r}")
        elif num_channels is not None:
            raise ValueError(f"num_channels must be None for the per-tensor {type(self).__name__}, got {num_channels!r}")
        return self._backend.empty(self._make_state(num_channels), self._device)

    def _make_state(self, num_channels: int | None) -> Any:
        """``device -> the empty state`` (``num_channels`` per channel)."""
        return lambda device: minmax_init(num_channels=num_channels, device=device, xp=self._xp)

    def _state_or_empty(self) -> MinMaxState | None:
        """Before the first non-empty input: the empty state per tensor, ``None`` per channel (the number
        of channels is learnt from the first input)."""
        if self._state is None and not self._PER_CHANNEL:
            return self.init_state()
        return self._state

    def _as_state(self, state: Any) -> MinMaxState:
        state = self._state_tuple(state, MinMaxState)
        expected = "(C,)" if self._PER_CHANNEL else "()"
        ok = state.min_val.shape == state.max_val.shape and len(state.min_val.shape) == (1 if self._PER_CHANNEL else 0)
        if not ok:
            raise ValueError(
                f"state must hold min_val and max_val of shape {expected}, got "
                f"{tuple(state.min_val.shape)} and {tuple(state.max_val.shape)}"
            )
        return state

    def _new_state(self, x: Array, num_channels: int | None) -> MinMaxState:
        """The empty state for the first input ``x``: on the observer's device if one was given, else on
        ``x``'s device."""
        return self._backend.empty(self._make_state(num_channels), self._device, x)

    # -- update --------------------------------------------------------------------------------------
    def _check_fits(self, state: MinMaxState, x: Array, axis: int | None) -> None:
        if axis is not None:
            check_channel_count(x.shape[axis], tuple(state.min_val.shape), self.ch_axis)
        self._backend.check_device(x, state.min_val)

    def _family_config(self, axis: int | None) -> family.Config:
        """The min/max family's configuration with the input's (normalised) channel axis."""
        return family.Config(self._current_spec(), self.averaging_constant, axis, self.ignore_nonfinite)

    def _compute_update(self, state: MinMaxState, x: Array, axis: int | None, collective: Any = None) -> MinMaxState:
        return self._backend.run(family.update, self._family_config(axis), state, x, collective=collective)

    def update(self, state: MinMaxState, x: Array, *, collective: Any = None, axis_name: Any = None) -> MinMaxState:
        """Pure update: the state after observing ``x`` (``state`` itself is not modified).

        Running: ``x_min = min(x_min, min(X))``; moving average: ``x_min = x_min + c * (min(X) - x_min)``
        (the first input sets the range); likewise for ``x_max``. Empty ``x``: ``state`` unchanged.

        With a :class:`~observers_core.Collective` (every member of the group calls ``update`` in step)
        the batch is every member's: each member ends with the state of one update on the concatenated
        batches. An empty ``x`` then still takes part (per channel it must have the channel axis).
        JAX: ``axis_name=`` inside ``jax.shard_map``/``jax.pmap`` over that axis does the same across the
        devices (:class:`~observers_core.adapters.jax.AxisCollective`); other backends refuse it.
        """
        return super().update(state, x, collective=collective, axis_name=axis_name)

    # -- qparams -------------------------------------------------------------------------------------
    def _compute_qparams(self, state: MinMaxState) -> QParams:
        axis = 0 if self._PER_CHANNEL else None  # the state is (C,): its channel axis is 0
        return self._backend.run(family.qparams, self._family_config(axis), state)

    def calculate_qparams(self) -> QParams:
        """``(scale, zero_point)``: affine ``s = max((max(x_max, 0) - min(x_min, 0)) / (Q_max - Q_min), eps)``,
        ``z = clamp(Q_min - round(min(x_min, 0) / s), Q_min, Q_max)``; symmetric
        ``s = max(max(-min(x_min, 0), max(x_max, 0)) / ((Q_max - Q_min) / 2), eps)``, fixed ``z``.

        Before any input: ``scale=[1.], zero_point=[0]`` with a warning, as torch (``_unseen_qparams``)."""
        state = self._read_state()
        return self._unseen_qparams() if state is None else self._compute_qparams(state)

    def _unseen_qparams(self) -> QParams:
        warnings.warn(UNINITIALIZED_WARNING, UserWarning, stacklevel=3)
        xp = self._xp
        return QParams(xp.asarray([1.0], dtype=xp.float32, device=self._device),
                       xp.asarray([0], dtype=index_dtype(xp), device=self._device))

    # -- state dict: ``{"eps": (1,), "min_val": (), "max_val": ()}``, per channel ``(C,)`` (``(0,)`` before the
    # first input), float32, with torch's key names, order and shapes --------------------------------------
    def _unseen_state(self) -> MinMaxState:
        return self.init_state(0) if self._PER_CHANNEL else self.init_state()

    def _checked_entries(self, state_dict: Mapping[str, Any]) -> MinMaxState | None:
        """Shapes ``()`` per tensor or equal ``(C,)`` per channel (``C=0``: never updated); real dtypes; each
        ``min_val <= max_val`` unless NaN or never updated (``+inf``/``-inf``) (:func:`check_minmax_entries`)."""
        _, lo32, hi32 = check_minmax_entries(
            state_dict["eps"], state_dict["min_val"], state_dict["max_val"], per_channel=self._PER_CHANNEL,
            owner=type(self).__name__, disordered_ok=self._AVERAGING, finite=self._FINITE_RANGE,
        )
        return None if self._PER_CHANNEL and lo32.shape == (0,) else MinMaxState(lo32, hi32)

    def extra_repr(self) -> str:
        s = self._state
        return (
            f"dtype={self.dtype!r}, qscheme={self.qscheme.value!r}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, min_val={None if s is None else s.min_val}, "
            f"max_val={None if s is None else s.max_val}"
        )


class _MinMaxFamily(UniformQuantizationObserverBase):
    """torch.ao's four min/max observers: the checks of their arguments (``_setup``, what their public
    constructors forward to), the same on every framework; the storage is the framework's
    (``_init_uniform``/``_init_range``)."""

    def _setup(self, *, dtype: Any, qscheme: QScheme | str, reduce_range: bool, quant_min: int | None,
               quant_max: int | None, factory_kwargs: Mapping[str, Any] | None, eps: float, is_dynamic: bool,
               ignore_nonfinite: bool, averaging_constant: Any = None, ch_axis: Any = None, **backend: Any) -> None:
        owner = type(self).__name__
        constant = family.check_observer_args(
            owner, self._parse_qscheme(qscheme), per_channel=self._PER_CHANNEL, is_dynamic=is_dynamic,
            averaging=self._AVERAGING, averaging_constant=averaging_constant, ch_axis=ch_axis,
        )
        spec = self._init_uniform(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic,
                                  ignore_nonfinite=ignore_nonfinite, **backend)
        family.check_reduce_range(spec, reduce_range, owner)
        if self._PER_CHANNEL:
            self.ch_axis = int(ch_axis)
        self._init_range(factory_kwargs)
        if self._AVERAGING:
            self._configure(averaging_constant=constant)


class MinMaxObserver(_MinMaxFamily):
    """Running min/max per tensor: ``x_min = min(x_min, min(X))``, ``x_max = max(x_max, max(X))``;
    qparams as :meth:`calculate_qparams`. Same arguments as ``torch.ao.quantization.MinMaxObserver``."""

    def __init__(
        self,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min, quant_max=quant_max,
            factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic, ignore_nonfinite=ignore_nonfinite, **backend,
        )


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Moving average of the per-batch range: ``x_min = x_min + c * (min(X) - x_min)`` (likewise
    ``x_max``); the first input sets the range. ``c = averaging_constant`` in ``[0, 1]``."""

    _AVERAGING = True

    def __init__(
        self,
        averaging_constant: float = 0.01,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        factory_kwargs: Mapping[str, Any] | None = None,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant=averaging_constant, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
            quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic,
            ignore_nonfinite=ignore_nonfinite, **backend,
        )


class PerChannelMinMaxObserver(_MinMaxFamily):
    """Running min/max per channel along ``ch_axis`` (reducing every other axis); qparams per channel.
    The number of channels is learnt from the first input; ``ch_axis`` (negative counts from the end)
    is checked against each input's number of dimensions."""

    _PER_CHANNEL = True

    def __init__(
        self,
        ch_axis: int = 0,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_CHANNEL_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            ch_axis=ch_axis, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
            quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic,
            ignore_nonfinite=ignore_nonfinite, **backend,
        )

    def extra_repr(self) -> str:
        return f"ch_axis={self.ch_axis}, " + super().extra_repr()


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving average: ``x_min[c] = x_min[c] + a * (min(X[c]) - x_min[c])`` with
    ``a = averaging_constant`` in ``[0, 1]``; the first input sets the ranges."""

    _AVERAGING = True

    def __init__(
        self,
        averaging_constant: float = 0.01,
        ch_axis: int = 0,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_CHANNEL_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        factory_kwargs: Mapping[str, Any] | None = None,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant=averaging_constant, ch_axis=ch_axis, dtype=dtype, qscheme=qscheme,
            reduce_range=reduce_range, quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs,
            eps=eps, is_dynamic=is_dynamic, ignore_nonfinite=ignore_nonfinite, **backend,
        )


class FixedQParamsObserver(ObserverBase):
    """Fixed ``scale`` and ``zero_point`` (shape ``(1,)``, float32 / int32); ``__call__`` returns its input."""

    def __init__(
        self,
        scale: float,
        zero_point: int,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
        quant_min: int = 0,
        quant_max: int = 255,
        is_dynamic: bool = False,
        *,
        xp: Any = None,
        device: Any = None,
    ) -> None:
        spec, scale_arr, zp_arr = check_fixed_observer(scale, zero_point, dtype=dtype, qscheme=qscheme,
                                                       quant_min=quant_min, quant_max=quant_max, is_dynamic=is_dynamic)
        super().__init__(spec.dtype, False, xp=xp, device=device)
        self.qscheme = spec.qscheme
        self.quant_min, self.quant_max = spec.quant_min, spec.quant_max
        self._scale, self._zero_point = self._to_arrays(scale_arr, zp_arr, None)

    def _to_arrays(self, s: np.ndarray, z: np.ndarray, like: Array | None) -> tuple[Array, Array]:
        return self._place(s, self._xp.float32, like), self._place(z, self._xp.int32, like)

    def calculate_qparams(self) -> QParams:
        return QParams(self._scale, self._zero_point)

    def state_dict(self) -> dict[str, Array]:
        return {"scale": self._scale, "zero_point": self._zero_point}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load ``scale`` (one positive float) and ``zero_point`` (one integer in the range)."""
        check_keys(state_dict, ("scale", "zero_point"), "FixedQParamsObserver")
        s, z = check_fixed_qparams(state_dict["scale"], state_dict["zero_point"], self.quant_min, self.quant_max,
                                   loaded=True)
        self._scale, self._zero_point = self._to_arrays(s, z, self._scale)

    def extra_repr(self) -> str:
        return f"scale={self._scale}, zero_point={self._zero_point}, dtype={self.dtype!r}"


class PlaceholderObserver(ObserverBase):
    """Observes nothing; carries a configuration (``dtype`` may be a float dtype name such as
    ``"float16"``). ``calculate_qparams`` raises, as in torch."""

    def __init__(
        self,
        dtype: Any = "float32",
        custom_op_name: str = "",
        compute_dtype: Any = None,
        quant_min: int | None = None,
        quant_max: int | None = None,
        qscheme: QScheme | str | None = None,
        eps: float | None = None,
        is_dynamic: bool = False,
        *,
        xp: Any = None,
    ) -> None:
        super().__init__(dtype, bool(is_dynamic) or bool(compute_dtype), xp=xp)
        self.custom_op = custom_op_name
        self.compute_dtype = compute_dtype
        self.quant_min, self.quant_max = quant_min, quant_max
        self.qscheme = QScheme.PER_TENSOR_AFFINE if qscheme is None else QScheme.parse(qscheme)
        self.eps = FLOAT32_EPS if eps is None else check_float(eps, "eps")

    def calculate_qparams(self) -> QParams:
        raise RuntimeError(f"calculate_qparams should not be called for {type(self).__name__}")

    def state_dict(self) -> dict[str, Array]:
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        check_keys(state_dict, (), type(self).__name__)


class NoopObserver(PlaceholderObserver):
    """Observes nothing (default ``dtype="float16"``); ``calculate_qparams`` raises, as in torch."""

    def __init__(self, dtype: Any = "float16", custom_op_name: str = "", *, xp: Any = None) -> None:
        super().__init__(dtype, custom_op_name, xp=xp)
