"""JAX with ``jax_enable_x64`` on (common in scientific code): every JAX observer class gives the NumPy
observer's states and qparams bit for bit, dtypes included, on float32 and float64 batches, and loads
NumPy's state dict. x64 is fixed when JAX starts, so the checks run in a fresh interpreter
(``JAX_ENABLE_X64=1``: this file run as a script), which prints one line ``RESULTS {json}``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

pytestmark = pytest.mark.slow  # a JAX interpreter with x64 in a subprocess

KWARGS = {
    "PerChannelMinMaxObserver": {"ch_axis": 1}, "MovingAveragePerChannelMinMaxObserver": {"ch_axis": 1},
    "FixedQParamsObserver": {"scale": 0.1, "zero_point": 0}, "HistogramObserver": {"bins": 256},
    "LowBitObserver": {"dtype": "int4", "granularity": "per_channel", "axis": 0},
    "PerGroupMinMaxObserver": {"group_size": 4}, "PerBlockMXObserver": {"block_size": 8, "dtype": "mxfp4"},
}
NO_QPARAMS = ("PlaceholderObserver", "NoopObserver")


def _differences() -> dict[str, list[str]]:
    """class name -> what differs from NumPy's observer (empty: nothing)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers
    from observers_core.adapters import jax as jax_observers

    assert jax.config.jax_enable_x64
    modules = (_array_observers, _array_histogram, _array_calibration, _array_lowbit)
    rng = np.random.default_rng(0)
    out = {}
    for name in (n for m in modules for n in m.__all__ if "Base" not in n):
        numpy_class = getattr(next(m for m in modules if hasattr(m, name)), name)
        problems = []
        for dtype in (np.float32, np.float64):
            ours, ref = getattr(jax_observers, name)(**KWARGS.get(name, {})), numpy_class(**KWARGS.get(name, {}))
            for scale in (1.0, 3.0, 0.2):
                x = (rng.standard_normal((4, 16)) * scale).astype(dtype)
                ours(jnp.asarray(x))
                ref(x)
            pairs = [(f"state_dict[{k!r}]", v, ref.state_dict()[k]) for k, v in ours.state_dict().items()]
            if name not in NO_QPARAMS:
                pairs += [(f"qparams[{i}]", u, v) for i, (u, v) in enumerate(zip(ours.calculate_qparams(),
                                                                              ref.calculate_qparams()))]
            for what, got, want in pairs:
                got, want = np.asarray(got), np.asarray(want)
                if got.dtype != want.dtype or not np.array_equal(got, want, equal_nan=True):
                    problems.append(f"{dtype.__name__} {what}: {got!r} != {want!r}")
            ours.load_state_dict(ref.state_dict())
            ours(jnp.asarray(x))
        out[name] = problems
    return out


def test_jax_observers_with_x64_equal_numpys():
    pytest.importorskip("jax")
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=600, env=env,
                          cwd=os.path.dirname(__file__))  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and len(lines) == 1, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    results = json.loads(lines[0][len("RESULTS "):])
    assert len(results) >= 15
    assert not any(results.values()), {k: v for k, v in results.items() if v}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    print("RESULTS " + json.dumps(_differences()), flush=True)
