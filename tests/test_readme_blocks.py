"""Every Python block of README.md runs (issue 10). Names a block leaves to the reader (``model``,
``batches``, ``x``...) come from small fixtures in the block's framework; blocks that need CuPy/CUDA skip
where there is none."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _fixtures(block: str) -> dict:
    """The reader's objects, in the framework the block imports (JAX, else torch, else NumPy)."""
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(3)]
    names: dict = {}
    if "import jax" in block or "adapters.jax" in block:
        jnp = pytest.importorskip("jax.numpy")
        names["batches"] = [jnp.asarray(b) for b in host]
        names["xs"] = jnp.stack(names["batches"])
    elif "torch" in block:
        torch = pytest.importorskip("torch")
        names["batches"] = [torch.from_numpy(b) for b in host]
    else:
        names["batches"] = host
    if "torch" in block:
        torch = pytest.importorskip("torch")
        names["x"] = torch.from_numpy(host[0])
    else:  # the CuPy blocks copy host arrays to the GPU themselves: cp.asarray(x), cp.asarray(weight)
        names["x"] = host[0]
    names["weight"] = host[1]
    if "model" in block or "linear" in block:
        torch = pytest.importorskip("torch")
        names["model"] = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
        names["calibration_batches"] = [torch.randn(2, 3, 16, 16) for _ in range(3)]
        names["linear"] = torch.nn.Linear(256, 64)
    return names


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{i}:{b.splitlines()[0][:40]}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(index):
    block = BLOCKS[index]
    if "cupy" in block or "cp." in block:
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception:  # noqa: BLE001 - any failure means: no usable CUDA device here
            pytest.skip("cupy or a CUDA device is not available here")
    if "cuda_graph_forward" in block:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA device here")
    namespace = _fixtures(block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, f"README.md block {index}", "exec"), namespace)
