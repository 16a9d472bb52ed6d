"""AMD Quark-compatible names: ``quark.torch.quantization.observer.observer`` over this package's torch observers.

A Quark user changes one import; the classes take Quark's arguments, a ``QTensorConfig`` (called
``QuantizationSpec`` before Quark 0.13) and ``device`` (and ``eps`` where Quark's class takes it)::

    # from quark.torch.quantization.observer.observer import PerChannelMinMaxObserver
    from observers_core.adapters.quark import PerChannelMinMaxObserver

    obs = PerChannelMinMaxObserver(Int8PerChannelSpec(ch_axis=0).to_quantization_spec())
    obs(weight)
    scale, zero_point = obs._calculate_qparams()

Quark is not needed to import this module: the spec is read by attribute (``dtype``, ``qscheme``,
``ch_axis``, ``group_size``, ``symmetric``, ``is_dynamic``, ``scale_type``, ``zero_point_type``,
``scale_format``, ``scale_calculation_mode``; Quark's enums or their names as strings). Each class is
a subclass of an :mod:`observers_core.adapters.torch` class (statistics, buffers and qparams are that
class's; ``state_dict`` is ours), with Quark's ``_calculate_qparams()`` (what Quark's fake-quantize
modules call) returning Quark's layout, and ``reset_state()``. Checked against amd-quark 0.13 in
``tests/test_seed_names.py``.

=============================== ================================================ ==========================
Quark class                     our class                                        vs Quark 0.13
=============================== ================================================ ==========================
PerTensorMinMaxObserver         ``LowBitObserver`` / ``FP8Observer``, per tensor bit for bit
PerChannelMinMaxObserver        ``LowBitObserver`` / ``FP8Observer``, per channel bit for bit
PerGroupMinMaxObserver          ``LowBitObserver(granularity="per_group")``      bit for bit
PerBlockMXObserver              ``PerBlockMXObserver``                           bit for bit
PerBlockBFPObserver             ``PerBlockBFPObserver``                          bit for bit
PerTensorHistogramObserverPro   ``HistogramObserver`` (torch's L2 search)        bit for bit
PerTensorHistogramObserver      ``HistogramObserver(bins=2048)``                 differs: see below
PerTensorPercentileObserver     ``KLObserver``'s accumulated histogram,          within a bin width
                                searched by ``percentile_range``
PerTensorMSEObserver            the same, searched by ``mse_threshold``          differs: see below
PlaceholderObserver             ``PlaceholderObserver`` (no statistics)          same
=============================== ================================================ ==========================

"Bit for bit" is what ``tests/test_seed_names.py`` checks on random batches (static and dynamic
specs, symmetric and asymmetric, every supported dtype, several ``ch_axis``/``group_size``): the
statistics (``min_val``/``max_val``, MX's ``amax``, the histogram) and ``_calculate_qparams()``. MX and BFP
edge cases where Quark's float32 ``log2`` is off by one or it does not clamp to E8M0 (a value one ulp from a
power of two, tiny non-zero blocks, Inf blocks, amax beyond ``1.75 * 2**127``) are listed in README.md,
"Where Quark differs" (``tests/test_seed_names.py::test_quark_block_edge_cases``).
Integer dtypes ``int2``, ``int3``, ``int4``, ``uint4``, ``int8``, ``uint8`` and fp8 (``fp8_e4m3``,
``fp8_e5m2``) for the min/max observers; ``int4``, ``uint4``, ``int8``, ``uint8`` for the histogram
ones (``int4`` in ``PerTensorHistogramObserverPro`` is ours only, the ``[-8, 7]`` range: Quark 0.13
refuses it); anything else (``int16``, ``int32``, ``fp4`` per tensor, ``zero_point_type=float32``...) raises ``ValueError`` naming the ``qspec`` field. ``round_method`` and ``scale_type=pof2`` do not
change these observers' qparams in Quark either and are ignored; ``scale_type`` float16/bfloat16/
float32 casts the scale as Quark does. Differences from Quark 0.13:

- symmetric ``uint8``/``uint4``: Quark returns zero point 0 (its code notes that it assumes signed
  types for symmetric quantization, so negative values clip to 0); we return the mid-range 128 / 8
  with Quark's scale, so the grid is centred on zero;
- zero points are int32 everywhere (Quark's fp8, MX and BFP zero points are float zeros: equal
  values); the min/max buffers stay float32 (Quark recasts them to each input's dtype: identical for
  float32 inputs). For bfloat16/float16 inputs Quark divides in the input's dtype, so its scale is
  rounded to bfloat16/float16 (e.g. 0.0933 where ours, the float32 quotient of the same min/max, is
  0.0931); the float32 results above are the bit-for-bit ones;
- ``PerGroupMinMaxObserver`` keeps, as Quark does, the last batch only (Quark's per-group observer
  never merges batches: it is meant for weights); its qparams come in Quark's layout (``ch_axis``
  swapped with the last axis, then ``(-1, groups)``), MX and BFP scales likewise ``(-1, blocks)``;
- MX and BFP: the scale of a block of zeros (BFP: or of NaN/Inf only) is Quark's: ``eps`` for BFP and
  MX ``floor``/``ceil``, ``2**-127`` for MX ``even``; ``calculate_qparams()`` (ours, a
  ``BlockScale``) keeps ``2**-127`` (E8M0 code 0). The BFP scale is Quark's mantissa LSB
  ``2**(e - 6)`` (``BlockScale.scale / 64``);
- ``PerTensorHistogramObserver``: Quark's class only records a histogram; its qparams are always
  the defaults ``(tensor([1.]), tensor([0]))`` (its min/max are never set). We return torch's
  L2-search qparams of ``HistogramObserver(bins=2048)`` instead, so it is usable on its own;
- ``PerTensorPercentileObserver`` / ``PerTensorMSEObserver``: both accumulate a histogram of ``|x|``
  over every batch and search it once, as Quark does, but the histogram is ours
  (:class:`~observers_core.CalibHistogram`: 2048 bins on an exact power-of-two grid, zeros counted)
  where Quark grows a ``linspace`` histogram by whole bins (4200 bins with zeros skipped for the
  percentile, 2048 for MSE). The percentile rule is the same (the left edge of the bin where the
  cumulative count reaches 99.99999999 %), so the scales agree to a bin width (measured: within
  0.05 % on normal and cubed-normal data). Quark's MSE only tries the candidates from bin 2045 on
  (the top 3 bins of one 2048-bin batch, more once later batches grow the histogram); ours tries
  every bin (:func:`observers_core.mse_threshold`), so it clips harder (measured: scales 3 % to 8 %
  below Quark's). Only ``symmetric=True`` is supported (Quark's asymmetric histograms are signed;
  ours are of ``|x|``): ``symmetric=False`` raises ``ValueError``;
- where Quark raises, ours follow torch.ao's rules: a NaN poisons the min/max and histogram observers'
  state (NaN scale, as torch.ao's; Quark: ``AssertionError``/``RuntimeError``), the percentile and MSE
  observers skip NaN and inf (Quark: ``histc`` range not finite), and an integer batch is binned as its
  float32 cast (Quark's histogram observer: ``NotImplementedError`` for int64).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from observers_core._minmax import MinMaxState

from observers_core.families import calibration as calibration_family

from ._torch_backend import TORCH
from .torch import (
    HistogramObserver,
    KLObserver,
    LowBitObserver,
    PlaceholderObserver as _TorchPlaceholder,
)
from .torch import PerBlockBFPObserver as _BFPObserver
from .torch import PerBlockMXObserver as _MXObserver

__all__ = [
    "PlaceholderObserver",
    "PerTensorMinMaxObserver",
    "PerChannelMinMaxObserver",
    "PerGroupMinMaxObserver",
    "PerBlockMXObserver",
    "PerBlockBFPObserver",
    "PerTensorHistogramObserver",
    "PerTensorHistogramObserverPro",
    "PerTensorPercentileObserver",
    "PerTensorMSEObserver",
]

FLOAT32_EPS = torch.finfo(torch.float32).eps
_INT_DTYPES = ("int2", "int3", "int4", "uint4", "int8", "uint8")
_FP8_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
_MX_DTYPES = {"fp8_e4m3": "mxfp8_e4m3", "fp8_e5m2": "mxfp8_e5m2", "fp6_e3m2": "mxfp6_e3m2",
              "fp6_e2m3": "mxfp6_e2m3", "fp4": "mxfp4"}
_SCALE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _name(value: Any) -> Any:
    """A Quark enum member as its value's name (``Dtype.int8`` -> ``"int8"``); strings and None unchanged."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    inner = getattr(value, "value", value)
    return inner if isinstance(inner, str) else getattr(value, "name", inner)


