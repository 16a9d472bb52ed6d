"""The torch storage of the observers (:class:`TorchModule`, :class:`TorchBuffers`, :class:`TorchRange`,
:class:`TorchPerChannel`): what torch.ao's drop-in needs beside the generic classes of ``_array_*.py``,
in one place: ``nn.Module``'s call, repr and state dicts, registered buffers written in place, torch's dtype
and qscheme objects, state-dict versions and checked loads (:func:`all_or_nothing`), torch's host-side
qparams checks. The public classes combine them in :mod:`observers_core.adapters.torch`; the tensors
themselves are :mod:`._torch_backend`'s."""

from __future__ import annotations

import functools
import numbers
import sys
import warnings
from collections import OrderedDict

import numpy as np
import torch
from torch.ao.quantization import observer as _torch_observer

from .. import (
    MinMaxState,
    QuantSpec,
    calculate_qparams,
    minmax_init,
    quant_spec,
    validate_qmin_qmax,
)
from .._dtypes import check_int32_zero_points
from .._qparams import UNINITIALIZED_WARNING
from .._state_dict import check_minmax_entries
from .._validate import INF, check_bool
from ..families import minmax as minmax_family
from . import _array_observers as _base
from ._torch_backend import TORCH, TORCH_DTYPES, TORCH_QSCHEMES, to_core_dtype, to_core_qscheme
from ._torch_distributed import SyncMixin
from ._torch_pt2e import link_torchao


#: torch's observer base: ``with_args``/``with_callable_args`` come from it.
ObserverBase = _torch_observer.ObserverBase


_FLOAT32_EPS = torch.finfo(torch.float32).eps


def _user_strict() -> bool:
    """The ``strict`` of the ``nn.Module.load_state_dict`` call under way, read from its frame (torch passes
    ``True`` to every module's ``_load_from_state_dict`` whatever the caller chose); ``True`` when none is
    found (a direct ``_load_from_state_dict`` call)."""
    code = torch.nn.Module.load_state_dict.__code__
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return True if frame is None else bool(frame.f_locals.get("strict", True))


