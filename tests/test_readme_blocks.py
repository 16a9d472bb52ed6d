"""Every Python block of README.md and docs/*.md runs, as written, in a fresh namespace.

Blocks are self-contained: they make their own data. A block whose first line is ``# needs: cupy`` or
``# needs: torch-cuda`` is skipped, with that reason, where CuPy with a GPU or torch CUDA is missing;
nothing else is skipped."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS = ("cupy", "torch-cuda")


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


BLOCKS = [(path.relative_to(ROOT).as_posix(), i, block)
          for path in DOCS for i, block in enumerate(python_blocks(path.read_text()))]


def needs(block: str) -> str | None:
    """``cupy`` or ``torch-cuda`` from a first line ``# needs: ...``; None without one."""
    first = block.splitlines()[0].strip() if block.strip() else ""
    match = re.fullmatch(r"# needs: (\S+)", first)
    if match is None:
        return None
    if match.group(1) not in NEEDS:
        raise ValueError(f"unknown requirement {match.group(1)!r}: one of {NEEDS}")
    return match.group(1)


def missing(requirement: str) -> str | None:
    """Why ``requirement`` is not met here, or None when it is."""
    if requirement == "cupy":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return None
        except Exception:  # noqa: BLE001 - no CuPy, no driver or no device: not runnable here
            pass
        return "needs cupy with a CUDA device"
    import torch

    return None if torch.cuda.is_available() else "needs torch with a CUDA device"


def test_the_guides_have_blocks_and_the_markers_are_known():
    per_file = {path.relative_to(ROOT).as_posix(): 0 for path in DOCS}
    for name, _, block in BLOCKS:
        per_file[name] += 1
        needs(block)  # raises for an unknown marker
    assert len(BLOCKS) >= 15, per_file
    assert per_file["README.md"] >= 5, per_file


@pytest.mark.parametrize(("name", "index", "block"), BLOCKS,
                         ids=[f"{name}:{index}" for name, index, _ in BLOCKS])
def test_block_runs(name, index, block):
    requirement = needs(block)
    if requirement is not None:
        reason = missing(requirement)
        if reason is not None:
            pytest.skip(reason)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, f"{name} block {index}", "exec"), {"__name__": "__readme_block__"})