def _field(qspec: Any, name: str, default: Any = None) -> Any:
    return _name(getattr(qspec, name, default))


def _dtype(qspec: Any, owner: str, allowed) -> str:
    if not hasattr(qspec, "dtype"):
        raise TypeError(f"qspec must be a Quark QTensorConfig (or an object with its fields), got {type(qspec).__name__}")
    dtype = _field(qspec, "dtype")
    if dtype not in allowed:
        raise ValueError(f"qspec.dtype={dtype!r} is not supported by {owner}; allowed: {', '.join(allowed)}")
    return dtype


def _int_field(qspec: Any, name: str, owner: str) -> int:
    value = getattr(qspec, name, None)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"qspec.{name}={value!r} must be an int for {owner}")
    return value


def _dynamic(qspec: Any) -> bool:
    return bool(getattr(qspec, "is_dynamic", False))


def _factory(device: Any) -> dict | None:
    return None if device is None else {"device": device}


def _scale_dtype(qspec: Any) -> torch.dtype | None:
    return _SCALE_DTYPES.get(_field(qspec, "scale_type"))


def _check_zero_point_type(qspec: Any, owner: str) -> None:
    zp = _field(qspec, "zero_point_type")
    if zp not in (None, "int32"):
        raise ValueError(f"qspec.zero_point_type={zp!r} is not supported by {owner}; allowed: int32")


