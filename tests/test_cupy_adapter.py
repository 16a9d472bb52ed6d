"""The CuPy observers (``observers_core.adapters.cupy``) on a GPU; skipped, with the reason, elsewhere.

Oracle: the installed ``torch.ao.quantization.observer`` on CPU, fed the same data. CuPy runs each
array operation as its own kernel (no fused multiply-add, true division), so parity is bit for bit, apart
from float32 subnormals: CuPy compiles its kernels with -ftz=true, so they compare as zeros (docs/gpu.md
"GPU arithmetic").
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import _cupy_available, to_numpy

cupy = pytest.importorskip("cupy", reason="cupy is not installed")
if not _cupy_available():
    pytest.skip("cupy is installed but no CUDA device is available here", allow_module_level=True)
torch = pytest.importorskip("torch")
import torch.ao.quantization.observer as tao  # noqa: E402

from observers_core.adapters import cupy as cobs  # noqa: E402
from test_array_adapters import (  # noqa: E402
    MINMAX_CLASSES,
    PER_CHANNEL,
    assert_parity,
    assert_same_bits,
    parity_cases,
    run_ours,
    run_torch,
    to_torch,
    torch_kwargs,
)

# cupy has float16 but no bfloat16
CUPY_KINDS = (
    "normal", "constant", "negative", "positive", "subnormal", "huge", "float16", "float64", "int32", "uint8", "int64",
)


def make(cls_name: str, **kwargs):
    return getattr(cobs, cls_name)(**kwargs)


@pytest.mark.parametrize("cls_name, kwargs, batches, kind", parity_cases(seed=777, n=48, kinds=CUPY_KINDS))
def test_parity_with_torch(cls_name, kwargs, batches, kind):
    ours = run_ours(make(cls_name, **kwargs), batches, cupy.asarray)
    assert_parity(ours, run_torch(cls_name, kwargs, batches), flush_subnormals=True)


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_state_and_qparams_stay_on_the_inputs_gpu(cls_name):
    kwargs = {"ch_axis": 1} if cls_name in PER_CHANNEL else {}
    device = cupy.cuda.Device(cupy.cuda.runtime.getDeviceCount() - 1)  # the last GPU, not the default if several
    with device:
        x = cupy.asarray(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    obs = make(cls_name, **kwargs)
    assert obs(x) is x
    for arr in (*obs.state, *obs.calculate_qparams(), *obs.state_dict().values()):
        assert isinstance(arr, cupy.ndarray) and arr.device == device


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_input_on_another_gpu_raises_and_keeps_state(cls_name):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    obs = make(cls_name)
    with cupy.cuda.Device(0):
        obs(cupy.ones((2, 3), cupy.float32))
    before = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    with cupy.cuda.Device(1):
        other = cupy.zeros((2, 3), cupy.float32)
    with pytest.raises(ValueError, match="x is on device"):
        obs(other)
    after = {k: to_numpy(v) for k, v in obs.state_dict().items()}
    for k in before:
        assert_same_bits(after[k], before[k], k)


def test_numpy_input_raises_type_error():
    obs = cobs.MinMaxObserver()
    with pytest.raises(TypeError, match="cupy.ndarray"):
        obs(np.ones(3, np.float32))
    assert float(obs.state.min_val.get()) == np.inf


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_nan_poisons_by_default_and_is_skipped_on_request(cls_name):
    kwargs = {"ch_axis": 0} if cls_name in PER_CHANNEL else {}
    rng = np.random.default_rng(3)
    clean = [rng.standard_normal((3, 5000)).astype(np.float32) for _ in range(2)]
    dirty = [b.copy() for b in clean]
    for b, c in zip(dirty, clean):
        b[:, -1], b[:, 3] = np.nan, np.inf
        c[:, -1], c[:, 3] = c[:, 0], c[:, 0]
    poisoned = run_ours(make(cls_name, **kwargs), dirty, cupy.asarray)
    ref = run_torch(cls_name, kwargs, dirty)
    for key in ("min_val", "max_val"):
        assert_same_bits(poisoned[0][key], ref[0][key], key)
    ignoring = run_ours(make(cls_name, ignore_nonfinite=True, **kwargs), dirty, cupy.asarray)
    assert_parity(ignoring, run_torch(cls_name, kwargs, clean))


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_state_dict_round_trip_and_torch_interop(cls_name):
    rng = np.random.default_rng(9)
    kwargs = {"ch_axis": -1, "qscheme": "per_channel_symmetric", "dtype": "qint8"} if cls_name in PER_CHANNEL else {}
    batches = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(3)]
    obs = make(cls_name, **kwargs)
    ours = run_ours(obs, batches, cupy.asarray)
    for source in (obs.state_dict(), ours[0]):  # cupy arrays, numpy arrays
        other = make(cls_name, **kwargs)
        other.load_state_dict(source)
        assert isinstance(other.state.min_val, cupy.ndarray)
        assert_parity(run_ours(other, [], cupy.asarray), ours)
    t_obs = getattr(tao, cls_name)(**torch_kwargs(kwargs))
    for b in batches:
        t_obs(to_torch(b))
    other = make(cls_name, **kwargs)
    other.load_state_dict(t_obs.state_dict())  # torch CPU tensors as they are
    assert_parity(run_ours(other, [], cupy.asarray), ours)
    t_new = getattr(tao, cls_name)(**torch_kwargs(kwargs))
    t_new.load_state_dict({k: torch.from_numpy(v.get()) for k, v in obs.state_dict().items()})
    scale, zp = t_new.calculate_qparams()
    assert_same_bits(ours[1][0], scale.numpy(), "scale")
    np.testing.assert_array_equal(ours[1][1], zp.numpy())


