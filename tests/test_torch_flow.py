"""Our observers inside torch's own tooling: eager ``prepare``/``convert``, ``FakeQuantize``, QAT, and
observer state dicts of prepared models. The anchor is the same flow run with torch's observers:
quantized weights (int_repr, scales, zero points), activation qparams and outputs must be identical.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402
from torch.ao.quantization import observer as tobs  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402
from test_torch_parity import assert_bitwise_equal, one_torch_thread  # noqa: E402,F401

ENGINE = next((e for e in ("x86", "fbgemm") if e in torch.backends.quantized.supported_engines), None)
pytestmark = pytest.mark.skipif(ENGINE is None, reason="no x86/fbgemm quantized engine on this CPU")


class TinyNet(nn.Module):
    """quant -> conv+relu -> conv -> flatten -> linear -> dequant, for 3x8x8 inputs."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.conv2(self.relu(self.conv1(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


def make_model(seed=0):
    torch.manual_seed(seed)
    model = TinyNet().eval()
    return tq.fuse_modules(model, [["conv1", "relu"]])


def make_batches(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 3, 8, 8, generator=g) * (1 + i) for i in range(n)]


# The same QConfig recipe built from either module (torch's observers or ours).
RECIPES = {
    "minmax/per-channel": lambda m: tq.QConfig(
        activation=m.MinMaxObserver.with_args(reduce_range=True),
        weight=m.default_per_channel_weight_observer),
    "moving-average/per-tensor": lambda m: tq.QConfig(
        activation=m.MovingAverageMinMaxObserver.with_args(averaging_constant=0.1, reduce_range=True),
        weight=m.default_weight_observer),
    "symmetric/moving-average-per-channel/-127..127": lambda m: tq.QConfig(
        activation=m.MinMaxObserver.with_args(qscheme=torch.per_tensor_symmetric, dtype=torch.quint8),
        weight=m.MovingAveragePerChannelMinMaxObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-127, quant_max=127, eps=2**-12)),
    "histogram/per-channel": lambda m: tq.QConfig(
        activation=m.HistogramObserver.with_args(bins=256, reduce_range=True),
        weight=m.default_per_channel_weight_observer),
}


def quantize(model, qconfig, batches):
    """prepare -> calibrate -> convert; returns the prepared and the converted model."""
    model = copy.deepcopy(model)
    model.qconfig = qconfig
    prepared = tq.prepare(model)
    with torch.no_grad():
        for x in batches:
            prepared(x)
    return prepared, tq.convert(copy.deepcopy(prepared))


