"""``torch.compile`` of the torch observers (issue 11): the compiled observer and a compiled prepared
model end with the same state and qparams, bit for bit, as eager ones fed the same batches.

Every torch observer class runs under ``backend="eager"`` (dynamo tracing, graph breaks included);
``backend="inductor"`` (10-30 s of compilation each on a small CPU) runs for MinMaxObserver, the
HistogramObserver and the prepared model only.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from observers_core.adapters import torch as tobs  # noqa: E402

pytestmark = pytest.mark.slow  # torch.compile: minutes of compiling

#: (class name, constructor kwargs, batch shape): every public torch observer class.
CASES = [
    ("MinMaxObserver", {}, (4, 16)),
    ("MinMaxObserver", dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric), (4, 16)),
    ("MovingAverageMinMaxObserver", dict(averaging_constant=0.25), (4, 16)),
    ("PerChannelMinMaxObserver", dict(ch_axis=1), (4, 6, 3)),
    ("MovingAveragePerChannelMinMaxObserver", dict(ch_axis=0, averaging_constant=0.5), (6, 8)),
    ("FixedQParamsObserver", dict(scale=1.0 / 128, zero_point=128), (4, 16)),
    ("HistogramObserver", dict(bins=128), (4, 16)),
    ("KLObserver", dict(bins=256), (4, 16)),
    ("MSEObserver", dict(bins=256), (4, 16)),
    ("PercentileObserver", dict(bins=256, percentile=99.0), (4, 16)),
    ("MixObserver", dict(bins=256), (4, 16)),
    ("PerGroupMinMaxObserver", dict(group_size=8), (4, 16)),
    ("FP8Observer", {}, (4, 16)),
    ("PerBlockMXObserver", dict(block_size=32), (2, 64)),
    ("PerBlockBFPObserver", {}, (2, 16)),
]
INDUCTOR = {("MinMaxObserver", 0), ("HistogramObserver", 6)}


def _batches(shape, n=4):
    rng = np.random.default_rng(1234)
    out = [rng.standard_normal(shape).astype(np.float32) * s for s in (1.0, 3.0, 0.5, 10.0)[:n]]
    out[2][..., 0] = 0.0  # a dead column
    return [torch.from_numpy(a) for a in out]


def _assert_same_bits(a, b, what):
    """Same dtype, shape and bits (one NaN payload)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    na, nb = a.numpy().copy(), b.numpy().copy()
    if na.dtype.kind == "f":
        na[np.isnan(na)], nb[np.isnan(nb)] = np.nan, np.nan
    assert na.tobytes() == nb.tobytes(), f"{what}: {a} != {b}"


def _run(obs, batches, compiled_backend):
    fwd = obs if compiled_backend is None else torch.compile(obs, backend=compiled_backend)
    for x in batches:
        out = fwd(x)
        assert torch.equal(out, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qp = obs.calculate_qparams()
        if compiled_backend is not None:
            qp_compiled = torch.compile(obs.calculate_qparams, backend=compiled_backend)()
            for a, b in zip(qp, qp_compiled):
                _assert_same_bits(a, b, "compiled calculate_qparams vs eager on the same state")
    return qp


def _params(backends):
    out = []
    for i, (name, kw, shape) in enumerate(CASES):
        for backend in backends:
            if backend == "inductor" and (name, i) not in INDUCTOR:
                continue
            out.append(pytest.param(name, kw, shape, backend, id=f"{name}-{i}-{backend}"))
    return out


@pytest.mark.parametrize("name,kw,shape,backend", _params(("eager", "inductor")))
def test_compiled_observer_matches_eager(name, kw, shape, backend):
    """Compiled forward over several batches, then calculate_qparams: the same state_dict and qparams
    bits as the eager observer fed the same batches."""
    torch._dynamo.reset()
    eager = getattr(tobs, name)(**kw)
    compiled = copy.deepcopy(eager)
    batches = _batches(shape)
    qp_eager = _run(eager, batches, None)
    qp_compiled = _run(compiled, batches, backend)
    for k, v in eager.state_dict().items():
        _assert_same_bits(v, compiled.state_dict()[k], f"state_dict[{k!r}]")
    for a, b in zip(qp_eager, qp_compiled):
        _assert_same_bits(a, b, "qparams")


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.relu = torch.nn.ReLU()
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).flatten(1))


class _Mlp(torch.nn.Module):
    """Linear layers only (inductor's CPU conv kernels give other bits than eager's, so the observers of
    ``_Net`` would see other activations under inductor)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(3 * 8 * 8, 16)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x.flatten(1))))


def _prepared(activation, weight, net):
    from torch.ao.quantization import QConfig, prepare

    torch.manual_seed(0)
    model = net().eval()
    model.qconfig = QConfig(activation=activation, weight=weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare(model)


QCONFIGS = {
    "minmax": (tobs.MinMaxObserver.with_args(reduce_range=True), tobs.default_per_channel_weight_observer),
    "histogram": (tobs.HistogramObserver.with_args(bins=128, reduce_range=True), tobs.default_weight_observer),
    "moving_average": (
        tobs.MovingAverageMinMaxObserver.with_args(averaging_constant=0.1),
        tobs.MovingAveragePerChannelMinMaxObserver.with_args(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric),
    ),
}


@pytest.mark.parametrize(
    "qconfig,backend",
    [("minmax", "eager"), ("histogram", "eager"), ("moving_average", "eager"),
     ("minmax", "inductor")],
)
def test_compiled_prepared_model_matches_eager(qconfig, backend):
    """``prepare`` with our observers in the QConfig; the compiled prepared model's observers end with
    the same qparams (and state) as the eager prepared model's on the same batches."""
    torch._dynamo.reset()
    net = _Mlp if backend == "inductor" else _Net
    eager = _prepared(*QCONFIGS[qconfig], net)
    compiled_model = _prepared(*QCONFIGS[qconfig], net)
    run = torch.compile(compiled_model, backend=backend)
    rng = np.random.default_rng(7)
    with torch.no_grad():
        for scale in (1.0, 2.0, 0.5):
            x = torch.from_numpy(rng.standard_normal((2, 3, 8, 8)).astype(np.float32) * scale)
            torch.testing.assert_close(run(x), eager(x), rtol=0, atol=0)
    observers = {n: m for n, m in eager.named_modules() if isinstance(m, torch.ao.quantization.ObserverBase)}
    assert len(observers) >= 2, observers  # module outputs (weights are observed at convert)
    others = dict(compiled_model.named_modules())
    for n, obs in observers.items():
        for k, v in obs.state_dict().items():
            _assert_same_bits(v, others[n].state_dict()[k], f"{n}.{k}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for a, b in zip(obs.calculate_qparams(), others[n].calculate_qparams()):
                _assert_same_bits(a, b, f"{n} qparams")
