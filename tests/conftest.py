"""Shared fixtures: ``xp`` runs a test once per array backend (array-api-extra's Backend is the model).

CPU backends always run: numpy, array_api_strict, torch, jax. GPU backends (torch-cuda, jax-gpu, cupy)
run where a GPU and the library exist; elsewhere their cases are not collected (deselected by
:func:`pytest_collection_modifyitems`: a parameter naming an unavailable GPU backend, or the ``gpu``
marker without any GPU), so the summary's skips are real skips.

Markers (pyproject.toml): ``slow`` (long grids, fuzz campaigns, multi-process and torch.compile tests;
the default run deselects them, ``python -m pytest -q -m slow`` runs them) and ``gpu``.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest


class Backend(enum.Enum):
    NUMPY = "numpy"
    ARRAY_API_STRICT = "array_api_strict"
    TORCH = "torch"
    JAX = "jax"
    TORCH_CUDA = "torch-cuda"
    JAX_GPU = "jax-gpu"
    CUPY = "cupy"


@functools.cache
def _torch_cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@functools.cache
def _jax_gpu_available() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    import jax

    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


@functools.cache
def _cupy_available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device
        return False


#: Parameter values naming a GPU backend -> whether it exists here.
_GPU_PARAMS = {"torch-cuda": _torch_cuda_available, "cuda": _torch_cuda_available, "jax-gpu": _jax_gpu_available,
               "cupy": _cupy_available}


def _needs_missing_gpu(item) -> bool:
    """Whether ``item`` is a GPU case that cannot run here: the ``gpu`` marker (``gpu("torch-cuda")``: that
    backend; no argument: any) without its GPU, or a parameter (a :class:`Backend` or a backend/device name) naming a GPU backend that is not available."""
    marker = item.get_closest_marker("gpu")
    if marker is not None and not any(_GPU_PARAMS[name]() for name in (marker.args or _GPU_PARAMS)):
        return True
    return any(name in _GPU_PARAMS and not _GPU_PARAMS[name]() for name in _param_names(item))


def _param_names(item) -> set:
    """The parameter values of ``item`` that are strings or :class:`Backend` members, as names."""
    callspec = getattr(item, "callspec", None)
    values = callspec.params.values() if callspec is not None else ()
    return {v.value if isinstance(v, Backend) else v for v in values if isinstance(v, (str, Backend))}


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(config, items):
    """GPU cases are collected only where their GPU exists (instead of one skip each); a case of a test
    marked ``slow_on("jax")`` whose parameters name ``jax`` gets the ``slow`` marker."""
    keep, drop = [], []
    for item in items:
        slow_on = item.get_closest_marker("slow_on")
        if slow_on is not None and _param_names(item) & set(slow_on.args):
            item.add_marker(pytest.mark.slow)
        (drop if _needs_missing_gpu(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def make_backend(backend: Backend) -> SimpleNamespace:
    """``xp`` (the array-API namespace), ``device`` and ``asarray(np_array)`` for one backend."""
    if backend is Backend.NUMPY:
        import array_api_compat.numpy as xp

        return SimpleNamespace(name=backend.value, xp=xp, device="cpu", asarray=np.asarray)
    if backend is Backend.ARRAY_API_STRICT:
        import array_api_strict as xp

        return SimpleNamespace(name=backend.value, xp=xp, device=None, asarray=lambda a: xp.asarray(a))
    if backend in (Backend.TORCH, Backend.TORCH_CUDA):
        import array_api_compat.torch as xp
        import torch

        device = torch.device("cuda" if backend is Backend.TORCH_CUDA else "cpu")
        return SimpleNamespace(
            name=backend.value, xp=xp, device=device, asarray=lambda a: torch.as_tensor(np.asarray(a), device=device)
        )
    if backend in (Backend.JAX, Backend.JAX_GPU):
        import jax
        import jax.numpy as xp

        device = jax.devices("gpu" if backend is Backend.JAX_GPU else "cpu")[0]
        return SimpleNamespace(name=backend.value, xp=xp, device=device, asarray=lambda a: jax.device_put(np.asarray(a), device))
    if backend is Backend.CUPY:
        import array_api_compat.cupy as xp
        import cupy

        return SimpleNamespace(name=backend.value, xp=xp, device=cupy.cuda.Device(0), asarray=cupy.asarray)
    raise AssertionError(backend)


_SKIP_REASON = {
    Backend.TORCH_CUDA: (_torch_cuda_available, "torch has no CUDA device here"),
    Backend.JAX_GPU: (_jax_gpu_available, "jax has no GPU device here"),
    Backend.CUPY: (_cupy_available, "cupy or a CUDA device is not available here"),
}


@pytest.fixture(params=list(Backend), ids=lambda b: b.value)
def backend(request) -> SimpleNamespace:
    """One array backend per parametrization; GPU backends are skipped where there is no GPU."""
    if request.param in _SKIP_REASON:
        available, reason = _SKIP_REASON[request.param]
        if not available():
            pytest.skip(reason)
    return make_backend(request.param)


@pytest.fixture
def xp(backend):
    """The array-API namespace of the current backend."""
    return backend.xp


def to_numpy(a) -> np.ndarray:
    """Any backend's array as a numpy array (for comparisons)."""
    if hasattr(a, "get"):  # cupy
        return a.get()
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    if type(a).__module__.startswith("array_api_strict"):
        import array_api_strict

        return np.asarray(array_api_strict.asarray(a, copy=True)._array)
    return np.asarray(a)


