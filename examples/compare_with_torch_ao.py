"""Calibrate a tiny conv net with torch.ao's observers and with observers_core's drop-in torch
observers side by side, and print every observer's qparams from both with a match column.

Runs on CPU in a few seconds: ``python examples/compare_with_torch_ao.py``. Exits with status 1 if any
scale or zero point differs (bit for bit), 0 otherwise.
"""

from __future__ import annotations

import copy
import sys
import warnings

import torch
from torch import nn
from torch.ao import quantization as tq
from torch.ao.quantization import observer as torch_observers

from observers_core.adapters import torch as our_observers


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 7 * 7, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.conv2(self.relu(self.conv1(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


def qconfig(observers):
    """The same recipe from either module: moving-average activations, per-channel symmetric weights."""
    return tq.QConfig(
        activation=observers.MovingAverageMinMaxObserver.with_args(averaging_constant=0.1, reduce_range=True),
        weight=observers.default_per_channel_weight_observer,
    )


def calibrated_observers(model, observers, batches):
    """{name: (scale, zero_point)} of every activation observer after calibration, plus the weight
    observers of each layer run on its weight (what ``convert`` does)."""
    model = copy.deepcopy(model)
    model.qconfig = qconfig(observers)
    prepared = tq.prepare(model)
    with torch.no_grad():
        for x in batches:
            prepared(x)
    result = {}
    for name, module in prepared.named_modules():
        if hasattr(module, "activation_post_process"):
            result[f"{name or 'model'} (activation)"] = module.activation_post_process.calculate_qparams()
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            weight_observer = module.qconfig.weight()
            weight_observer(module.weight)
            result[f"{name} (weight)"] = weight_observer.calculate_qparams()
    return result


def _short(t: torch.Tensor) -> str:
    values = t.flatten().tolist()
    text = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values[:3])
    return f"[{text}{', ...' if len(values) > 3 else ''}] ({len(values)})"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def main() -> int:
    torch.manual_seed(0)
    model = TinyNet().eval()
    model = tq.fuse_modules(model, [["conv1", "relu"]])
    generator = torch.Generator().manual_seed(1234)
    batches = [torch.randn(8, 3, 16, 16, generator=generator) * (0.5 + i) for i in range(6)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reduce_range deprecation
        theirs = calibrated_observers(model, torch_observers, batches)
        ours = calibrated_observers(model, our_observers, batches)

    mismatches = 0
    print(f"{'observer':22s} {'qparam':10s} {'torch.ao':46s} {'observers_core':46s} match")
    for name in theirs:
        for label, expected, actual in zip(("scale", "zero_point"), theirs[name], ours[name]):
            same = _same(expected, actual)
            mismatches += not same
            print(f"{name:22s} {label:10s} {_short(expected):46s} {_short(actual):46s} {'yes' if same else 'NO'}")
    print(f"\n{len(theirs)} observers, {mismatches} mismatching qparams")
    return 1 if mismatches or theirs.keys() != ours.keys() else 0


if __name__ == "__main__":
    sys.exit(main())
