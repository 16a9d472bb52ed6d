"""A type checker sees every public observer class as itself (issue 37): each is a plain class statement in
the module that exports it (no class made at import time, no ``__module__`` rewriting), so mypy resolves
``observers_core.adapters.torch.MinMaxObserver`` to that class, not ``Any``.

mypy reads the source tree (``adapters/`` laid out as ``observers_core.adapters``, as the install maps it)
and skips the frameworks' own sources (torch, JAX, NumPy...): a few seconds of work."""

from __future__ import annotations

import importlib
import os
import pathlib
import re

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = pathlib.Path(__file__).resolve().parent.parent
FACADES = ["torch", "jax", "cupy", "horizon", "quark"]
#: third-party packages mypy does not read (their classes are ``Any`` bases: ours stay themselves)
SKIPPED = ["torch", "torchao", "jax", "jaxlib", "numpy", "cupy", "cupyx", "array_api_compat", "array_api_strict",
           "scipy", "numba", "ml_dtypes", "triton", "quark", "transformers", "rich", "safetensors", "sklearn",
           "matplotlib", "modelopt", "llmcompressor", "compressed_tensors"]  # fmt: skip


def _public_classes(facade: str) -> dict[str, str]:
    """``{name in the facade: the class's own path}`` for the classes of a facade's ``__all__`` that this
    project defines (``default_*`` aliases of a class left out); none where its framework is missing."""
    try:
        module = importlib.import_module(f"observers_core.adapters.{facade}")
    except ImportError:
        return {}
    classes = {name: getattr(module, name) for name in module.__all__}
    return {name: f"{cls.__module__}.{cls.__qualname__}" for name, cls in classes.items()
            if isinstance(cls, type) and cls.__module__.startswith("observers_core") and cls.__name__ == name}


def _source_layout(tmp: pathlib.Path) -> pathlib.Path:
    """A folder holding ``observers_core`` as installed: the core's files and ``adapters/`` as its subpackage
    (symlinks into the source tree)."""
    package = tmp / "src" / "observers_core"
    package.mkdir(parents=True)
    for entry in (ROOT / "observers_core").iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, package / entry.name)
    os.symlink(ROOT / "adapters", package / "adapters")
    return tmp / "src"


def test_mypy_reveals_each_public_observer_class_as_itself(tmp_path, monkeypatch):
    classes = {facade: _public_classes(facade) for facade in FACADES}
    assert len(classes["torch"]) > 20 and len(classes["jax"]) > 15, classes
    lines = [f"import observers_core.adapters.{facade}" for facade, names in classes.items() if names]
    expected = {}
    for facade, names in classes.items():
        for name, path in names.items():
            lines.append(f"reveal_type(observers_core.adapters.{facade}.{name})")
            expected[len(lines)] = path
    snippet = tmp_path / "snippet.py"
    snippet.write_text("\n".join(lines) + "\n")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = True\n\n"
                      f"[mypy-{','.join(m + '.*' for m in SKIPPED)}]\nfollow_imports = skip\n")
    monkeypatch.setenv("MYPYPATH", str(_source_layout(tmp_path)))
    stdout, stderr, _ = mypy_api.run([str(snippet), "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
                                      "--no-error-summary"])
    revealed = {int(n): t for n, t in re.findall(r"snippet\.py:(\d+): note: Revealed type is \"(.*)\"", stdout)}
    wrong = [f"{lines[n - 1]}: {revealed.get(n)}" for n, path in expected.items()
             if not revealed.get(n, "").endswith(f"-> {path}")]
    assert not wrong, "\n".join(wrong) + "\n" + stdout + stderr