#: GPU backends. Their float32 arithmetic differs from the CPU's in the ways docs/gpu.md "GPU arithmetic"
#: lists: torch's CUDA kernels divide by a Python scalar as a multiplication by its float32 reciprocal,
#: XLA on GPU divides with PTX ``div.full.f32`` (at most 2 ulp off, not correctly rounded), CuPy flushes
#: float32 subnormals to zero, and sums made with atomic adds (a histogram's re-binned parts) come in
#: any order.
GPU_BACKENDS = frozenset({"torch-cuda", "jax-gpu", "cupy"})
#: Backends that flush float32 subnormals to zero: XLA on the CPU and CuPy (compiled with -ftz=true); XLA
#: on a GPU keeps them (the H200 runs: exact on subnormal data).
FLUSHING_BACKENDS = frozenset({"jax", "cupy"})
#: The most a GPU's float32 division is off from the correctly rounded quotient, in ulp (div.full.f32).
GPU_DIVISION_ULPS = 2


def flushed(a) -> np.ndarray:
    """``a`` with floating subnormals replaced by zeros of the same sign, as flush-to-zero hardware computes."""
    a = np.asarray(a)
    if a.dtype.kind != "f":
        return a
    subnormal = (a != 0) & (np.abs(a) < np.finfo(a.dtype).tiny)
    return np.where(subnormal, np.copysign(np.zeros_like(a), a), a)


def ulp_distance(a, b) -> np.ndarray:
    """How many representable floats lie between ``a`` and ``b`` (same float dtype; 0 for equal values,
    +0.0 and -0.0 included; NaN against NaN counts as 0, NaN against a number as a huge distance)."""
    a, b = np.asarray(a), np.asarray(b)
    itype = {4: np.int32, 8: np.int64, 2: np.int16}[a.dtype.itemsize]

    def ordered(v):  # the float's bits as an integer that increases with the value
        i = v.view(itype).astype(np.int64)
        return np.where(i < 0, np.int64(np.iinfo(itype).min) - i, i)

    dist = np.abs(ordered(a) - ordered(b))
    both_nan, one_nan = np.isnan(a) & np.isnan(b), np.isnan(a) ^ np.isnan(b)
    return np.where(both_nan, 0, np.where(one_nan, np.iinfo(np.int64).max, dist))


def assert_same_on_device(actual, expected, backend_name: str, what: str = "", *, ulps: int = GPU_DIVISION_ULPS) -> None:
    """Bit for bit (NaN equals NaN) on CPU backends. On a GPU backend (docs/gpu.md "GPU arithmetic"):
    subnormals compared as zeros where the backend flushes them, and each value within ``ulps`` ulp of
    the CPU's."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if backend_name in FLUSHING_BACKENDS and backend_name in GPU_BACKENDS:
        actual, expected = flushed(actual), flushed(expected)
    if backend_name not in GPU_BACKENDS or actual.dtype.kind != "f":
        same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        assert same.all(), (what, actual[~same][:8], expected[~same][:8])
        return
    far = ulp_distance(actual, expected) > ulps
    assert not far.any(), (what, actual[far][:8], expected[far][:8])


def assert_counts_one_bin_apart(actual, expected, what: str = "") -> None:
    """Histogram counts in which each value may sit in a bin next to its bin in ``expected`` and no
    further (a value on a bin edge, where a GPU's division rounds the other way): the same total, and
    each cumulative count lies between ``expected``'s cumulative counts one bin before and one after."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    ca, ce = np.cumsum(actual, axis=-1), np.cumsum(expected, axis=-1)
    assert np.array_equal(ca[..., -1], ce[..., -1]), (what, "totals", ca[..., -1], ce[..., -1])
    zero = np.zeros_like(ce[..., :1])
    before = np.concatenate([zero, ce[..., :-1]], axis=-1)
    after = np.concatenate([ce[..., 1:], ce[..., -1:]], axis=-1)
    ok = (before <= ca) & (ca <= after)
    assert ok.all(), (what, "a value moved more than one bin", np.argwhere(~ok)[:8])


def to_torch(a):
    """A numpy array (bfloat16 from ml_dtypes included) as a CPU torch tensor with the same bits."""
    import torch

    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def adapter_backend(name: str, generic) -> SimpleNamespace:
    """An observer family's classes on one backend: ``mod`` holds the classes (``generic``, the family's
    ``_array_*`` module, for numpy and array_api_strict), ``asarray`` converts numpy input, ``kw`` goes to
    the constructors. GPU backends are skipped where no GPU exists."""
    if name == "numpy":
        return SimpleNamespace(name=name, mod=generic, asarray=np.asarray, kw={})
    if name == "array_api_strict":
        xps = pytest.importorskip("array_api_strict")
        return SimpleNamespace(name=name, mod=generic, asarray=lambda a: xps.asarray(a), kw={"xp": xps})
    if name == "torch":
        from observers_core.adapters import torch as tobs

        return SimpleNamespace(name=name, mod=tobs, asarray=to_torch, kw={})
    if name == "jax":
        pytest.importorskip("jax")
        import jax.numpy as jnp

        from observers_core.adapters import jax as jobs

        return SimpleNamespace(name=name, mod=jobs, asarray=jnp.asarray, kw={})
    if name == "cupy":
        if not _cupy_available():
            pytest.skip("cupy or a CUDA device is not available here")
        import cupy

        from observers_core.adapters import cupy as cobs

        return SimpleNamespace(name=name, mod=cobs, asarray=cupy.asarray, kw={})
    raise AssertionError(name)


class TraceDelta:
    """How many times ``jax.jit`` traced ``fn`` since this was made (``counts``: the JAX adapter's
    ``TRACES``, which its backend increments on every trace of a core function)."""

    def __init__(self, counts, fn):
        self.counts, self.fn, self.start = counts, fn, counts[fn]

    @property
    def count(self) -> int:
        return self.counts[self.fn] - self.start


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Skips grouped by reason, with counts (one line per reason instead of one per test)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section("skipped, by reason")
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{count:6d}  {reason}")
