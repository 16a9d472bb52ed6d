"""Every module of the package imports first, in a fresh interpreter (no import cycles), and no package
module imports another's private name (``from x import _name``): what adapters need is public."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"observers_core": ROOT / "observers_core", "observers_core.adapters": ROOT / "adapters"}
#: Modules that need an optional framework this machine may lack: skipped (with the reason) when absent.
NEEDS = {"cupy": "cupy", "jax": "jax", "torch": "torch", "horizon": "torch", "quark": "torch"}


def _modules() -> list[str]:
    names = []
    for package, path in PACKAGES.items():
        names.append(package)
        for info in pkgutil.walk_packages([str(path)], prefix=package + "."):
            if package == "observers_core" and info.name.startswith("observers_core.adapters"):
                continue
            names.append(info.name)
    return sorted(set(names))


def _missing_framework(module: str) -> str | None:
    for word, framework in NEEDS.items():
        if word in module.rsplit(".", 1)[-1] and importlib.util.find_spec(framework) is None:
            return framework
    return None


@pytest.mark.slow  # one fresh interpreter per module
def test_every_module_imports_first_in_a_fresh_interpreter():
    modules = [m for m in _modules() if _missing_framework(m) is None]
    assert len(modules) > 20, modules  # the walk found the package

    def first_import(module: str) -> tuple[str, int, str]:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
        return module, done.returncode, done.stderr.strip().splitlines()[-1:] if done.returncode else ""

    with ThreadPoolExecutor(2) as pool:
        failures = [r for r in pool.map(first_import, modules) if r[1] != 0]
    assert not failures, failures


def _package_files() -> list[Path]:
    return sorted(p for path in PACKAGES.values() for p in path.rglob("*.py"))


def _is_submodule(path: Path, node: ast.ImportFrom, name: str) -> bool:
    """Whether ``from <node.module> import <name>`` names a module (a file or package), not a name in one."""
    if node.level:
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        parts = (node.module or "").split(".") if node.module else []
    else:
        top, *parts = node.module.split(".")
        if top != "observers_core":
            return False
        base = ROOT / "observers_core"
        if parts[:1] == ["adapters"]:
            base, parts = ROOT / "adapters", parts[1:]
    target = base.joinpath(*parts, name)
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


def test_no_private_name_crosses_a_module_boundary():
    offenders = []
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    dunder = alias.name.startswith("__") and alias.name.endswith("__")
                    if alias.name.startswith("_") and not dunder and not _is_submodule(path, node, alias.name):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {alias.name}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("facade", ["torch", "jax", "cupy"])
def test_public_classes_name_their_facade(facade):
    """``repr``, pickles and docs name ``observers_core.adapters.<framework>``, not the private file."""
    if importlib.util.find_spec(facade) is None:
        pytest.skip(f"{facade} is not installed")
    module = importlib.import_module(f"observers_core.adapters.{facade}")
    classes = [getattr(module, name) for name in module.__all__ if isinstance(getattr(module, name), type)]
    ours = [c for c in classes if c.__module__.startswith("observers_core")]
    assert len(ours) > 5, ours
    wrong = [f"{c.__qualname__}: {c.__module__}" for c in ours if c.__module__ != module.__name__]
    assert not wrong, wrong


def test_the_report_imports_no_private_adapter_module():
    """The report calls the public API (the core and ``observers_core.families``), never an adapter's
    private module (it built ``_array_calibration`` observers before)."""
    offenders = []
    for path in sorted((ROOT / "observers_core" / "report").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [f"{path.name}:{node.lineno}: {n}" for n in names
                          if n.startswith("observers_core.adapters") and any(p.startswith("_") for p in n.split(".")[2:])]
    assert not offenders, offenders
