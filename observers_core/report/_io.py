"""Loading tensors: ``.npy``, ``.npz``, ``.safetensors``, torch ``.pt``/``.pth`` (state dicts)."""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any

import numpy as np

SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth")


class ReportError(Exception):
    """A bad input, said in one line; ``code`` is the exit status (1: input, 2: usage)."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _matcher(select: str | None) -> Any:
    """``select`` as a glob (``*``, ``?``, ``[``) or else a regular expression searched in the name."""
    if select is None:
        return lambda name: True
    if any(c in select for c in "*?[") and not any(c in select for c in "^$()|+\\"):
        return lambda name: fnmatch.fnmatchcase(name, select)
    try:
        pattern = re.compile(select)
    except re.error as err:
        raise ReportError(f"--select {select!r} is neither a glob nor a valid regular expression: {err}", code=2) from None
    return lambda name: pattern.search(name) is not None


def _flatten(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    """Tensors of a (nested) state dict, named ``a.b.c``; other values are skipped."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif hasattr(obj, "detach") and hasattr(obj, "is_floating_point"):
        if obj.is_floating_point():
            out[prefix] = obj.detach().float().cpu().numpy()
    elif isinstance(obj, np.ndarray) and obj.dtype.kind == "f":
        out[prefix] = obj


def _read(path: str) -> dict[str, np.ndarray]:
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".npy":
        return {"": np.load(path, allow_pickle=False)}
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    if suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ReportError("reading .safetensors needs the safetensors package: pip install 'observers-core[report]'") from None
        try:
            return dict(load_file(path))
        except TypeError:  # bfloat16 has no numpy dtype: read through torch
            from safetensors.torch import load_file as load_torch

            out: dict[str, Any] = {}
            _flatten(load_torch(path), "", out)
            return out
    try:
        import torch
    except ImportError:
        raise ReportError(f"{path}: reading {suffix} files needs torch: pip install 'observers-core[torch]'") from None
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if hasattr(obj, "state_dict") and not isinstance(obj, dict):
        obj = obj.state_dict()
    out = {}
    _flatten(obj, "", out)
    return out


def load_tensors(files: list[str], *, select: str | None = None) -> dict[str, np.ndarray]:
    """``{"file:name": array}`` for the floating tensors of ``files`` whose name matches ``select``
    (a glob, or a regular expression searched in the tensor name). :class:`ReportError` for a missing
    file, an unknown suffix, an unreadable file or no tensor left."""
    match = _matcher(select)
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        if not os.path.isfile(path):
            raise ReportError(f"{path}: no such file")
        if os.path.splitext(path)[1].lower() not in SUFFIXES:
            raise ReportError(f"{path}: unknown format; valid: {', '.join(SUFFIXES)}")
        try:
            found = _read(path)
        except ReportError:
            raise
        except Exception as err:  # numpy, safetensors, torch and pickle each raise their own
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ReportError(f"{path}: cannot read it as {os.path.splitext(path)[1]}: {msg}") from None
        base = os.path.basename(path)
        for name, arr in found.items():
            arr = np.asarray(arr)
            if arr.dtype.kind not in "fiu":
                continue
            if match(name):
                tensors[f"{base}:{name}" if name else base] = arr
    if not tensors:
        what = f" matching --select {select!r}" if select is not None else ""
        raise ReportError(f"no numeric tensor{what} in {', '.join(files)}")
    return tensors
