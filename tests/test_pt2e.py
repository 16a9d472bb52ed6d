"""torchao's PT2E flow (``prepare_pt2e``/``prepare_qat_pt2e`` -> calibrate/train -> ``convert_pt2e``) with
our torch observers in the ``QuantizationSpec``: the same quantize/dequantize nodes, with identical
scales and zero points, and identical outputs, as with torchao's own observers on the same batches."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao.quantization.pt2e")

import torchao.quantization.pt2e.observer as ao  # noqa: E402
from torchao.quantization.pt2e import FakeQuantize as AOFakeQuantize  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

import observers_core.adapters.torch as ours  # noqa: E402

EPS = 2**-12  # torchao's x86 config passes eps=2**-12 to its observers


class ConvLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _quantizer(activation, weight, *, is_qat=False):
    """torchao's x86 quantizer with its default int8 config, the observer constructors replaced."""
    config = get_default_x86_inductor_quantization_config(is_qat=is_qat)
    config = dataclasses.replace(
        config,
        input_activation=dataclasses.replace(config.input_activation, observer_or_fake_quant_ctr=activation),
        output_activation=dataclasses.replace(config.output_activation, observer_or_fake_quant_ctr=activation),
        weight=dataclasses.replace(config.weight, observer_or_fake_quant_ctr=weight),
    )
    return X86InductorQuantizer().set_global(config)


def _batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 8, 8, generator=g) * (1 + i) for i in range(n)]


def _qdq_nodes(converted):
    """Every quantize/dequantize call: its op and its arguments (constants as themselves, get_attr
    tensors such as per-channel scales by value)."""
    params = dict(converted.named_buffers()) | dict(converted.named_parameters())
    nodes = []
    for node in converted.graph.nodes:
        if node.op == "call_function" and "quantize" in str(node.target):
            args = []
            for a in node.args[1:]:
                if isinstance(a, torch.fx.Node):
                    args.append(params[a.target].tolist() if a.op == "get_attr" else a.op)
                else:
                    args.append(a)
            nodes.append((str(node.target), args))
    return nodes


def _calibrate_and_convert(activation, weight):
    torch.manual_seed(0)
    model = ConvLinear().eval()
    batches = _batches()
    exported = torch.export.export(model, (batches[0],)).module()
    prepared = prepare_pt2e(exported, _quantizer(activation, weight))
    for x in batches:
        prepared(x)
    converted = convert_pt2e(prepared)
    return prepared, _qdq_nodes(converted), converted(batches[0])


PAIRS = {
    "minmax": (ao.MinMaxObserver, ours.MinMaxObserver, ao.PerChannelMinMaxObserver, ours.PerChannelMinMaxObserver),
    "moving_average": (
        ao.MovingAverageMinMaxObserver,
        ours.MovingAverageMinMaxObserver,
        ao.MovingAveragePerChannelMinMaxObserver,
        ours.MovingAveragePerChannelMinMaxObserver,
    ),
    "histogram": (ao.HistogramObserver, ours.HistogramObserver, ao.PerChannelMinMaxObserver, ours.PerChannelMinMaxObserver),
}


@pytest.mark.parametrize("with_args", [True, False], ids=["with_args", "class"])
@pytest.mark.parametrize("family", sorted(PAIRS))
def test_prepare_convert_pt2e_equals_torchao(family, with_args):
    ao_act, our_act, ao_weight, our_weight = PAIRS[family]

    def ctr(cls):
        return cls.with_args(eps=EPS) if with_args else cls

    _, want_nodes, want_out = _calibrate_and_convert(ctr(ao_act), ctr(ao_weight))
    _, got_nodes, got_out = _calibrate_and_convert(ctr(our_act), ctr(our_weight))
    kinds = sorted(n[0] for n in want_nodes)
    assert kinds.count("quantized_decomposed.quantize_per_tensor.default") == 2, kinds  # torchao converted
    assert got_nodes == want_nodes
    assert torch.equal(got_out, want_out)


def test_calibration_observer_lowers_to_its_own_qparams():
    """torchao has no KL observer to compare with: the converted graph carries exactly the scale and zero
    point our observer computed, and the output is the fake-quantised float path."""
    prepared, nodes, _ = _calibrate_and_convert(ours.KLObserver.with_args(eps=EPS), ours.PerChannelMinMaxObserver)
    observers = [m for m in prepared.modules() if isinstance(m, ours.KLObserver)]
    assert len(observers) == 2
    want = set()
    for obs in observers:
        scale, zero_point = obs.calculate_qparams()
        want.add((float(scale), int(zero_point)))
    got = {(args[0], args[1]) for target, args in nodes if target.endswith("quantize_per_tensor.default")}
    assert got == want


@pytest.mark.parametrize("observer", [ours.PerGroupMinMaxObserver(dtype="int4", group_size=32), ours.PerBlockMXObserver(dtype="mxfp8_e4m3")],
                         ids=["per_group", "mx"])
