"""Calibration observers (Horizon ``observer_v2``: KL, MSE, percentile, mix) over one array namespace.

Used directly (``xp=numpy`` by default, or ``array_api_strict``) they are plain NumPy observers;
``observers_core.adapters.jax`` and ``.cupy`` subclass them on their backend (``jax.jit``, devices), and
``observers_core.adapters.torch`` runs the same pure steps of :mod:`observers_core.families.calibration`
(``make_config``, ``batch_update``, ``kl_init``, ``kl_accumulate``, ``kl_update``) behind ``nn.Module``
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
  finite value leaves the statistics as they are. A float64 batch is observed as float32, so a value beyond
  float32's range is skipped too. Empty inputs are no-ops (and no KL step).
- ``is_sync_quantize=True`` raises ``NotImplementedError``: a stateful call here syncs nothing. Sync a
  step through the pure ``update(state, x, collective=...)`` (JAX: ``axis_name=`` inside
  ``shard_map``/``pmap``); the torch observers take the flag (``torch.distributed``).
- Histograms are not saved (as in Horizon): the state dict holds ``eps``, ``min_val`` and ``max_val``.
- ``bins`` must be at least the number of levels ``|x|`` reaches (128 for ``qint8`` symmetric) and at
  most ``2**24``;
  ``MSEObserver`` and ``MixObserver`` take ``bins`` (default 2048) as a keyword-only extension.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from observers_core._calibration import CalibHistogram
from observers_core._dtypes import FLOAT32_EPS, QScheme
from observers_core._minmax import MinMaxState
from observers_core._namespace import size
from observers_core.families.calibration import (
    KLAccumulator,
    KLState,
    batch_update,
    check_accumulator_channels,
    describe,
    kl_accumulate,
    kl_channels_differ,
    kl_init,
    kl_pending_message,
    kl_state_init,
    kl_state_update,
    kl_update,
    make_config,
    with_spec,
)

from ._array_observers import UniformQuantizationObserverBase, read_only, refuse_unknown

__all__ = ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"]

Array = Any

# ------------------------------------------------------------- the observe steps, every framework


class CalibrationSteps:
    """The Percentile/MSE/Mix observe step of every framework (the array observers here, the torch
    ones in ``adapters.torch``): ``batch_update`` of the batch through ``_compute_batch``, the averaged
    range committed through ``_write_state`` and the Mix pick kept in ``last_choice``. The averaged range is
    finite (``+inf``/``-inf`` before any value), so loaded ranges must be too."""

    _FINITE_RANGE = True

    def _observe(self, state: MinMaxState, x: Array, axis: int | None, collective: Any) -> None:
        new, self.last_choice = self._compute_batch(state, x, axis, collective)
        self._write_state(new)


class KLSteps(CalibrationSteps):
    """KLObserver's observe step of every framework: ``x`` counted into the accumulator
    (``_read_accumulator``/``_write_accumulator``, a fresh ``_new_accumulator`` first); every
    ``update_interval``-th batch the KL update of the averaged range (``_kl_batch`` runs both)."""

    def _fitting_accumulator(self, acc: KLAccumulator | None, x: Array, axis: int | None) -> KLAccumulator:
        """``acc`` (a new one for ``None``) after checking that ``x`` has its channel count."""
        channels = None if axis is None else x.shape[axis]
        acc = acc if acc is not None else self._new_accumulator(x, channels)
        check_accumulator_channels(acc, channels, self.ch_axis)
        return acc

    def calculate_qparams(self) -> Any:
        """``calculate_qparams(x_min, x_max)`` of the averaged KL range. Before the first KL update (since
        construction or ``reset_min_max_vals``, and no range loaded): a warning that says so and the
        defaults ``scale=[1.], zero_point=[0]``."""
        if not getattr(self, "_kl_ran", False) and self._nothing_seen():
            with warnings.catch_warnings():  # one warning, ours, instead of the base's generic one
                warnings.simplefilter("ignore")
                default = super().calculate_qparams()
            warnings.warn(kl_pending_message(type(self).__name__, self.num_steps, self.config.update_interval),
                          UserWarning, stacklevel=2)
            return default
        return super().calculate_qparams()

    def _nothing_seen(self) -> bool:
        """Whether no averaged range is held (the array observers write one at each KL update or load, and
        never read their state on the host here; the torch ones read their buffers)."""
        return self._read_state() is None

    def _observe(self, state: MinMaxState, x: Array, axis: int | None, collective: Any) -> None:
        acc = self._fitting_accumulator(self._read_accumulator(), x, axis)
        kl_due = (self.num_steps + 1) % self.config.update_interval == 0
        acc, new = self._kl_batch(state, acc, x, axis, kl_due, collective)
        self._write_accumulator(acc)
        self.num_steps += 1
        if new is not None:
            self._write_state(new)
            self._kl_ran = True


def _kl_step(state, acc, x, *, axis, config, update, collective, xp):
    """KLObserver's batch: ``kl_accumulate``, then (``update``) ``kl_update``."""
    acc = kl_accumulate(acc, x, axis=axis, xp=xp, collective=collective)
    return acc, (kl_update(state, acc, config=config, xp=xp) if update else None)


