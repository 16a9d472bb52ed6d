"""The calibration observers' state on a recorded sequence of batches (issue 12): recorded before the
speed work, so any change to the per-batch path that moves a single bit fails here.

``tests/data/calibration_recorded.json`` holds, for each case, the ``min_val``/``max_val`` state, the
qparams and (KL) the accumulated histogram, as float hex strings. Regenerate it only on purpose, with
``OBSERVERS_CORE_RECORD=1 python -m pytest tests/test_calibration_recorded.py`` (the test then fails
once, saying so). The batches: normal and heavy-tailed data, zeros, a dead channel, NaN/+-Inf, float16,
integers and one huge-range batch, per tensor and per channel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from observers_core import _compiled
from observers_core.adapters import _array_calibration as calib

RECORD = Path(__file__).parent / "data" / "calibration_recorded.json"
CLASSES = {
    "kl": (calib.KLObserver, dict(update_interval=2, bins=512)),
    "mse": (calib.MSEObserver, dict(bins=512, stride=3)),
    "percentile": (calib.PercentileObserver, dict(bins=1024, percentile=99.9)),
    "mix": (calib.MixObserver, dict(bins=512)),
}
GRANULARITY = {"tensor": dict(ch_axis=-1), "channel": dict(ch_axis=1, qscheme="per_channel_symmetric")}


def recorded_batches() -> list[np.ndarray]:
    rng = np.random.default_rng(20261124)
    shape = (4, 6, 33)
    out = [rng.standard_normal(shape).astype(np.float32)]
    out.append((rng.standard_t(2, shape) * 3).astype(np.float32))  # heavy tails
    b = rng.standard_normal(shape).astype(np.float32)
    b[:, 2] = 0.0  # a dead channel
    b[0, 0, :5] = [np.nan, np.inf, -np.inf, np.nan, 1e-40]
    out.append(b)
    out.append(rng.standard_normal(shape).astype(np.float16))
    out.append(rng.integers(-50, 200, shape).astype(np.int32))
    huge = rng.standard_normal(shape).astype(np.float32)
    huge[1, 1, 1] = 3e38
    out.append(huge)
    out.append(np.zeros(shape, np.float32))
    out.append(np.exp(rng.standard_normal(shape) * 4).astype(np.float32))  # positive, wide
    return out


def _hex(a) -> list[str]:
    return [float(v).hex() for v in np.asarray(a, dtype=np.float64).reshape(-1)]


def _run(backend: str, method: str, granularity: str) -> dict:
    cls, kwargs = CLASSES[method]
    batches = recorded_batches()
    if backend == "torch":
        torch = pytest.importorskip("torch")
        from observers_core.adapters import torch as tobs

        obs = getattr(tobs, cls.__name__)(**kwargs, **GRANULARITY[granularity])
        batches = [torch.from_numpy(b) for b in batches]
    else:
        obs = cls(**kwargs, **GRANULARITY[granularity])
    states = []
    for x in batches:
        obs(x)
        states.append(_hex(obs.min_val) + _hex(obs.max_val))
    scale, zero_point = obs.calculate_qparams()
    record = {"states": states, "scale": _hex(scale), "zero_point": np.asarray(zero_point).reshape(-1).tolist()}
    if method == "kl":
        hist = obs.accumulator.hist
        record["kl_counts"] = np.asarray(hist.counts).reshape(-1).astype(np.int64).tolist()
        record["kl_grid"] = _hex(hist.lo) + _hex(hist.width)
    if method == "mix":
        record["choice"] = np.asarray(obs.last_choice).reshape(-1).tolist()
    return record


CASES = [(m, g) for m in sorted(CLASSES) for g in sorted(GRANULARITY)]


@pytest.mark.parametrize("compiled", [False, True], ids=["array_api", "compiled"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("method,granularity", CASES)
def test_state_equals_the_recording(method, granularity, backend, compiled, monkeypatch):
    if compiled and not _compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    monkeypatch.setattr(_compiled, "ENABLED", compiled)
    got = _run(backend, method, granularity)
    key = f"{method}/{granularity}"
    if os.environ.get("OBSERVERS_CORE_RECORD") == "1" and backend == "numpy" and not compiled:
        data = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        data[key] = got
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps(data, indent=0, sort_keys=True))
        pytest.fail(f"recorded {key}: set OBSERVERS_CORE_RECORD=0 and run again")
    want = json.loads(RECORD.read_text())[key]
    assert got == want
