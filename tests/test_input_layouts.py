"""Inputs that are not C-contiguous (transposed, channels_last, sliced with a step, expanded or broadcast with
zero strides, negative strides, Fortran order, offset views, tensors that require grad) give every observer
class the state and qparams of the same values in a contiguous copy, bit for bit (the compiled host
kernels read raw buffers; a layout they misread would show here)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers

from conftest import to_numpy

CLASSES = {
    "MinMaxObserver": {}, "MovingAverageMinMaxObserver": {}, "PerChannelMinMaxObserver": {"ch_axis": 1},
    "MovingAveragePerChannelMinMaxObserver": {"ch_axis": 1}, "HistogramObserver": {}, "KLObserver": {},
    "MSEObserver": {}, "PercentileObserver": {}, "MixObserver": {},
    "PerGroupMinMaxObserver": {"group_size": 4, "axis": 3}, "FP8Observer": {},
    "PerBlockMXObserver": {"dtype": "mxfp4", "block_size": 4, "axis": 3},
    "PerBlockBFPObserver": {"block_size": 4, "axis": 3},
}


def _numpy_layouts(rng):
    base = rng.standard_normal((6, 8, 4, 4)).astype(np.float32)
    yield "transposed", base.transpose(1, 0, 3, 2)
    yield "sliced", rng.standard_normal((6, 16, 4, 8)).astype(np.float32)[:, ::2, :, ::2]
    yield "broadcast", np.broadcast_to(rng.standard_normal((1, 8, 1, 4)).astype(np.float32), (6, 8, 4, 4))
    yield "negative_strides", base[::-1, :, ::-1]
    yield "fortran", np.asfortranarray(base)


def _torch_layouts(torch, g):
    base = torch.randn(6, 8, 4, 4, generator=g)
    yield "transposed", base.transpose(0, 1).transpose(2, 3)
    yield "channels_last", base.contiguous(memory_format=torch.channels_last)
    yield "sliced", torch.randn(6, 16, 4, 8, generator=g)[:, ::2, :, ::2]
    yield "expanded", torch.randn(1, 8, 1, 4, generator=g).expand(6, 8, 4, 4)
    yield "requires_grad", base.clone().requires_grad_(True)
    yield "offset_view", torch.randn(7, 8, 4, 4, generator=g)[1:]


def _observed(obs, batches):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in batches:
            obs(x)
        qparams = obs.calculate_qparams()
    return [to_numpy(v) for v in (*obs.state_dict().values(), *qparams)]


def _assert_same(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w, equal_nan=True), what


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_numpy_layouts_observe_as_contiguous(name):
    module = next(m for m in (_array_observers, _array_histogram, _array_calibration, _array_lowbit) if hasattr(m, name))
    for label, x in _numpy_layouts(np.random.default_rng(0)):
        batches = [x, x * np.float32(2), x * np.float32(-0.5)]  # NumPy's products keep a dense layout
        got = _observed(getattr(module, name)(**CLASSES[name]), batches)
        want = _observed(getattr(module, name)(**CLASSES[name]), [np.ascontiguousarray(b) for b in batches])
        _assert_same(got, want, (name, label))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_torch_layouts_observe_as_contiguous(name):
    torch = pytest.importorskip("torch")
    from observers_core.adapters import torch as tobs

    for label, x in _torch_layouts(torch, torch.Generator().manual_seed(0)):
        batches = [x, x * 2, x * -0.5]  # elementwise products keep a dense layout (and requires_grad)
        got = _observed(getattr(tobs, name)(**CLASSES[name]), batches)
        want = _observed(getattr(tobs, name)(**CLASSES[name]), [b.detach().contiguous() for b in batches])
        _assert_same(got, want, (name, label))