# ---------------------------------------------------------------------------------------- classes


#: ``_setup``'s method keywords, each class's constructor passing its own (``_OPTIONS``); the others' defaults
METHOD_DEFAULTS = {"percentile": 99.99, "stride": 1, "update_interval": 1}
NOT_GIVEN: Any = object()


def method_options(owner: str, own: tuple[str, ...], **given: Any) -> dict[str, Any]:
    """The method keywords for :func:`make_config`: ``own`` (the class's) as given, the others at their defaults;
    ``TypeError`` for another class's keyword given (``KLObserver(percentile=...)`` was silently ignored)."""
    refuse_unknown(owner, {k: v for k, v in given.items() if v is not NOT_GIVEN and k not in own})
    return {k: METHOD_DEFAULTS[k] if v is NOT_GIVEN else v for k, v in given.items()}


class _CalibrationObserver(CalibrationSteps, UniformQuantizationObserverBase):
    """Shared by the four observers: configuration and the per-batch step (``batch_update`` of the
    core, run by the backend). ``_setup`` is what the public constructors call (every framework's
    class and the torch one inherit this class's constructor)."""

    _READ_ONLY = UniformQuantizationObserverBase._READ_ONLY | {"config"}
    _METHOD = ""
    #: the method keywords (of ``percentile``, ``stride``, ``update_interval``) the public constructor takes
    _OPTIONS: tuple[str, ...] = ()

    def _setup(
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
        percentile: float = NOT_GIVEN,
        stride: int = NOT_GIVEN,
        update_interval: int = NOT_GIVEN,
        **backend: Any,
    ) -> None:
        """The checks of every framework (Horizon's arguments, then the framework's: ``_calibration_backend``),
        the storage the framework's (``_init_uniform``, ``_init_range``)."""
        owner = type(self).__name__
        backend, is_sync_quantize = self._calibration_backend(owner, is_sync_quantize, backend)
        options = method_options(owner, self._OPTIONS, percentile=percentile, stride=stride,
                                 update_interval=update_interval)
        config, per_channel = make_config(
            owner, self._METHOD, dtype=self._parse_dtype(dtype), qscheme=self._parse_qscheme(qscheme),
            quant_min=quant_min, quant_max=quant_max, ch_axis=ch_axis, averaging_constant=averaging_constant,
            bins=bins, is_sync_quantize=is_sync_quantize, **options,
        )
        self._PER_CHANNEL = per_channel  # per instance: Horizon chooses by ch_axis
        # ignore_nonfinite: the searches always skip NaN/Inf (not an argument: Horizon's signature)
        spec = self._init_uniform(dtype, qscheme, False, quant_min, quant_max, factory_kwargs,
                                  backend.pop("eps", FLOAT32_EPS), backend.pop("is_dynamic", False),
                                  ignore_nonfinite=True, **backend)
        #: the validated, hashable calibration configuration (a ``CalibConfig``); its quantizer's ``eps`` is
        #: the observer's (torch: the ``eps`` argument, which Horizon's signature does not have)
        self._configure(config=dataclasses.replace(config, spec=dataclasses.replace(config.spec, eps=float(np.float32(spec.eps)))))
        self._configure(averaging_constant=self.config.averaging_constant)
        self.ch_axis = int(ch_axis)
        self.last_choice: Array | None = None
        self._init_range(factory_kwargs)

    def _calibration_backend(self, owner: str, is_sync_quantize: Any, backend: dict) -> tuple[dict, Any]:
        """The framework's own keywords (here ``xp``; any other is a ``TypeError``) and the
        ``is_sync_quantize`` that :func:`make_config` checks (here as given: ``True`` is refused, a stateful
        call syncs nothing; the torch observers sync through ``torch.distributed``)."""
        refuse_unknown(owner, {k: v for k, v in backend.items() if k != "xp"})
        self.is_sync_quantize = False
        return backend, is_sync_quantize

    # -- the core's steps, through the backend -------------------------------------------------
    def _search_config(self) -> Any:
        """The configuration the steps use (here ``config``; torch re-reads its assignable attributes)."""
        return self.config

    def _compute_batch(self, state: MinMaxState, x: Array, axis: int | None,
                       collective: Any = None) -> tuple[MinMaxState, Array | None]:
        return self._backend.run(batch_update, state, x, axis=axis, config=self._search_config(), xp=self._xp,
                                 collective=collective)  # fmt: skip

    def _compute_update(self, state: MinMaxState, x: Array, axis: int | None, collective: Any = None) -> MinMaxState:
        return self._compute_batch(state, x, axis, collective)[0]

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The base's load (``eps``, ``min_val``, ``max_val``, checked first); a loaded ``eps`` reaches the
        searches (the MSE candidates' quantizer) as it does ``calculate_qparams``."""
        super().load_state_dict(state_dict)
        self._configure(config=with_spec(self.config, self._spec))

    def reset_min_max_vals(self) -> None:
        """Forget everything seen (per channel, the channel count too)."""
        super().reset_min_max_vals()
        self.last_choice = None

    def extra_repr(self) -> str:
        s = self._state
        return (
            describe(self.config, self.ch_axis)
            + f", min_val={None if s is None else s.min_val}, max_val={None if s is None else s.max_val}"
        )


class PercentileObserver(_CalibrationObserver):
    """Per batch, ``amax`` = the ``percentile`` of ``|x|`` (:func:`~observers_core.percentile_range` of
    a ``bins``-bin histogram: the left edge of the bin where the cumulative count reaches it); the
    range ``clip([min(X), max(X)], -amax, amax)`` is moving-averaged:
    ``x_min = x_min + c * (lo - x_min)``. Horizon's signature; see the module docstring."""

    _METHOD = "percentile"
    _OPTIONS = ("percentile",)

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
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, percentile=percentile, **backend,
        )