def _swap_to_last(t: torch.Tensor, axis: int) -> torch.Tensor:
    """Quark's layout: ``axis`` swapped with the last axis."""
    return t.transpose(axis, -1) if t.dim() > 1 else t


class _QuarkMinMax:
    """Shared by the uniform observers: Quark's spec, ``_calculate_qparams`` and ``reset_state``."""

    qspec: Any

    def _init_quark(self, qspec: Any) -> None:
        self.qspec = qspec
        self.scale_torch_dtype = _scale_dtype(qspec)

    def _quark_layout(self, scale: torch.Tensor, zero_point: torch.Tensor):
        return scale, zero_point

    def _calculate_qparams(self, *min_max):
        """Quark's qparams: ``(scale, zero_point)`` of :meth:`calculate_qparams`, in Quark's layout.
        (With arguments, the torch base class's ``_calculate_qparams(min_val, max_val)``.)"""
        if min_max:
            return super()._calculate_qparams(*min_max)
        scale, zero_point = self.calculate_qparams()
        scale, zero_point = self._quark_layout(scale, zero_point)
        return scale.to(self.scale_torch_dtype) if self.scale_torch_dtype is not None else scale, zero_point

    def reset_state(self) -> None:
        self.reset_min_max_vals()


def _lowbit_kwargs(qspec: Any, owner: str, granularity: str) -> dict:
    dtype = _dtype(qspec, owner, _INT_DTYPES + tuple(_FP8_DTYPES))
    _check_zero_point_type(qspec, owner)
    kwargs: dict[str, Any] = {"granularity": granularity, "is_dynamic": _dynamic(qspec)}
    if dtype in _FP8_DTYPES:
        kwargs["dtype"] = _FP8_DTYPES[dtype]
    else:
        symmetric = getattr(qspec, "symmetric", None)
        if not isinstance(symmetric, bool):
            raise ValueError(f"qspec.symmetric={symmetric!r} must be a bool for integer dtypes ({owner})")
        kwargs.update(dtype=dtype, symmetric=symmetric)
    if granularity != "per_tensor":
        kwargs["axis"] = _int_field(qspec, "ch_axis", owner)
    if granularity == "per_group":
        kwargs["group_size"] = _int_field(qspec, "group_size", owner)
    return kwargs


class PlaceholderObserver(_TorchPlaceholder):
    """Quark's ``PlaceholderObserver(qspec, device=None)``: no statistics; ``dtype`` is ``qspec.dtype``."""

    def __init__(self, qspec: Any, device: Any = None) -> None:
        if not hasattr(qspec, "dtype"):
            raise TypeError(f"qspec must be a Quark QTensorConfig (or an object with its fields), got {type(qspec).__name__}")
        super().__init__(dtype={"float16": torch.float16, "bfloat16": torch.bfloat16}.get(_field(qspec, "dtype"), torch.float32))
        self.qspec = qspec

    def _calculate_qparams(self) -> None:
        return None

    def reset_state(self) -> None:
        pass