@contextlib.contextmanager
def _quiet():
    """Silences torch's deprecation warnings (quantized tensors, reduce_range)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def assert_same_quantized_model(expected, actual):
    checked = 0
    for (name, e), (_, a) in zip(expected.named_modules(), actual.named_modules()):
        assert type(e) is type(a), name
        if hasattr(e, "weight") and callable(e.weight):
            we, wa = e.weight(), a.weight()
            assert we.qscheme() == wa.qscheme(), name
            assert torch.equal(we.int_repr(), wa.int_repr()), name
            if we.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                assert_bitwise_equal(we.q_per_channel_scales(), wa.q_per_channel_scales(), name)
                assert_bitwise_equal(we.q_per_channel_zero_points(), wa.q_per_channel_zero_points(), name)
            else:
                assert we.q_scale() == wa.q_scale() and we.q_zero_point() == wa.q_zero_point(), name
            checked += 1
        if hasattr(e, "scale"):
            assert float(e.scale) == float(a.scale) and int(e.zero_point) == int(a.zero_point), name
    assert checked == 3  # conv1 (fused with relu), conv2, fc


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_eager_post_training_flow_matches_torch(recipe):
    torch.backends.quantized.engine = ENGINE
    model, batches = make_model(), make_batches()
    with _quiet():
        prepared_t, quantized_t = quantize(model, RECIPES[recipe](tobs), batches)
        prepared_o, quantized_o = quantize(model, RECIPES[recipe](ours), batches)
    assert isinstance(prepared_o.conv2.activation_post_process, ours.UniformQuantizationObserverBase)
    assert_same_quantized_model(quantized_t, quantized_o)
    test = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    with _quiet():
        out_t, out_o = quantized_t(test), quantized_o(test)
    assert torch.equal(out_t, out_o)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_with_our_observer(per_channel):
    if per_channel:
        kwargs = dict(quant_min=-128, quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                      ch_axis=1, averaging_constant=0.2)
        name = "MovingAveragePerChannelMinMaxObserver"
    else:
        kwargs = dict(quant_min=0, quant_max=255, dtype=torch.quint8, averaging_constant=0.2)
        name = "MovingAverageMinMaxObserver"
    theirs = tq.FakeQuantize(observer=getattr(tobs, name), **kwargs)
    mine = tq.FakeQuantize(observer=getattr(ours, name), **kwargs)
    assert isinstance(mine.activation_post_process, getattr(ours, name))
    for x in make_batches(5, seed=3):
        assert torch.equal(theirs(x), mine(x))
        assert_bitwise_equal(theirs.scale, mine.scale)
        assert_bitwise_equal(theirs.zero_point, mine.zero_point)
    assert theirs.state_dict().keys() == mine.state_dict().keys()


def test_quantization_aware_training_flow_matches_torch():
    torch.backends.quantized.engine = ENGINE

    def qat_qconfig(m):
        return tq.QConfig(
            activation=tq.FakeQuantize.with_args(observer=m.MovingAverageMinMaxObserver, quant_min=0,
                                                 quant_max=255, dtype=torch.quint8, reduce_range=False),
            weight=tq.FakeQuantize.with_args(observer=m.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                             quant_max=127, dtype=torch.qint8,
                                             qscheme=torch.per_channel_symmetric))

    results = []
    for module in (tobs, ours):
        model = make_model().train()
        model.qconfig = qat_qconfig(module)
        with _quiet():
            prepared = tq.prepare_qat(model)
            outputs = [prepared(x) for x in make_batches(3, seed=4)]
            results.append((outputs, tq.convert(prepared.eval())))
    (out_t, quant_t), (out_o, quant_o) = results
    for a, b in zip(out_t, out_o):
        assert torch.equal(a, b)
    assert_same_quantized_model(quant_t, quant_o)


def test_observer_state_dict_of_a_prepared_model_with_both_kinds_of_observers():
    torch.backends.quantized.engine = ENGINE
    model = make_model()
    model.qconfig = RECIPES["minmax/per-channel"](ours)
    model.fc.qconfig = RECIPES["moving-average/per-tensor"](tobs)  # torch's observer on one layer
    with _quiet():
        prepared = tq.prepare(copy.deepcopy(model))
        fresh = tq.prepare(copy.deepcopy(model))
    assert isinstance(prepared.fc.activation_post_process, tobs.MovingAverageMinMaxObserver)
    assert isinstance(prepared.conv2.activation_post_process, ours.MinMaxObserver)
    with torch.no_grad():
        for x in make_batches():
            prepared(x)
    state = ours.get_observer_state_dict(prepared)
    assert state.keys() == tobs.get_observer_state_dict(prepared).keys()
    assert all("activation_post_process" in key for key in state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    ours.load_observer_state_dict(fresh, loaded)
    for key, value in prepared.state_dict().items():
        if "activation_post_process" in key:
            assert_bitwise_equal(value, fresh.state_dict()[key], key)
    with _quiet():
        assert_same_quantized_model(tq.convert(copy.deepcopy(prepared)), tq.convert(copy.deepcopy(fresh)))
    # torch's loader accepts a model holding our observers too
    with _quiet():
        other = tq.prepare(copy.deepcopy(model))
    tobs.load_observer_state_dict(other, ours.get_observer_state_dict(prepared))
    assert_bitwise_equal(prepared.conv2.activation_post_process.max_val, other.conv2.activation_post_process.max_val)
    # a missing observer entry is reported, not skipped
    incomplete = copy.copy(state)
    incomplete.pop("conv2.activation_post_process.min_val")
    with pytest.raises(ValueError, match="conv2.activation_post_process.min_val"):
        ours.load_observer_state_dict(fresh, incomplete)


def test_with_args_keeps_ignore_nonfinite_through_prepare():
    model = make_model()
    model.qconfig = tq.QConfig(activation=ours.MinMaxObserver.with_args(ignore_nonfinite=True),
                               weight=ours.default_per_channel_weight_observer)
    with _quiet():
        prepared = tq.prepare(model)
    x = make_batches(1)[0]
    x[0, 0, 0, 0] = float("nan")
    with torch.no_grad():
        prepared(x)
    observer = prepared.quant.activation_post_process
    assert observer.ignore_nonfinite
    finite = x[torch.isfinite(x)]
    assert observer.min_val.item() == finite.min().item() and observer.max_val.item() == finite.max().item()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_fx_graph_mode_flow_matches_torch(recipe):
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    example = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    outputs = []
    for module in (tobs, ours):
        mapping = tq.QConfigMapping().set_global(RECIPES[recipe](module))
        with _quiet():
            prepared = prepare_fx(copy.deepcopy(model), mapping, example_inputs=(example,))
            for x in make_batches(3, seed=5):
                prepared(x[:, :, :8, :8])
            outputs.append(convert_fx(prepared)(example))
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("name", ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"])
def test_calibration_observers_in_the_eager_flow(name):
    """torch.ao has no KL/MSE/percentile/Mix observer to compare with: ``convert`` builds quantized modules
    whose output scale and zero point are exactly the ones our activation observers computed."""
    torch.backends.quantized.engine = ENGINE
    qconfig = tq.QConfig(activation=getattr(ours, name).with_args(bins=512, dtype=torch.quint8), weight=ours.default_per_channel_weight_observer)
    with _quiet():
        prepared, quantized = quantize(make_model(), qconfig, make_batches())
    for layer in ("conv1", "conv2", "fc"):
        scale, zero_point = getattr(prepared, layer).activation_post_process.calculate_qparams()
        module = getattr(quantized, layer)
        assert (module.scale, module.zero_point) == (float(scale), int(zero_point)), layer
    with _quiet():
        out = quantized(make_batches(1, seed=9)[0])
    assert out.shape == (6, 5) and torch.isfinite(out).all()