class MSEObserver(_CalibrationObserver):
    """Per batch, ``amax`` = the bin center of least expected squared error
    ``E(amax) = sum_j h_j (fq(c_j) - c_j)**2 / sum_j h_j`` over a ``bins``-bin histogram of ``|x|``
    (:func:`~observers_core.mse_threshold`, candidates every ``stride`` bins); the clipped range is
    moving-averaged. Horizon's signature plus keyword-only ``bins``."""

    _METHOD = "mse"
    _OPTIONS = ("stride",)

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
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, stride=stride, **backend,
        )


class MixObserver(_CalibrationObserver):
    """Per batch, the candidates ``minmax``, ``percentile``, ``kl`` and ``mse`` (:data:`MIX_CANDIDATES`)
    each give a clipped range; the one whose qparams fake-quantize the batch with the least squared
    error wins (per channel; the first among equals) and is moving-averaged. ``last_choice`` holds the
    winners' indices. Horizon's signature plus keyword-only ``bins``, ``percentile`` and ``stride``."""

    _METHOD = "mix"
    _OPTIONS = ("percentile", "stride")

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
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, percentile=percentile, stride=stride, **backend,
        )


class KLObserver(KLSteps, _CalibrationObserver):
    """Accumulates a ``bins``-bin histogram of ``|x|`` and the finite range over every batch; every
    ``update_interval``-th batch, ``amax`` = :func:`~observers_core.kl_threshold` of the accumulated
    histogram (TensorRT's entropy calibration with ``num_levels`` = the levels ``|x|`` reaches) and the
    accumulated range clipped to ``[-amax, amax]`` is moving-averaged into ``min_val``/``max_val`` (the
    first KL update initialises). Before it, ``calculate_qparams`` warns and returns ``scale=1,
    zero_point=0``. Horizon's signature. The pure step is ``update(state, x)`` over a
    :class:`~observers_core.families.calibration.KLState` (the accumulator and the batch count are part of
    it); ``accumulate(acc, x)`` and ``kl_step(state, acc)`` are its two halves."""

    _METHOD = "kl"
    _OPTIONS = ("update_interval",)

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
        **backend: Any,
    ) -> None:
        self._setup(
            averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize, factory_kwargs,
            bins=bins, update_interval=update_interval, **backend,
        )

    def _setup(self, *args: Any, **kwargs: Any) -> None:
        super()._setup(*args, **kwargs)
        self.num_steps = 0
        self._init_accumulator()

    def _init_accumulator(self) -> None:
        """The accumulator's storage (here ``_acc``, ``None`` until the first batch; torch: buffers)."""
        self._acc: KLAccumulator | None = None

    update_interval = property(lambda self: self.config.update_interval, doc="Batches between KL updates.")
    accumulator = read_only(
        "_acc", "The accumulated histogram and range (``None`` before the first batch; not in the state dict)."
    )

    # -- the core's steps, through the backend -------------------------------------------------
    def _make_accumulator(self, num_channels: int | None) -> Any:
        return lambda device: kl_init(num_channels, bins=self.config.bins, device=device, xp=self._xp)

    def _read_accumulator(self) -> KLAccumulator | None:
        return self._acc

    def _write_accumulator(self, acc: KLAccumulator) -> None:
        self._acc = acc

    def _new_accumulator(self, x: Array, num_channels: int | None) -> KLAccumulator:
        return self._backend.empty(self._make_accumulator(num_channels), self._device, x)

    def _compute_accumulate(self, acc: KLAccumulator, x: Array, axis: int | None,
                            collective: Any = None) -> KLAccumulator:
        return self._backend.run(kl_accumulate, acc, x, axis=axis, xp=self._xp, collective=collective)

    def _compute_kl(self, state: MinMaxState, acc: KLAccumulator) -> MinMaxState:
        return self._backend.run(kl_update, state, acc, config=self._search_config(), xp=self._xp)

    def _kl_batch(self, state: MinMaxState, acc: KLAccumulator, x: Array, axis: int | None, kl_due: bool,
                  collective: Any) -> tuple[KLAccumulator, MinMaxState | None]:
        """Both steps in one ``_backend.run`` (torch: one pass to NumPy views and back)."""
        return self._backend.run(_kl_step, state, acc, x, axis=axis, config=self._search_config(), update=kl_due,
                                 xp=self._xp, collective=collective)

    def init_accumulator(self, num_channels: int | None = None) -> KLAccumulator:
        """An empty accumulator (of ``num_channels`` channels for a per-channel observer)."""
        return self._backend.empty(self._make_accumulator(num_channels), self._device)

    def accumulate(self, acc: KLAccumulator | None, x: Array, *, collective: Any = None,
                   axis_name: Any = None) -> KLAccumulator | None:
        """Pure: the accumulator after also counting ``x`` (``None`` starts one; ``acc`` is not modified;
        empty ``x``: ``acc``). With a :class:`~observers_core.Collective` (JAX: ``axis_name=`` inside
        ``shard_map``/``pmap``) the batch is every member's: each member holds the accumulator of the
        concatenated batches (an empty ``x`` takes part)."""
        acc = None if acc is None else self._as_accumulator(acc)
        x = self._check_input(x)
        collective = self._backend.collective(collective, axis_name)
        if collective is None and size(x) == 0:
            return acc
        axis = self._channel_axis(x)
        return self._compute_accumulate(self._fitting_accumulator(acc, x, axis), x, axis, collective)

    def _as_accumulator(self, acc: Any) -> KLAccumulator:
        """``acc`` checked as an accumulator (``TypeError`` naming ``acc``): what ``accumulate`` returns."""
        if not isinstance(acc, tuple) or len(acc) != 2:
            raise TypeError(f"acc must be a KLAccumulator(hist, seen) as accumulate() returns, got {type(acc).__name__}")
        return KLAccumulator(self._state_tuple(acc[0], CalibHistogram, "acc.hist", ("integral", "real floating")),
                             self._state_tuple(acc[1], MinMaxState, "acc.seen"))

    def kl_step(self, state: MinMaxState | None, acc: KLAccumulator) -> MinMaxState:
        """Pure KL update: the accumulated range clipped to the KL threshold of the accumulated histogram,
        moving-averaged into ``state`` (``None``: the first KL update)."""
        acc = self._as_accumulator(acc)
        if state is None:
            state = self.init_state(acc.seen.min_val.shape[0] if self._PER_CHANNEL else None)
        return self._compute_kl(self._as_state(state), acc)

    def update(self, state: KLState | None, x: Array, *, collective: Any = None,
               axis_name: Any = None) -> KLState | None:
        """Pure: the :class:`~observers_core.families.calibration.KLState` (averaged range, accumulator,
        batch count) after observing ``x``, what ``obs(x)`` does (``None``: nothing seen yet; ``state`` is not
        modified; empty ``x``: ``state``): ``x`` counted into the accumulator, and on every
        ``update_interval``-th batch the KL update of the range (:func:`kl_state_update`, branch-free: the
        same under ``jit``/``lax.scan``). With a :class:`~observers_core.Collective` (JAX: ``axis_name=``)
        the batch is every member's. ``qparams(state)`` takes the result."""
        state = None if state is None else self._as_kl_state(state)
        x = self._check_input(x)
        collective = self._backend.collective(collective, axis_name)
        if collective is None and size(x) == 0:
            return state
        axis = self._channel_axis(x)
        channels = None if axis is None else x.shape[axis]
        if state is None:
            bins = self.config.bins
            state = self._backend.empty(lambda device: kl_state_init(channels, bins=bins, device=device, xp=self._xp),
                                        self._device, x)
        check_accumulator_channels(state.acc, channels, self.ch_axis)
        self._backend.check_device(x, state.range.min_val)
        return self._backend.run(kl_state_update, state, x, axis=axis, config=self.config, xp=self._xp,
                                 collective=collective)

    def _as_kl_state(self, state: Any) -> KLState:
        """``state`` checked as a :class:`KLState` (``TypeError`` naming ``state``): what ``update`` returns."""
        if not isinstance(state, tuple) or len(state) != 3:
            raise TypeError(f"state must be a KLState(range, acc, steps) as update() returns, got {type(state).__name__}")
        return KLState(self._as_state(state[0]), self._as_accumulator(state[1]), state[2])

    def qparams(self, state: Any) -> Any:
        """Pure: the qparams of a :class:`KLState`'s averaged range (or of a range, as ``kl_step`` returns)."""
        if isinstance(state, tuple) and len(state) == 3:
            state = self._as_kl_state(state).range
        return super().qparams(state)

    def reset_min_max_vals(self) -> None:
        """Forget everything seen: the averaged range, the histogram and the batch count."""
        super().reset_min_max_vals()
        self._acc = None
        self.num_steps = 0
        self._kl_ran = False

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The base's load; a per-channel range of another channel count than the accumulated histogram's
        empties the accumulator (it could take no batch the range takes; the histogram is not in the state
        dict, as in Horizon). The batch count stays."""
        super().load_state_dict(state_dict)
        if self._acc is not None and self._state is not None and kl_channels_differ(self._acc, self._state):
            self._acc = None

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_steps={self.num_steps}"
