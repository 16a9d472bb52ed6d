"""``observers-core report``: every calibration method on real tensors, as plain rows.

>>> from observers_core.report import report_tensors
>>> rows = report_tensors({"w": weights})          # doctest: +SKIP
>>> best = [r for r in rows if r.best]              # doctest: +SKIP

Each :class:`Row` is one ``(tensor, format, granularity, method)``: the chosen range, the scale and
zero point (or MX/BFP shared exponents), the error of fake-quantizing the tensor with them
(``mse = mean((fq(x) - x)**2)``, ``sqnr_db = 10 log10(sum x**2 / sum (fq(x) - x)**2)`` over finite
values), the clipped fraction and the seconds the statistics and qparams took. ``best`` marks the
highest SQNR per ``(tensor, format)``. The numbers come from the core functions the observers use
(see :mod:`observers_core.report._methods`). ``run_report(files)`` loads ``.npy``/``.npz``/
``.safetensors``/``.pt`` files first; ``run_default()`` is the embedded digits MLP.

Nothing here imports torch, JAX or CuPy unless that backend or a ``.pt`` file is asked for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ._io import ReportError, load_tensors
from ._methods import ALL_METHODS, FORMATS, GRANULARITIES, LLM_METHODS, METHODS, Case, calibrate, cases_for, errors

__all__ = [
    "FORMATS", "GRANULARITIES", "METHODS", "LLM_METHODS", "ALL_METHODS", "BACKENDS", "DEFAULT_FORMATS", "ReportError", "Row",
    "report_tensors", "run_report", "run_default", "load_tensors", "resolve_backend",
]

BACKENDS = ("numpy", "torch", "jax", "cupy")
DEFAULT_FORMATS = ("int8", "int4", "float8_e4m3fn", "mxfp8_e4m3", "mxfp4")


@dataclasses.dataclass
class Row:
    """One tensor calibrated one way (lists are flattened per tensor/channel/group/block)."""

    tensor: str
    shape: list[int]
    format: str
    granularity: str
    method: str
    range_min: list[float]
    range_max: list[float]
    scale: list[float]
    zero_point: list[int] | None
    exponent: list[int] | None
    mse: float
    sqnr_db: float
    clipped: float
    seconds: float
    nonfinite: int = 0
    best: bool = False
    note: str = ""
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_backend(backend: str, device: str | None = None) -> tuple[Any, Callable[[np.ndarray], Any]]:
    """``(xp, to_backend)`` for ``backend``; :class:`ReportError` when it is not installed."""
    if backend not in BACKENDS:
        raise ReportError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}", code=2)
    try:
        if backend == "numpy":
            import array_api_compat.numpy as xp

            if device not in (None, "cpu"):
                raise ReportError(f"--device {device!r}: the numpy backend runs on the cpu only")
            return xp, lambda a: a
        if backend == "torch":
            import torch
            import array_api_compat.torch as xp

            dev = torch.device(device or "cpu")
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ReportError(f"--device {device!r}: torch sees no CUDA device")
            return xp, lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)
        if backend == "jax":
            import jax
            import jax.numpy as xp

            devs = jax.devices(device) if device else jax.devices()
            return xp, lambda a: jax.device_put(a, devs[0])
        import cupy
        import array_api_compat.cupy as xp

        def to_cupy(a: np.ndarray) -> Any:
            with cupy.cuda.Device(int(device or 0)):
                return cupy.asarray(a)

        cupy.cuda.runtime.getDeviceCount()
        return xp, to_cupy
    except ImportError as err:
        raise ReportError(
            f"--backend {backend}: {err.name or backend} is not installed (pip install 'observers-core[{backend}]')"
        ) from None
    except ReportError:
        raise
    except Exception as err:  # a device that does not exist, a driver missing
        raise ReportError(f"--backend {backend} --device {device}: {type(err).__name__}: {err}") from None


def _flat(a: np.ndarray | None, kind: type) -> list | None:
    if a is None:
        return None
    return [kind(v) for v in np.asarray(a).reshape(-1).tolist()]


def report_tensors(
    tensors: Mapping[str, Any],
    *,
    formats: Iterable[str] = DEFAULT_FORMATS,
    granularities: Iterable[str] = GRANULARITIES,
    methods: Iterable[str] = METHODS,
    group_size: int = 32,
    backend: str = "numpy",
    device: str | None = None,
    batches: Mapping[str, list[np.ndarray]] | None = None,
    inputs: Mapping[str, list[np.ndarray]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Calibrate every tensor every way; one :class:`Row` each (see the module docstring).

    ``tensors``: name -> array (numpy or anything ``np.asarray`` takes; float32 is used). ``batches``:
    optional name -> list of arrays observed in turn instead of the tensor (the embedded model's
    activations); errors are measured on the tensor. ``inputs``: optional weight name -> the layer's input
    batches (``imatrix_mse`` weights the error by their ``E[x^2]`` per input channel, the weight's last
    axis). Empty tensors raise :class:`ReportError`."""
    formats, granularities, methods = tuple(formats), tuple(granularities), tuple(methods)
    for kind, given, valid in (("format", formats, FORMATS), ("granularity", granularities, GRANULARITIES),
                               ("method", methods, ALL_METHODS)):
        bad = [g for g in given if g not in valid]
        if bad:
            raise ReportError(f"unknown {kind} {', '.join(map(repr, bad))}; valid: {', '.join(valid)}", code=2)
    xp, to_backend = resolve_backend(backend, device)
    rows: list[Row] = []
    for name, value in tensors.items():
        host = np.asarray(value, dtype=np.float32)
        if host.size == 0:
            raise ReportError(f"tensor {name!r} is empty (shape {tuple(host.shape)}): nothing to calibrate")
        if host.ndim == 0:
            host = host.reshape(1)
        nonfinite = int(host.size - np.count_nonzero(np.isfinite(host)))
        x = to_backend(host)
        seen = [to_backend(np.asarray(b, dtype=np.float32)) for b in (batches or {}).get(name, [])] or [x]
        layer_inputs = [to_backend(np.asarray(b, dtype=np.float32)) for b in (inputs or {}).get(name, [])]
        cases, skipped = cases_for(host.shape, formats, granularities, methods, group_size)
        for case in cases:
            if progress is not None:
                progress(f"{name} {case.format} {case.granularity} {case.method}")
            rows.append(_row(name, host, x, seen, case, xp, group_size, nonfinite, layer_inputs))
        if progress is not None and skipped:
            for s in skipped:
                progress(f"{name}: skipped {s}")
    _mark_best(rows)
    return rows