class PerTensorMinMaxObserver(_QuarkMinMax, LowBitObserver):
    """Quark's ``PerTensorMinMaxObserver(qspec, device=None)``: running min/max of every batch (the last
    batch alone when ``qspec.is_dynamic``); ``LowBitObserver(granularity="per_tensor")``."""

    def __init__(self, qspec: Any, device: Any = None) -> None:
        LowBitObserver.__init__(
            self, **_lowbit_kwargs(qspec, type(self).__name__, "per_tensor"), factory_kwargs=_factory(device)
        )
        self._init_quark(qspec)


class PerChannelMinMaxObserver(_QuarkMinMax, LowBitObserver):
    """Quark's ``PerChannelMinMaxObserver(qspec, device=None, eps=float32 eps)``: running min/max per
    channel along ``qspec.ch_axis``; ``LowBitObserver(granularity="per_channel")``."""

    def __init__(self, qspec: Any, device: Any = None, eps: float = FLOAT32_EPS) -> None:
        # Quark 0.13 accepts eps here but does not use it (its buffer keeps float32 eps); so do we
        LowBitObserver.__init__(
            self, **_lowbit_kwargs(qspec, type(self).__name__, "per_channel"), factory_kwargs=_factory(device)
        )
        self._init_quark(qspec)


class PerGroupMinMaxObserver(_QuarkMinMax, LowBitObserver):
    """Quark's ``PerGroupMinMaxObserver(qspec, device=None, eps=float32 eps)``: min/max per group of
    ``qspec.group_size`` along ``qspec.ch_axis`` of the last batch (as Quark); qparams in Quark's layout
    ``(-1, groups)``. ``LowBitObserver(granularity="per_group", is_dynamic=True)``: our
    ``PerGroupMinMaxObserver`` for integers, ``FP8Observer`` for fp8."""

    def __init__(self, qspec: Any, device: Any = None, eps: float = FLOAT32_EPS) -> None:
        kwargs = _lowbit_kwargs(qspec, type(self).__name__, "per_group")
        kwargs["is_dynamic"] = True  # Quark's per-group observer keeps the last batch only
        LowBitObserver.__init__(self, **kwargs, factory_kwargs=_factory(device))
        self._init_quark(qspec)

    def _quark_layout(self, scale, zero_point):
        if scale.dim() == 0:
            return scale.reshape(1, 1), zero_point.reshape(1, 1)
        axis = self.spec.axis % scale.dim()
        groups = scale.shape[axis]
        return tuple(_swap_to_last(t, axis).reshape(-1, groups) for t in (scale, zero_point))


class _QuarkBlock(_QuarkMinMax):
    #: Quark gives blocks of zeros (and, for BFP, of NaN/Inf only) the scale ``eps`` instead of 2**-127
    _ZERO_BLOCK_EPS = True

    def _quark_layout(self, scale, zero_point):
        axis = self.spec.axis % scale.dim()
        blocks = scale.shape[axis]
        scale = _swap_to_last(scale, axis).reshape(-1, blocks)
        return scale, torch.zeros(scale.shape, dtype=torch.int32, device=scale.device)

    def _calculate_qparams(self):  # type: ignore[override]
        scale, exponent = self.calculate_qparams()
        scale = self._block_scale(scale)
        if self._ZERO_BLOCK_EPS:  # blocks with no non-zero finite value (or nothing seen yet), not every code 0:
            # a tiny non-zero block also has code 0 (its exponent clamped to -127) and keeps 2**-127
            empty = self.min_val.numel() == 0
            amax = torch.tensor(-math.inf) if empty else torch.maximum(-self.min_val, self.max_val)
            no_value = (amax == 0) | (amax == -math.inf)
            scale = torch.where(no_value.to(scale.device), torch.tensor(self.eps, dtype=scale.dtype, device=scale.device),
                                scale)
        scale, zero_point = self._quark_layout(scale, exponent)
        return scale.to(self.scale_torch_dtype) if self.scale_torch_dtype is not None else scale, zero_point

    def _block_scale(self, scale):
        return scale

    @property
    def amax(self) -> torch.Tensor:
        """Quark's ``amax`` per block (``max(-min_val, max_val)``, Quark's layout); ``tensor(0.)`` before any
        input, as Quark's."""
        if self.min_val.numel() == 0:
            return torch.zeros((), device=self.min_val.device)
        amax = torch.maximum(-self.min_val, self.max_val)
        return self._quark_layout(amax, amax)[0] if amax.dim() else amax


