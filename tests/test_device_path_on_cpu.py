"""The branch-free device path (what a torch observer runs on CUDA: every branch computed with ``where``,
no host shortcut, no compiled kernel) run on CPU tensors must give the host path's state bit for bit.

CUDA runs this path in the GPU tests only; this test covers it on every machine. The host shortcuts are
switched off by patching the two predicates that choose them (``on_host`` in the core modules and
``_compiled.ENABLED``); the sequences exercise what the branch-free logic decides: the first batch, a
single-valued state moved onto a wider range (the point mass), growing and unchanged ranges, +/-inf,
NaN, integer and float16 batches, and ranges near float32's limit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import observers_core._compiled as compiled  # noqa: E402
import observers_core._histogram as core_histogram  # noqa: E402
import observers_core._minmax as core_minmax  # noqa: E402
from observers_core.adapters import torch as tobs  # noqa: E402

from _torch_observer_configs import CONFIGS, config_id  # noqa: E402


def sequences() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape, scale=1.0: torch.randn(*shape, generator=g) * scale  # noqa: E731
    return {
        "growing": [randn(8, 64, scale=s) for s in (1.0, 3.0, 0.5, 10.0)],
        "point_then_wider": [torch.full((8, 64), 0.75), torch.full((8, 64), 0.75), randn(8, 64)],
        "point_then_one_other_value": [torch.full((8, 64), -2.0), torch.full((8, 64), 5.0), randn(8, 64)],
        "nonfinite": [randn(8, 64), torch.tensor([[float("inf"), -float("inf"), 1.0, 0.5] * 16] * 8), randn(8, 64)],
        "nan": [randn(8, 64), torch.tensor([[float("nan"), 2.0] * 32] * 8), randn(8, 64)],
        "huge": [randn(8, 64, scale=1e37), randn(8, 64, scale=3e38).clamp(-3.4e38, 3.4e38), randn(8, 64)],
        "int_and_half": [torch.randint(-50, 50, (8, 64), generator=g), randn(8, 64, scale=20).half()],
    }


def device_path(monkeypatch) -> None:
    monkeypatch.setattr(compiled, "ENABLED", False)
    monkeypatch.setattr(core_histogram, "on_host", lambda x, xp: False)
    monkeypatch.setattr(core_minmax, "on_host", lambda x, xp: False)


def run(name: str, kwargs: dict, batches: list) -> dict[str, np.ndarray]:
    obs = getattr(tobs, name)(**kwargs)
    for x in batches:
        obs(x)
    return {key: value.detach().numpy().copy() for key, value in obs.state_dict().items()}


@pytest.mark.parametrize("sequence", list(sequences()))
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_device_path_equals_host_path(config, sequence, monkeypatch):
    name, kwargs = config
    kwargs = dict(kwargs, ignore_nonfinite=sequence != "nan") if "ignore_nonfinite" in kwargs else kwargs
    batches = sequences()[sequence]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = run(name, kwargs, batches)
        device_path(monkeypatch)
        device = run(name, kwargs, batches)
    assert host.keys() == device.keys()
    for key in host:
        np.testing.assert_array_equal(device[key], host[key], err_msg=f"{config_id(config)} {sequence}: {key}")