def all_or_nothing(load):
    """For a torch observer's ``_load_from_state_dict``: a load that fails leaves the buffers as they were
    (and, outside ``torch.inference_mode()``, buffers made under it are normal copies first, which torch's
    in-place load can write).
    torch copies the entries present before ``load_state_dict(strict=True)`` raises for the missing or
    unexpected ones; here, when this module's own keys are missing or unexpected in a strict load, or a check
    raises, its buffers are restored. A ``strict=False`` load copies the entries present, as torch's does,
    and the state they make with the buffers kept is then checked as a whole load would be. Nested overrides
    (``super()`` calls) are guarded once, by the outermost."""

    @functools.wraps(load)
    def guarded(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        if self.__dict__.get("_loading_state", False):
            return load(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if not torch.is_inference_mode_enabled():  # torch's load copies in place: no buffer made under the mode
            for name, buf in self._buffers.items():
                if buf is not None and buf.is_inference():
                    self._buffers[name] = buf.clone()
        saved = {name: buf.detach().clone() for name, buf in self._buffers.items() if buf is not None}
        keys_before = len(missing_keys) + len(unexpected_keys)
        self.__dict__["_loading_state"] = True
        try:
            load(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
            if len(missing_keys) + len(unexpected_keys) > keys_before:
                if _user_strict():
                    self._buffers.update(saved)
                else:  # the partial load's result, checked by loading it whole
                    whole = {prefix + k: v.detach().clone() for k, v in self.state_dict().items()}
                    load(self, whole, prefix, {"version": self._version}, strict, [], [], [])
        except BaseException:
            self._buffers.update(saved)
            raise
        finally:
            self.__dict__["_loading_state"] = False

    return guarded


class EagerOnly:
    """A torch observer whose ``forward`` runs the core in Python: ``torch.jit.script`` (of it or of a model
    holding it) refuses it at once with a ``TypeError`` that says so, instead of failing inside the
    compiler on an annotation (torch.ao's observers are scriptable, for torch's deprecated TorchScript
    quantization flow)."""

    def __prepare_scriptable__(self):
        raise TypeError(
            f"{type(self).__name__} cannot be compiled by torch.jit.script: its forward runs observers_core's "
            "Python core. Use it eagerly, in FX (prepare_fx) or in torchao's PT2E flow (prepare_pt2e)"
        )


class RangeBuffers:
    """The statistics' storage of the torch observers with a range: the buffers ``min_val``/``max_val``
    (empty before a per-channel or low-bit observer's first batch), read and written by the observe step
    (:class:`~observers_core.adapters._array_observers.ObserveLoop`)."""

    _RANGE = ("min_val", "max_val")

    def _check_input(self, x_orig) -> torch.Tensor:
        """``x`` detached, on the buffers' device, real (:meth:`TorchBackend.checked_input`)."""
        return TORCH.checked_input(x_orig, self._buffers["min_val"])

    def _read_state(self) -> MinMaxState | None:
        """The buffers as the state (``None``: empty buffers, nothing seen)."""
        buffers = self._buffers  # one dict lookup instead of nn.Module.__getattr__ per access
        min_val = buffers["min_val"]
        return None if min_val.numel() == 0 else MinMaxState(min_val, buffers["max_val"])

    def _write_state(self, state: MinMaxState) -> None:
        """The state written into the buffers in place (resized first where a shape differs). A buffer made
        under ``torch.inference_mode()``, which torch forbids updating in place once the mode is off, is
        replaced by a copy of the value instead."""
        buffers = self._buffers
        for name, value in zip(self._RANGE, state):
            buffer = buffers[name]
            if buffer.shape != value.shape:
                buffer = self._resize_buffer(name, value.shape)
            try:
                buffer.copy_(value)
            except RuntimeError:
                if not buffer.is_inference():
                    raise
                buffers[name] = value.clone()

    def _resize_buffer(self, name: str, shape) -> torch.Tensor:
        """The buffer ``name`` resized in place as torch does, or replaced by a new one (same dtype and
        device) where its storage cannot be resized (pinned, shared or borrowed from NumPy)."""
        buffer = self._buffers[name]
        try:
            if buffer.is_shared():  # torch's resize_ of shared storage crashes the process (segfault)
                raise RuntimeError("shared storage")
            buffer.resize_(shape)
        except RuntimeError:
            self._buffers[name] = buffer = torch.empty(shape, dtype=buffer.dtype, device=buffer.device)
        return buffer

    def _fit_to_loaded(self, state_dict, prefix: str) -> None:
        """Before a per-channel load: the range buffers resized to the saved ``(C,)`` entries (the
        buffers are empty before the first batch, and C may differ); entries of another framework
        (NumPy, JAX, CuPy) are made tensors first."""
        TORCH.entries(state_dict, prefix, self._RANGE)
        for name in self._RANGE:
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and value.dim() == 1 and self._buffers[name].shape != value.shape:
                self._resize_buffer(name, value.shape)

    def _empty_buffers(self, names=_RANGE, dtype: torch.dtype | None = None) -> None:
        """The buffers ``names`` replaced by empty ones on their devices (their dtype, or ``dtype``)."""
        for name in names:
            buffer = self._buffers[name]
            self._buffers[name] = torch.empty(0, dtype=buffer.dtype if dtype is None else dtype, device=buffer.device)


def buffer_attribute(name: str) -> property:
    """The registered buffer ``name`` (``AttributeError`` while none is registered, so that
    ``register_buffer`` can create it): it shadows the array observers' property of that name."""

    def get(self):
        try:
            return self._buffers[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None

    return property(get, doc=f"The ``{name}`` buffer.")


class TorchModule(SyncMixin, RangeBuffers, EagerOnly):
    """What every torch observer of ours takes from ``nn.Module`` where the generic observers (plain Python
    objects) have their own: ``__call__`` (hooks), ``__repr__``, ``state_dict``/``load_state_dict`` (through
    ``_load_from_state_dict``), the buffers ``min_val``/``max_val`` as attributes; the steps run on
    :data:`TORCH`; ``forward`` is the observe step over the buffers (:class:`RangeBuffers`)."""

    _backend = TORCH
    _device = None

    __call__ = torch.nn.Module.__call__
    __repr__ = torch.nn.Module.__repr__
    # torch.ao's configuration attributes are assignable (re-read at each call): not the generic classes'
    # read-only guard (``_READ_ONLY``)
    __setattr__ = torch.nn.Module.__setattr__
    __delattr__ = torch.nn.Module.__delattr__
    state_dict = torch.nn.Module.state_dict
    load_state_dict = torch.nn.Module.load_state_dict
    min_val = buffer_attribute("min_val")
    max_val = buffer_attribute("max_val")

    def forward(self, x_orig):
        r"""Records ``x`` (with ``sync``, every rank's ``x``) in the statistics; returns ``x`` itself.
        Errors leave the buffers untouched."""
        return self._observe_input(x_orig)

    def _state_or_empty(self):
        return self._read_state()


class TorchBuffers(TorchModule):
    r"""The torch storage of an observer (the einops pattern: ``class MinMaxObserver(TorchRange,
    generic.MinMaxObserver, UniformQuantizationObserverBase)``): the generic class of
    :mod:`._array_observers` owns the signature and its checks, this mixin what torch.ao's drop-in needs.

    - ``nn.Module`` wins where the array observers have their own: ``__call__``, ``__repr__``,
      ``state_dict``/``load_state_dict`` (with ``_load_from_state_dict``: torch's versions, checked loads);
    - the configuration as torch.ao stores it (:meth:`_init_uniform`): torch's dtype and qscheme objects,
      ``quant_min``/``quant_max`` re-read at each call, the ``eps`` buffer, ``reduce_range``'s warning;
    - the statistics in registered buffers (``min_val``/``max_val``: 0-d per tensor, empty before a
      per-channel observer's first batch) written in place (:class:`RangeBuffers`);
    - torch's host-side qparams checks (:meth:`_calculate_qparams`) and the faster min/max step
      (``TORCH.fast_xp``, channel axis first as torch reduces).

    Every class takes the keyword-only ``sync=False`` and ``process_group=None`` (distributed
    calibration): with ``sync=True`` each ``forward`` reduces the batch statistics across the group
    (``None``: the default group) before the update, so every rank holds the state of one process
    that saw the concatenation of all ranks' batches (see :mod:`observers_core.adapters.torch`).
    """

    # Version 1/None: no ``eps`` buffer. Version 2: ``eps``. Version 3: per-channel buffers renamed
    # ``min_vals``/``max_vals`` -> ``min_val``/``max_val`` (and histogram's uninitialised shape).
    _version = 3
    eps = buffer_attribute("eps")
    _parse_qscheme = staticmethod(to_core_qscheme)
    _parse_dtype = staticmethod(to_core_dtype)

    def _init_uniform(self, dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic, *,
                      ignore_nonfinite, sync=False, process_group=None, **unknown) -> QuantSpec:
        """torch.ao's configuration: ``nn.Module``'s init, torch's dtype/qscheme objects as attributes, the
        ``eps`` buffer (``factory_kwargs``: torch's), ``reduce_range``'s deprecation warning, ``sync``."""
        _base.refuse_unknown(type(self).__name__, unknown)
        link_torchao()
        spec = quant_spec(to_core_dtype(dtype), to_core_qscheme(qscheme), reduce_range=reduce_range,
                          quant_min=quant_min, quant_max=quant_max, eps=eps)
        ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
        factory_kwargs = TORCH.factory_kwargs(factory_kwargs)
        ObserverBase.__init__(self, dtype=TORCH_DTYPES[spec.dtype], is_dynamic=is_dynamic)
        self.qscheme = TORCH_QSCHEMES[spec.qscheme]
        if reduce_range:
            warnings.warn(
                "Please use quant_min and quant_max to specify the range for observers. \
                    reduce_range will be deprecated in a future release of PyTorch.",
                stacklevel=4,
            )
        self.reduce_range = reduce_range
        self.register_buffer("eps", torch.tensor([eps], **factory_kwargs))
        self.has_customized_qrange = spec.has_customized_qrange
        self.quant_min, self.quant_max = spec.quant_min, spec.quant_max
        self.ignore_nonfinite = ignore_nonfinite
        self._init_sync(sync, process_group)
        return spec

    def _init_range(self, factory_kwargs) -> None:
        """The buffers ``min_val``/``max_val``: ``inf``/``-inf`` per tensor, empty per channel."""
        factory_kwargs = TORCH.factory_kwargs(factory_kwargs)
        per_channel = self._PER_CHANNEL
        self.register_buffer("min_val", torch.tensor([] if per_channel else INF, **factory_kwargs))
        self.register_buffer("max_val", torch.tensor([] if per_channel else -INF, **factory_kwargs))

    def __setstate__(self, state):
        # Pickles written before ``ignore_nonfinite`` existed get the default.
        super().__setstate__(state)
        self.__dict__.setdefault("ignore_nonfinite", False)

    # -- shared helpers ---------------------------------------------------------------------------

    def _current_spec(self) -> QuantSpec:
        return self._quant_spec()

    def _quant_spec(self, eps: float | None = None) -> QuantSpec:
        """The core's spec from the current attributes and the ``eps`` buffer (or ``eps``: at construction,
        where the buffer may be on the meta device) (torch reads them at call time too, so later changes to
        ``quant_min`` etc. are honoured, and checked: integers, zero points within int32, where torch would
        use a float bound or overflow)."""
        for name in ("quant_min", "quant_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r} (set after construction)")
        if self.quant_min > self.quant_max:
            raise ValueError(f"quant_min={self.quant_min} must be <= quant_max={self.quant_max} (set after construction)")
        spec = QuantSpec(
            to_core_dtype(self.dtype),
            to_core_qscheme(self.qscheme),
            int(self.quant_min),
            int(self.quant_max),
            bool(self.has_customized_qrange),
            float(self.eps.reshape(-1)[0]) if eps is None else float(eps),
        )
        check_int32_zero_points(spec, f"quant_min={spec.quant_min}, quant_max={spec.quant_max} (set after construction)")
        return spec

    def _calculate_qparams(self, min_val: torch.Tensor, max_val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and zero point of ``[min_val, max_val]`` (core ``calculate_qparams``), with torch's
        host-side checks: nothing observed -> warning and ``(tensor([1.]), tensor([0]))``;
        ``min_val > max_val`` -> ``ValueError``."""
        if min_val.numel() == 0 or max_val.numel() == 0:
            return self._default_qparams(min_val)
        unseen = (min_val == INF) & (max_val == -INF)
        if (min_val.dim() == 0 or max_val.dim() == 0) and bool(unseen.all()):
            return self._default_qparams(min_val)
        if bool(((min_val > max_val) & ~unseen).any()):
            raise ValueError(f"min_val={min_val} must be less than or equal to max_val={max_val}")
        if bool(unseen.any()):
            warnings.warn(
                "some channels have seen no finite value; they get scale 1 and zero point 0", stacklevel=3
            )
        scale, zero_point = calculate_qparams(min_val, max_val, self._quant_spec(), xp=TORCH.fast_xp)
        return scale, zero_point

    @staticmethod
    def _default_qparams(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        warnings.warn(UNINITIALIZED_WARNING, stacklevel=4)
        device = like.device.type
        return torch.tensor([1.0], device=device), torch.tensor([0], device=device)

    def _unseen_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # the generic calculate_qparams' hooks
        return self._default_qparams(self._buffers["min_val"])

    def _compute_qparams(self, state: MinMaxState) -> tuple[torch.Tensor, torch.Tensor]:
        return self._calculate_qparams(*state)

    def _validate_qmin_qmax(self, quant_min: int, quant_max: int) -> None:
        """``ValueError`` unless ``quant_min <= 0 <= quant_max`` and ``quant_min < quant_max``."""
        validate_qmin_qmax(quant_min, quant_max)

    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        version = local_metadata.get("version", None)
        if (version is None or version == 1) and prefix + "eps" not in state_dict:
            # eps became a buffer in version 2
            state_dict[prefix + "eps"] = torch.tensor([_FLOAT32_EPS])
        self._check_loaded(state_dict, prefix)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _check_loaded(self, state_dict, prefix) -> None:
        """Before anything is loaded: entries of another framework (numpy, JAX, CuPy, array_api_strict)
        become tensors, and ``eps``/``min_val``/``max_val`` pass the checks every adapter applies
        (:func:`observers_core._state_dict.check_minmax_entries`); ``ValueError``/``TypeError``
        otherwise, with the buffers untouched."""
        keys = TORCH.entries(state_dict, prefix, ("eps", "min_val", "max_val"))
        if all(key in state_dict for key in keys):
            check_minmax_entries(
                *(state_dict[key] for key in keys), per_channel=self.min_val.ndim == 1, owner=type(self).__name__,
                disordered_ok=self._AVERAGING, finite=self._FINITE_RANGE,
            )

    def _repr_suffix(self) -> str:
        return (", ignore_nonfinite=True" if self.ignore_nonfinite else "") + (", sync=True" if self.sync else "")

    # -- the observe step's storage: the buffers ------------------------------------------------------
    def _new_state(self, x: torch.Tensor, channels: int | None) -> MinMaxState:
        like = self._buffers["min_val"]
        return minmax_init(num_channels=channels, dtype=like.dtype, device=like.device, xp=TORCH.fast_xp)

    def _compute_update(self, state: MinMaxState, x: torch.Tensor, axis: int | None, collective) -> MinMaxState:
        """One step of the min/max family (:func:`observers_core.families.minmax.step`). Per channel the
        channel axis is swapped to the front first, as torch does, so that the reduction visits the
        elements in torch's order (which of -0.0 and 0.0 is the minimum depends on it)."""
        constant = None
        if self._AVERAGING:  # read at each batch, as torch does; what torch's arithmetic refuses, refused
            constant = self.averaging_constant  # (None would silently switch to the running range)
            if not isinstance(constant, (numbers.Real, torch.Tensor)):
                raise TypeError(f"averaging_constant must be a real number, got {type(constant).__name__} "
                                f"{constant!r} (set after construction)")
            constant = float(constant)  # (True and 0-d tensors, which torch's arithmetic takes)
        if axis is not None and axis != 0:
            dims = list(range(x.ndim))
            dims[0], dims[axis] = axis, 0
            x, axis = x.permute(dims), 0
        return minmax_family.step(
            state, x, axis=axis, averaging_constant=constant,
            ignore_nonfinite=self.ignore_nonfinite, collective=collective, xp=TORCH.fast_xp,
        )

    def reset_min_max_vals(self):
        raise NotImplementedError("Cannot reset min/max values in the given observer.")

    def extra_repr(self):
        return self._repr_suffix().removeprefix(", ")


class TorchRange:
    """The min/max observers' reset and repr (torch.ao's base class refuses the reset)."""

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + self._repr_suffix()

    def reset_min_max_vals(self):
        """Resets the range to "nothing observed": ``inf``/``-inf`` per tensor, empty buffers per channel (dtype
        and device kept, the channel count forgotten)."""
        if self._PER_CHANNEL:
            self._empty_buffers()
        else:
            self.min_val.fill_(INF)
            self.max_val.fill_(-INF)


class TorchPerChannel(TorchRange):
    """Per channel: qparams of the (C,) buffers; state dicts of torch's versions load."""

    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        version = local_metadata.get("version")
        if version is not None and version < 3:
            # Before version 3 the buffers were called min_vals/max_vals.
            for old, new in (("min_vals", "min_val"), ("max_vals", "max_val")):
                if prefix + old in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
        self._check_loaded(state_dict, prefix)
        self._fit_to_loaded(state_dict, prefix)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _load_from_state_dict_script(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        self._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )



# -- state dicts ----------------------------------------------------------------------------------


def get_observer_state_dict(mod: torch.nn.Module) -> OrderedDict:
    r"""The observer statistics of ``mod``: the state_dict entries whose key contains
    ``activation_post_process`` (``observer`` for scripted modules), with the state_dict's version
    metadata, for our observers and torch's alike."""
    return _torch_observer.get_observer_state_dict(mod)


def load_observer_state_dict(mod: torch.nn.Module, obs_dict: dict) -> None:
    r"""Loads ``obs_dict`` (from :func:`get_observer_state_dict`) into the observers of ``mod``.

    Unlike torch's function, this one uses the saved version metadata (so a saved ``eps`` is kept),
    leaves ``obs_dict`` unmodified, and raises ``ValueError`` for missing or unexpected observer keys
    and for shape errors instead of skipping them. Per-channel buffers are resized as needed.
    """
    if isinstance(mod, torch.jit.RecursiveScriptModule):
        _torch_observer.load_observer_state_dict(mod, obs_dict)
        return
    metadata = getattr(obs_dict, "_metadata", None) or {}
    state = OrderedDict(obs_dict)  # the loaders may add or rename keys
    missing: list[str] = []
    unexpected: list[str] = []
    errors: list[str] = []
    for name, module in mod.named_modules():
        if not _torch_observer._is_activation_post_process(module):
            continue
        prefix = name + "." if name else ""
        module._load_from_state_dict(state, prefix, dict(metadata.get(name, {})), True, missing, unexpected, errors)

    def _is_observer_key(key: str) -> bool:
        return "observer" in key or "activation_post_process" in key

    problems = [f"missing key {k!r}" for k in missing if _is_observer_key(k)]
    problems += [f"unexpected key {k!r}" for k in unexpected if _is_observer_key(k)]
    problems += errors
    if problems:
        raise ValueError("obs_dict does not fit the observers of mod: " + "; ".join(problems))