def test_lowbit_observer_refuses_to_be_dropped_by_convert(observer):
    """torchao's convert has no op for these formats: it must fail, not return a float model. (A quantizer
    that builds low-bit observers is simulated by swapping one into a prepared graph.)"""
    model = ConvLinear().eval()
    x = _batches(1)[0]
    exported = torch.export.export(model, (x,)).module()
    prepared = prepare_pt2e(exported, _quantizer(ours.MinMaxObserver, ours.PerChannelMinMaxObserver))
    prepared(x)
    names = [name for name, m in prepared.named_children()
             if isinstance(m, ours.PerChannelMinMaxObserver) and m.min_val.shape == (10,)]  # fc.weight: (10, 288)
    assert len(names) == 1
    setattr(prepared, names[0], observer)
    prepared(x)
    with pytest.raises(NotImplementedError, match="convert_pt2e"):
        convert_pt2e(prepared)


def test_with_args_keeps_torch_ao_semantics():
    """``with_args`` still gives torch.ao's ``_PartialWrapper`` (QConfig equality, FX), now with the
    class's ``__name__``; chained ``with_args``/``with_callable_args`` keep both."""
    from torch.ao.quantization.observer import _PartialWrapper

    ctr = ours.PerChannelMinMaxObserver.with_args(eps=EPS).with_args(ch_axis=1)
    assert isinstance(ctr, _PartialWrapper) and ctr.__name__ == "PerChannelMinMaxObserver"
    obs = ctr()
    assert obs.ch_axis == 1 and float(obs.eps) == EPS
    counter = iter(range(10))
    made = ours.MinMaxObserver.with_callable_args(quant_max=lambda: 100 + next(counter)).with_args(quant_min=0)
    assert (made().quant_max, made().quant_max) == (100, 101)
    assert made.__name__ == "MinMaxObserver"
    assert isinstance(ours.MinMaxObserver(), ao.ObserverBase)
    assert isinstance(ours.PlaceholderObserver(), ao.ObserverBase)


def _qat_steps(activation_observer, weight_observer, steps=3):
    torch.manual_seed(0)
    model = ConvLinear().train()
    batches = _batches(steps, seed=1)
    exported = torch.export.export(model, (batches[0],)).module()
    act = AOFakeQuantize.with_args(observer=activation_observer, eps=EPS, quant_min=0, quant_max=255, dtype=torch.uint8)
    weight = AOFakeQuantize.with_args(
        observer=weight_observer, eps=EPS, quant_min=-128, quant_max=127, dtype=torch.int8,
        qscheme=torch.per_channel_symmetric, ch_axis=0,
    )
    prepared = prepare_qat_pt2e(exported, _quantizer(act, weight, is_qat=True))
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.1)
    for x in batches:
        optimizer.zero_grad()
        prepared(x).square().mean().backward()
        optimizer.step()
    converted = convert_pt2e(prepared)
    return _qdq_nodes(converted), converted(batches[0])


def test_prepare_qat_pt2e_equals_torchao():
    want_nodes, want_out = _qat_steps(ao.MovingAverageMinMaxObserver, ao.MovingAveragePerChannelMinMaxObserver)
    got_nodes, got_out = _qat_steps(ours.MovingAverageMinMaxObserver, ours.MovingAveragePerChannelMinMaxObserver)
    assert any("quantize_per_tensor" in target for target, _ in want_nodes)
    assert got_nodes == want_nodes
    assert torch.equal(got_out, want_out)


@pytest.mark.parametrize("family", ["minmax", "histogram"])
@pytest.mark.slow  # torch.compile
def test_compiled_pt2e_prepared_model_matches_eager(family):
    """``torch.compile`` (dynamo, eager backend; the histogram observer graph-breaks into its host
    kernel) of a PT2E-prepared model: every observer ends with eager's qparams, bit for bit."""
    _, our_act, _, our_weight = PAIRS[family]
    batches = _batches()

    def prepared():
        torch.manual_seed(0)
        exported = torch.export.export(ConvLinear().eval(), (batches[0],)).module()
        return prepare_pt2e(exported, _quantizer(our_act.with_args(eps=EPS), our_weight.with_args(eps=EPS)))

    eager, compiled_model = prepared(), prepared()
    compiled = torch.compile(compiled_model, backend="eager")
    for x in batches:
        assert torch.equal(eager(x), compiled(x))
    pairs = [(a, b) for a, b in zip(eager.modules(), compiled_model.modules()) if isinstance(a, (our_act, our_weight))]
    assert len(pairs) == 4
    for a, b in pairs:
        for qa, qb in zip(a.calculate_qparams(), b.calculate_qparams()):
            assert qa.dtype == qb.dtype and torch.equal(qa, qb)