def _row(name: str, host: np.ndarray, x: Any, seen: list[Any], case: Case, xp: Any, group_size: int,
         nonfinite: int, inputs: list[Any] | None = None) -> Row:
    from ._methods import host_numpy

    base = dict(tensor=name, shape=list(host.shape), format=case.format, granularity=case.granularity,
                method=case.method, nonfinite=nonfinite)
    try:
        c = calibrate(case, seen, x, xp, group_size, inputs=inputs)
    except Exception as err:  # noqa: BLE001 -- one method failing (as its observer would) is one error row
        msg = str(err).splitlines()[0] if str(err) else ""
        msg = msg if isinstance(err, ValueError) else f"{type(err).__name__}: {msg}"
        return Row(**base, range_min=[], range_max=[], scale=[], zero_point=None, exponent=None, mse=math.nan,
                   sqnr_db=math.nan, clipped=math.nan, seconds=math.nan, error=msg)
    mse, sqnr, clipped = errors(host, host_numpy(c.fq), host_numpy(c.saturation), None if c.step is None else host_numpy(c.step))
    note = c.note
    if nonfinite and not np.all(np.isfinite(c.scale)):
        note = (note + "; " if note else "") + "non-finite qparams: this observer does not skip NaN/Inf"
    return Row(**base, range_min=_flat(c.range_min, float), range_max=_flat(c.range_max, float),
               scale=_flat(c.scale, float), zero_point=_flat(c.zero_point, int), exponent=_flat(c.exponent, int),
               mse=mse, sqnr_db=sqnr, clipped=clipped, seconds=c.seconds, note=note)


def _mark_best(rows: list[Row]) -> None:
    """``best`` on the highest finite SQNR of each ``(tensor, format)`` (the first among equals)."""
    groups: dict[tuple[str, str], Row] = {}
    for r in rows:
        if not math.isnan(r.sqnr_db) and not r.error:
            key = (r.tensor, r.format)
            if key not in groups or r.sqnr_db > groups[key].sqnr_db:
                groups[key] = r
    for r in groups.values():
        r.best = True


def run_report(files: Iterable[str], *, select: str | None = None, **kwargs: Any) -> list[Row]:
    """:func:`report_tensors` of the tensors in ``files`` (names ``file:tensor``) matching ``select``."""
    return report_tensors(load_tensors(list(files), select=select), **kwargs)


def run_default(*, seed: int = 0, **kwargs: Any) -> tuple[list[Row], Any]:
    """The embedded default: train the digits MLP, report its weights and activations, and the
    quantized model's accuracy per method. ``(rows, ModelReport)``."""
    from ._model import model_report

    return model_report(seed=seed, **kwargs)