class PerBlockMXObserver(_QuarkBlock, _MXObserver):
    """Quark's ``PerBlockMXObserver(qspec, device=None, eps=float32 eps)``: OCP MX shared exponents per
    block of ``qspec.group_size`` along ``qspec.ch_axis``; ``qspec.scale_calculation_mode``
    (``even``, Quark's default, ``floor`` or ``ceil``) is the rounding of the shared exponent."""

    def __init__(self, qspec: Any, device: Any = None, eps: float = FLOAT32_EPS) -> None:
        owner = type(self).__name__
        element = getattr(qspec, "mx_element_dtype", None)
        dtype = _name(element) if element is not None else _dtype(qspec, owner, tuple(_MX_DTYPES))
        if dtype not in _MX_DTYPES:
            raise ValueError(f"qspec.mx_element_dtype={dtype!r} is not supported by {owner}; allowed: {', '.join(_MX_DTYPES)}")
        scale_format = _field(qspec, "scale_format")
        if scale_format not in (None, "e8m0"):
            raise ValueError(f"qspec.scale_format={scale_format!r} is not supported by {owner}; allowed: e8m0")
        mode = _field(qspec, "scale_calculation_mode") or "even"
        if mode not in ("even", "floor", "ceil"):  # Quark 0.13 raises for any other at its first qparams
            raise ValueError(f"qspec.scale_calculation_mode={mode!r} is not supported by {owner}; allowed: even, floor, ceil")
        _MXObserver.__init__(
            self, _MX_DTYPES[dtype], axis=_int_field(qspec, "ch_axis", owner),
            block_size=_int_field(qspec, "group_size", owner), rounding=mode, is_dynamic=_dynamic(qspec),
            factory_kwargs=_factory(device),
        )
        self._init_quark(qspec)
        self.eps = float(eps)
        self._ZERO_BLOCK_EPS = mode != "even"  # Quark's even_round gives 2**-127, as ours; floor/ceil give eps


class PerBlockBFPObserver(_QuarkBlock, _BFPObserver):
    """Quark's ``PerBlockBFPObserver(qspec, device=None, eps=float32 eps)``: BFP16 shared exponents per
    block of ``qspec.group_size`` (8) along ``qspec.ch_axis``; ``_calculate_qparams()`` gives Quark's
    scale, the mantissa LSB ``2**(e - 6)``."""

    def __init__(self, qspec: Any, device: Any = None, eps: float = FLOAT32_EPS) -> None:
        owner = type(self).__name__
        _dtype(qspec, owner, ("bfp16",))
        _BFPObserver.__init__(
            self, "bfp16", axis=_int_field(qspec, "ch_axis", owner), block_size=_int_field(qspec, "group_size", owner),
            is_dynamic=_dynamic(qspec), factory_kwargs=_factory(device),
        )
        self._init_quark(qspec)
        self.eps = float(eps)

    def _block_scale(self, scale):
        return scale / 64


def _uniform_dtype(qspec: Any, owner: str) -> tuple[str, int | None, int | None]:
    """Quark's integer dtype as this package's uniform dtype and custom range."""
    dtype = _dtype(qspec, owner, ("int4", "uint4", "int8", "uint8"))
    return {"int8": ("qint8", None, None), "uint8": ("quint8", None, None), "int4": ("qint8", -8, 7),
            "uint4": ("quint4x2", None, None)}[dtype]


def _symmetric(qspec: Any) -> bool:
    symmetric = getattr(qspec, "symmetric", None)
    return True if symmetric is None else bool(symmetric)


class PerTensorHistogramObserverPro(_QuarkMinMax, HistogramObserver):
    """Quark's ``PerTensorHistogramObserverPro(qspec, device=None, bins=256, reduce_range=False,
    upsample_rate=384)``: torch's ``HistogramObserver`` (ours: the same arithmetic); torch >= 2.5
    ignores ``upsample_rate`` in Quark (torch uses 16), so do we."""

    def __init__(self, qspec: Any, device: Any = None, bins: int = 256, reduce_range: bool = False,
                 upsample_rate: int = 384) -> None:
        owner = type(self).__name__
        if _field(qspec, "qscheme") not in (None, "per_tensor"):
            raise ValueError(f"qspec.qscheme={_field(qspec, 'qscheme')!r} is not supported by {owner}; allowed: per_tensor")
        dtype, qmin, qmax = _uniform_dtype(qspec, owner)
        if dtype == "quint4x2":
            qmin, qmax = 0, 15
        elif qmin is None:
            qmin, qmax = (-128, 127) if dtype == "qint8" else (0, 255)
        symmetric = _symmetric(qspec)
        HistogramObserver.__init__(
            self, bins=bins, dtype=dtype, qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
            reduce_range=reduce_range, quant_min=qmin, quant_max=qmax, factory_kwargs=_factory(device),
        )
        self._init_quark(qspec)
        self.symmetric = symmetric


