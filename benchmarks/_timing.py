"""Tiny timing helpers shared by the benchmarks.

- :func:`machine_line`: the machine and library versions, printed first by every benchmark
  (framework versions are read from the installed metadata, so nothing gets imported).
- :func:`time_interleaved`: warm-up, then repeats that alternate between the candidates (load drifts on
  a shared machine hit all of them alike), each repeat timing ``number`` calls; medians per call.
- :func:`run_isolated`: a function of a benchmark file run in a fresh Python process, so that torch,
  JAX and numpy never share a process (their thread pools fight over the cores) and each starts cold.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

__all__ = ["Timing", "machine_line", "time_interleaved", "run_isolated"]

_RESULT_MARKER = "@@isolated-result@@"


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and minimum over the repeats, and how many repeats."""

    median: float
    min: float
    repeats: int


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_line(*packages: str) -> str:
    """One line: OS, CPU model, visible cores, Python and the versions of ``packages``."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = ", ".join(f"{p} {_version(p)}" for p in packages)
    return (f"machine: {platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores visible; "
            f"python {platform.python_version()}" + (f", {versions}" if versions else ""))


def time_interleaved(
    candidates: dict[str, Callable[[], Any]],
    *,
    number: int = 1,
    repeats: int = 15,
    warmup: int = 2,
    sync: Callable[[], Any] | None = None,
) -> dict[str, Timing]:
    """Per-call :class:`Timing` of each candidate: ``warmup`` untimed repeats, then ``repeats`` rounds;
    in each round every candidate runs ``number`` times back to back (then ``sync()``, e.g.
    ``torch.cuda.synchronize`` or a JAX ``block_until_ready``), candidates alternating."""
    sync = sync or (lambda: None)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for round_ in range(warmup + repeats):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            elapsed = (time.perf_counter() - t0) / number
            if round_ >= warmup:
                samples[name].append(elapsed)
    return {name: Timing(statistics.median(s), min(s), len(s)) for name, s in samples.items()}


_WORKER = f"""
import json, os, runpy, sys
path, func, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
result = runpy.run_path(path, run_name="__isolated__")[func](**kwargs)
sys.stdout.write("\\n{_RESULT_MARKER}" + json.dumps(result) + "\\n")
"""


def run_isolated(path: str, func: str, /, *, env: dict[str, str] | None = None, timeout: float = 900,
                 **kwargs: Any) -> Any:
    """``func(**kwargs)`` from the Python file ``path`` in a fresh interpreter; returns its result
    (JSON-serialisable). ``path``'s module runs with ``__name__ == "__isolated__"``, so its
    ``if __name__ == "__main__"`` block is skipped. ``env`` adds environment variables."""
    proc = subprocess.run(
        [sys.executable, "-c", _WORKER, path, func, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{func} in a fresh process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARKER):
            return json.loads(line[len(_RESULT_MARKER):])
    raise RuntimeError(f"{func} in a fresh process returned no result:\n{proc.stdout[-3000:]}")
