"""``HistogramObserver`` over one array-API namespace: the running histogram and torch's L2 range search.

Used directly (``xp=numpy`` by default, or ``array_api_strict``) it is a plain NumPy observer;
``observers_core.adapters.jax`` and ``.cupy`` bind it to their backend (``jax.jit``, device handling).
The torch adapter (:mod:`observers_core.adapters._torch_histogram`) keeps the same statistics in
``nn.Module`` buffers and reuses :func:`observers_core.families.histogram.check_loaded_state`.

Statistics: a :class:`~observers_core.HistogramState` ``(histogram, min_val, max_val)`` (float32
``(bins,)`` counts over ``[min_val, max_val]``, 0-d bounds, ``+inf``/``-inf`` before any input), updated by
:func:`observers_core.histogram_update` exactly as ``torch.ao``'s ``HistogramObserver.forward``: the batch
is binned on the new range ``[min(min_val, min(x)), max(max_val, max(x))]`` and the old histogram is moved
onto it through ``upsample_rate`` sub-bins per bin. ``calculate_qparams`` is
:func:`observers_core.histogram_qparams`: torch's greedy L2 search for a clipping range ``[new_min,
new_max]`` (``2**bits`` destination bins), then ``calculate_qparams(new_min, new_max)``.

Non-finite values, the same on every backend:

- ``+inf``/``-inf`` are dropped (torch drops them too, with a warning; only the torch adapter warns, the
  array observers never synchronise with the host for it);
- NaN, by default, makes the state NaN: ``min_val = max_val = NaN``, the histogram as it was, every later
  batch ignored and ``calculate_qparams`` giving a NaN scale (torch raises ``RuntimeError`` in ``histc``);
  ``ignore_nonfinite=True`` drops NaN like inf.

Differences from torch, all deliberate: configuration errors are ``ValueError``/``TypeError`` naming the
argument; ``upsample_rate`` is a constructor argument (torch hard-codes 16); inputs of every real dtype are
binned in float32 (torch bins float64/float16 in their own precision and rejects integers) and counts are
exact integers up to ``2**31 - 1`` per bin and batch (torch's float32 counts stop at ``2**24``);
``reset_min_max_vals()`` forgets everything (torch raises ``NotImplementedError``); ``load_state_dict``
checks every entry before anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from observers_core._dtypes import FLOAT32_EPS, QScheme
from observers_core._histogram import HistogramState
from observers_core.families import histogram as family
from observers_core._qparams import QParams

from observers_core._state_dict import check_entry

from ._array_observers import UniformQuantizationObserverBase

__all__ = ["HistogramObserver"]

Array = Any

#: torch's state_dict keys of a HistogramObserver, in torch's order.
STATE_KEYS = ("eps", "histogram", "min_val", "max_val")


class HistogramObserver(UniformQuantizationObserverBase):
    """Running histogram (``bins`` bins over the observed range) and torch's L2 search for the clipping
    range. Same arguments as ``torch.ao.quantization.HistogramObserver`` plus ``upsample_rate`` (sub-bins
    per bin when the range grows) and ``ignore_nonfinite`` (skip NaN; inf is always skipped).

    ``calculate_qparams()``: ``[new_min, new_max]`` from the search (:func:`observers_core.histogram_qparams`),
    then affine ``s = max((max(new_max, 0) - min(new_min, 0)) / (Q_max - Q_min), eps)``,
    ``z = clamp(Q_min - round(min(new_min, 0) / s), Q_min, Q_max)`` (symmetric likewise)."""

    _READ_ONLY = UniformQuantizationObserverBase._READ_ONLY | {"bins", "upsample_rate", "dst_nbins"}

    def __init__(
        self,
        bins: int = 2048,
        dtype: Any = "quint8",
        qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        *,
        upsample_rate: int = 16,
        ignore_nonfinite: bool = False,
        **backend: Any,
    ) -> None:
        self._setup(
            bins=bins, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
            quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic,
            upsample_rate=upsample_rate, ignore_nonfinite=ignore_nonfinite, **backend,
        )

    def _setup(self, *, bins: int, dtype: Any, qscheme: QScheme | str, reduce_range: bool, quant_min: int | None,
               quant_max: int | None, factory_kwargs: Mapping[str, Any] | None, eps: float, is_dynamic: bool,
               upsample_rate: int, ignore_nonfinite: bool, **backend: Any) -> None:
        """The checks of the constructor's arguments, in torch's order, on every framework; the storage is the
        framework's (``_init_uniform``, ``_init_range``)."""
        owner = type(self).__name__
        bins, upsample_rate = family.check_observer_args(
            owner, self._parse_qscheme(qscheme), bins=bins, upsample_rate=upsample_rate, is_dynamic=is_dynamic)
        dst_nbins = family.check_dtype(self._parse_dtype(dtype), owner)
        self._init_uniform(dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic,
                           ignore_nonfinite=ignore_nonfinite, **backend)
        # the number of histogram bins; sub-bins per bin when the old histogram is moved onto a wider range;
        # destination bins of the search (``2**bits`` of ``dtype``). Read-only here (``_READ_ONLY``).
        self._configure(bins=bins, upsample_rate=upsample_rate, dst_nbins=dst_nbins)
        self._init_range(factory_kwargs)

    # -- state ---------------------------------------------------------------------------------------
    def init_state(self, num_channels: int | None = None) -> HistogramState:
        """A state that has seen nothing: zero counts, ``min_val=+inf``, ``max_val=-inf``."""
        if num_channels is not None:
            raise ValueError(f"num_channels must be None for {type(self).__name__}, got {num_channels!r}")
        return super().init_state()

    def _make_state(self, num_channels: int | None) -> Any:
        return lambda device: family.init(self.update_config, xp=self._xp, device=device)

    @property
    def update_config(self) -> family.Config:
        """The family configuration of the update (the default spec: the update does not depend on it)."""
        return family.Config(self.bins, self.upsample_rate, ignore_nonfinite=self.ignore_nonfinite)

    @property
    def config(self) -> family.Config:
        """The whole family configuration (:class:`observers_core.families.histogram.Config`)."""
        return family.Config(self.bins, self.upsample_rate, self._current_spec(), self.ignore_nonfinite)

    def _as_state(self, state: Any) -> HistogramState:
        state = self._state_tuple(state, HistogramState)
        shapes = tuple(tuple(a.shape) for a in state)
        if shapes != ((self.bins,), (), ()):
            raise ValueError(f"state must hold shapes ({self.bins},), (), () for bins={self.bins}, got {shapes}")
        f32 = self._xp.float32  # the statistics are float32 (a float64 state crashed the compiled update)
        return HistogramState(*(a if a.dtype == f32 else self._xp.astype(a, f32) for a in state))

    @property
    def histogram(self) -> Array:
        return self.state.histogram

    # -- update and qparams (through the backend: JAX jits them, CuPy runs them on the state's device) --
    def _compute_update(self, state: HistogramState, x: Array, axis: int | None, collective: Any = None) -> HistogramState:
        return self._backend.run(family.update, self.update_config, state, x, collective=collective)

    def _compute_qparams(self, state: HistogramState) -> QParams:
        return self._backend.run(family.qparams, self.config, state)

    def update(self, state: HistogramState, x: Array, *, collective: Any = None, axis_name: Any = None) -> HistogramState:
        """Pure: the state after observing ``x`` (:func:`observers_core.histogram_update`); empty ``x``
        returns ``state``. With a :class:`~observers_core.Collective` (JAX: ``axis_name=``), the batch is
        every member's (range agreed first, integer counts summed; an empty ``x`` still takes part)."""
        return super().update(state, x, collective=collective, axis_name=axis_name)

    def calculate_qparams(self) -> QParams:
        """``(scale, zero_point)`` of the range the L2 search picks (see the class docstring). Before any
        input: ``scale=[1.], zero_point=[0]`` with a warning, as torch."""
        return super().calculate_qparams()

    # -- state dict: ``{"eps": (1,), "histogram": (bins,), "min_val": (), "max_val": ()}``, float32, with torch's
    # key names, order and shapes (a torch.ao HistogramObserver's loads as is, the ``(0,)`` min/max of its
    # version < 3 included) ------------------------------------------------------------------------------
    _STATE_KEYS = STATE_KEYS

    def _checked_entries(self, state_dict: Mapping[str, Any]) -> HistogramState:
        """:func:`~observers_core.families.histogram.check_loaded_state` of the entries."""
        entries = (check_entry(state_dict[k], k, None) for k in ("histogram", "min_val", "max_val"))
        return HistogramState(*family.check_loaded_state(*entries, bins=self.bins, owner=type(self).__name__))

    def extra_repr(self) -> str:
        s = self._state
        return (
            f"bins={self.bins}, dtype={self.dtype!r}, qscheme={self.qscheme.value!r}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, upsample_rate={self.upsample_rate}, "
            f"min_val={None if s is None else s.min_val}, max_val={None if s is None else s.max_val}"
            + (", ignore_nonfinite=True" if self.ignore_nonfinite else "")
        )