class PerTensorHistogramObserver(PerTensorHistogramObserverPro):
    """Quark's ``PerTensorHistogramObserver(qspec, device=None)``: torch's ``HistogramObserver`` with
    2048 bins (Quark's own class records a histogram and returns default qparams)."""

    def __init__(self, qspec: Any, device: Any = None) -> None:
        super().__init__(qspec, device, bins=2048)


class _AccumulatedSearch(_QuarkMinMax, KLObserver):
    """The histogram of ``|x|`` accumulated over every batch (``KLObserver``'s accumulator; its KL update
    never runs) and searched with ``_SEARCH`` after each batch: ``min_val``/``max_val`` hold the
    accumulated range clipped to ``[-amax, amax]``."""

    _SEARCH = ""
    _BINS = 2048
    _OPTIONS = ("update_interval", "percentile")  # KLObserver's accumulator, searched by percentile or MSE

    def __init__(self, qspec: Any, device: Any = None, *, percentile: float = 99.99) -> None:
        owner = type(self).__name__
        if _field(qspec, "qscheme") not in (None, "per_tensor"):
            raise ValueError(f"qspec.qscheme={_field(qspec, 'qscheme')!r} is not supported by {owner}; allowed: per_tensor")
        if not _symmetric(qspec):
            raise ValueError(f"qspec.symmetric=False is not supported by {owner}: its histogram is of |x|")
        dtype, qmin, qmax = _uniform_dtype(qspec, owner)
        KLObserver.__init__(
            self, bins=self._BINS, update_interval=2**62, averaging_constant=1.0, ch_axis=-1, dtype=dtype,
            qscheme=torch.per_tensor_symmetric, quant_min=qmin, quant_max=qmax, factory_kwargs=_factory(device),
            percentile=percentile,
        )
        self._init_quark(qspec)
        self.symmetric = True

    def calculate_qparams(self):  # type: ignore[override]
        """``calculate_qparams`` of the searched (or loaded) range; before any finite value a warning and
        ``([1.], [0])``."""
        if self._nothing_seen():
            warnings.warn(f"{type(self).__name__} has observed no finite value yet; returning default values "
                          "(scale=1, zero_point=0)", UserWarning, stacklevel=2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self._default_qparams(self.min_val)
        return self._calculate_qparams(self.min_val, self.max_val)

    def _observe(self, state, x, axis, collective):
        super()._observe(state, x, axis, collective)  # accumulates; update_interval is never reached
        self._write_state(self._searched_range())

    def _searched_range(self) -> MinMaxState:
        """The accumulated range clipped to ``[-amax, amax]``, ``amax`` searched on the accumulated histogram."""
        acc = self.accumulator
        amax = calibration_family.search_amax(self._SEARCH, acc.hist, self._search_config(), TORCH.xp)
        return MinMaxState(*calibration_family.clip_range(acc.seen.min_val, acc.seen.max_val, amax, TORCH.xp))

    def _load_synced(self, merged) -> None:
        """sync_observers: the merged accumulator (exact), then the range searched on it (not the mean
        of the ranks' ranges, which the KL observers' moving average uses)."""
        super()._load_synced(merged)
        if self.accumulator is not None:
            lo, hi = self._searched_range()
            self.min_val.copy_(lo)
            self.max_val.copy_(hi)


class PerTensorPercentileObserver(_AccumulatedSearch):
    """Quark's ``PerTensorPercentileObserver(qspec, device=None)``: ``amax`` = the 99.99999999th
    percentile of ``|x|`` over every batch (:func:`observers_core.percentile_range` of the accumulated
    histogram); qparams of ``(0, amax)``."""

    _SEARCH = "percentile"

    def __init__(self, qspec: Any, device: Any = None) -> None:
        super().__init__(qspec, device, percentile=99.99999999)
        self.percentile = 99.99999999


class PerTensorMSEObserver(_AccumulatedSearch):
    """Quark's ``PerTensorMSEObserver(qspec, device=None)``: ``amax`` of least expected squared error
    over the accumulated histogram of ``|x|`` (:func:`observers_core.mse_threshold`, every bin a
    candidate); qparams of ``(0, amax)``."""

    _SEARCH = "mse"


