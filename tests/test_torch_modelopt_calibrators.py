"""ModelOpt's MSE calibrators as torch modules (observers_core.adapters._torch_llm.ModelOptMseCalibrator,
NVFP4SweepCalibrator): equal to the family functions and to ModelOpt 0.47 bit for bit, state_dict round
trips, merged shards, bad input (state untouched)."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from observers_core.adapters._torch_llm import ModelOptMseCalibrator, NVFP4SweepCalibrator  # noqa: E402
from observers_core.families import nvfp4  # noqa: E402


def _bits(t):
    return t.contiguous().view(torch.int32)


def _int8_quant(x, amax):
    s = amax / 127.0
    return torch.round(torch.clamp(x / s, -127.0, 127.0)) * s


def _batches():
    g = torch.Generator().manual_seed(1)
    out = [torch.randn(16, 64, generator=g) * (1 + i) for i in range(4)]
    out[2][0, 0] = 40.0
    return out


@pytest.mark.parametrize("axis", [None, 0])
def test_mse_calibrator_equals_modelopt_and_the_functions(axis):
    batches = _batches()
    amax = batches[0].abs().amax() if axis is None else batches[0].abs().amax(dim=1, keepdim=True)
    cal = ModelOptMseCalibrator(_int8_quant, axis=axis, amax=amax)
    for b in batches:
        assert cal(b) is b
    cfg = nvfp4.MseConfig(axis=axis)
    xp = pytest.importorskip("array_api_compat.torch")
    m = nvfp4.mse_multipliers(cfg, xp=xp)
    state = nvfp4.mse_init(m.shape[0], () if axis is None else (16,), xp=xp)
    for b in batches:
        state = nvfp4.mse_update(state, nvfp4.mse_losses(b, amax, m, _int8_quant, cfg, xp=xp), xp=xp)
    assert torch.equal(_bits(cal.loss_sum), _bits(state.loss_sum))
    assert torch.equal(_bits(cal.compute_amax()), _bits(nvfp4.mse_amax(state, amax, m)))
    modelopt = pytest.importorskip("modelopt.torch.quantization.calib")
    theirs = modelopt.MseCalibrator(amax=amax.clone(), axis=axis, quant_func=_int8_quant)
    for b in batches:
        theirs.collect(b)
    assert torch.equal(_bits(cal.loss_sum), _bits(torch.stack(theirs._losses_sum)))
    assert torch.equal(_bits(cal.compute_amax()), _bits(theirs.compute_amax()))


def test_mse_calibrator_state_dict_and_merge():
    batches = _batches()
    amax = batches[0].abs().amax(dim=1, keepdim=True)
    whole = ModelOptMseCalibrator(_int8_quant, axis=0, amax=amax)
    for b in batches:
        whole(b)
    first = ModelOptMseCalibrator(_int8_quant, axis=0, amax=amax)
    for b in batches[:2]:
        first(b)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = ModelOptMseCalibrator(_int8_quant, axis=0)  # amax comes from the state_dict
    resumed.load_state_dict(torch.load(buf))
    for b in batches[2:]:
        resumed(b)
    for name in ("amax", "loss_sum", "exact", "count"):
        assert torch.equal(getattr(resumed, name), getattr(whole, name)), name
    # shards (batches 0, 2 and 1, 3) merged: the exact choice of the single pass
    a, b = (ModelOptMseCalibrator(_int8_quant, axis=0, amax=amax) for _ in range(2))
    for i, x in enumerate(batches):
        (a if i % 2 == 0 else b)(x)
    a.merge_(b)
    assert int(a.count) == 4 and torch.equal(a.compute_amax(exact=True), whole.compute_amax(exact=True))


def test_nvfp4_sweep_equals_the_function_and_modelopt():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 64, generator=g)
    x[2, 3] = 30.0
    x[5, :16] = 0.0
    gamax = x.abs().max()
    cal = NVFP4SweepCalibrator(global_amax=gamax)
    cal(x)
    best, losses = nvfp4.nvfp4_scale_sweep(x.reshape(-1, 16), gamax, xp=torch)
    assert torch.equal(_bits(cal.loss_sum), _bits(losses)) and torch.equal(_bits(cal.compute_amax()), _bits(best))
    assert torch.equal(cal.compute_amax(exact=True), best)
    # two batches: the summed losses' first minimum; a restored copy agrees
    y = torch.randn(8, 64, generator=g)
    cal(y)
    _, more = nvfp4.nvfp4_scale_sweep(y.reshape(-1, 16), gamax, xp=torch)
    assert torch.equal(_bits(cal.loss_sum), _bits(losses + more))
    copy = NVFP4SweepCalibrator()
    copy.load_state_dict(cal.state_dict())
    assert torch.equal(copy.compute_amax(), cal.compute_amax())
    pytest.importorskip("modelopt.torch.quantization.calib")
    from test_nvfp4_anchors import _modelopt_static_quant
    from modelopt.torch.quantization.calib import MseCalibrator, NVFP4MSECalibrator

    theirs = NVFP4MSECalibrator(amax=x.reshape(-1, 16).abs().amax(-1), global_amax=gamax, axis=0,
                                quant_func=_modelopt_static_quant(gamax))
    MseCalibrator.collect(theirs, x.reshape(-1, 16))
    fresh = NVFP4SweepCalibrator(global_amax=gamax)
    fresh(x)
    assert torch.equal(_bits(fresh.loss_sum), _bits(torch.stack(theirs._losses_sum)))
    assert torch.equal(_bits(fresh.compute_amax()), _bits(MseCalibrator.compute_amax(theirs)))


def test_bad_input_leaves_the_state():
    cal = ModelOptMseCalibrator(_int8_quant, amax=torch.tensor(2.0))
    with pytest.raises(TypeError, match="quantize"):
        ModelOptMseCalibrator(None)
    with pytest.raises(ValueError, match="amax is not set"):
        ModelOptMseCalibrator(_int8_quant)(torch.randn(4, 4))
    with pytest.raises(TypeError, match="x"):
        cal(torch.ones(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="no statistics"):
        cal.compute_amax()
    cal(torch.randn(4, 4))
    before = {k: v.clone() for k, v in cal.state_dict().items()}
    bad = dict(before)
    bad["exact"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="loss_sum / exact"):
        cal.load_state_dict(bad)
    with pytest.raises(ValueError, match="amax"):
        cal.merge_(ModelOptMseCalibrator(_int8_quant, amax=torch.tensor(3.0)))
    for k, v in cal.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="block_size"):
        NVFP4SweepCalibrator(block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        NVFP4SweepCalibrator(global_amax=torch.tensor(1.0))(torch.randn(2, 10))
