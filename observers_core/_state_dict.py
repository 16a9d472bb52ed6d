"""State-dict entries: what every adapter's ``load_state_dict`` checks before it changes anything.

An entry may be an array of any framework (NumPy, CuPy, JAX, torch, array_api_strict); each check reads it
on the host as NumPy and raises ``TypeError``/``ValueError`` naming the entry and what is allowed. Shared
by the array observers and the torch modules, so every backend accepts and refuses the same state dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._validate import check_eps

__all__ = ["EXTENSION_FLOATS", "host_array", "check_entry", "check_eps_entry", "check_keys", "check_minmax_entries",
           "check_scalar_entry"]

#: NumPy extension float dtypes (ml_dtypes) that the array-API namespaces do not know; cast to float32.
EXTENSION_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def host_array(value: Any, name: str) -> np.ndarray:
    """A state-dict entry (numpy, cupy, jax, torch CPU, array_api_strict...) as a numpy array."""
    if hasattr(value, "get") and type(value).__module__.startswith("cupy"):
        return value.get()
    if hasattr(value, "detach"):  # a torch tensor from a torch.ao observer's state_dict
        value = value.detach().cpu()
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return np.from_dlpack(value)
    except (TypeError, ValueError, RuntimeError, AttributeError, BufferError) as err:
        raise TypeError(f"state_dict[{name!r}] must be an array, got {type(value).__name__}") from err


def check_entry(value: Any, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    """``value`` as a numpy array of its own real dtype (ml_dtypes floats as float32), after checking the
    dtype and (if given) the shape."""
    arr = host_array(value, name)
    if arr.dtype.name in EXTENSION_FLOATS:
        arr = arr.astype(np.float32)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"state_dict[{name!r}] must hold real numbers, got dtype {arr.dtype}")
    if shape is not None and arr.shape != shape:
        raise ValueError(f"state_dict[{name!r}] must have shape {shape}, got {arr.shape}")
    return arr


def check_eps_entry(value: Any) -> float:
    """The ``eps`` entry (shape ``(1,)``) as a float: a positive float32 normal (:func:`check_eps`)."""
    return check_eps(float(check_entry(value, "eps", (1,)).astype(np.float32)[0]), "state_dict['eps']")


def check_scalar_entry(value: Any, name: str) -> np.ndarray:
    """A per-tensor entry as a 0-d numpy array (:func:`check_entry`): shape ``()``, or ``(1,)`` read as its
    one value (``nn.Module``'s loader turns a one-element 1-d entry into a 0-d buffer, so torch's
    observers load it)."""
    arr = check_entry(value, name, None)
    if arr.shape not in ((), (1,)):
        raise ValueError(f"state_dict[{name!r}] must have shape () (or (1,)), got {arr.shape}")
    return arr.reshape(())


def check_keys(state_dict: Any, expected: tuple[str, ...], owner: str) -> None:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise ValueError(
            f"state_dict for {owner} must have exactly the keys {list(expected)}; "
            f"missing: {missing}, unexpected: {unexpected}"
        )


def check_minmax_entries(
    eps: Any, min_val: Any, max_val: Any, *, per_channel: bool, owner: str, disordered_ok: bool = False,
    finite: bool = False,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The min/max observers' state-dict entries (arrays of any framework), checked and as
    ``(eps, min_val, max_val)`` (float, float32 numpy arrays): shapes ``(1,)`` for ``eps``, ``()`` per
    tensor or equal ``(C,)`` per channel (``C = 0``: never updated); real dtypes; ``eps`` a positive
    float32 normal; each ``min_val <= max_val`` unless NaN or never updated (``+inf``/``-inf``), or
    ``disordered_ok``: torch's moving average ``x + c (t - x)`` reaches ``min_val > max_val`` itself
    (overflow, cancellation), so the moving-average observers load such states as they save them.
    ``finite``: each entry finite or never updated, as the calibration observers' averaged range always
    is (a one-sided infinity or NaN would make every later average NaN).
    Per tensor a one-element ``(1,)`` entry is its 0-d value, as ``nn.Module``'s loader takes it.
    Shared by every adapter's ``load_state_dict``, so all accept and refuse the same."""
    eps_val = check_eps_entry(eps)
    if per_channel:
        lo, hi = check_entry(min_val, "min_val", None), check_entry(max_val, "max_val", None)
    else:
        lo, hi = check_scalar_entry(min_val, "min_val"), check_scalar_entry(max_val, "max_val")
    if per_channel and (lo.ndim != 1 or lo.shape != hi.shape):
        raise ValueError(
            f"state_dict['min_val'] and ['max_val'] must both have shape (C,) for {owner}, got {lo.shape} and {hi.shape}"
        )
    lo32, hi32 = lo.astype(np.float32), hi.astype(np.float32)
    with np.errstate(invalid="ignore"):
        never = (lo32 == np.inf) & (hi32 == -np.inf)
        bad = (lo32 > hi32) & ~never
    if np.any(bad) and not disordered_ok:
        raise ValueError(
            f"state_dict has min_val > max_val at {np.argwhere(bad).ravel().tolist() or '()'}: "
            f"{lo32[bad].tolist()} > {hi32[bad].tolist()}"
        )
    unbounded = ~(np.isfinite(lo32) & np.isfinite(hi32)) & ~never
    if finite and np.any(unbounded):
        raise ValueError(
            f"state_dict has a min_val/max_val that is not finite at {np.argwhere(unbounded).ravel().tolist() or '()'}: "
            f"{lo32[unbounded].tolist()}, {hi32[unbounded].tolist()}; {owner}'s averaged range is finite (or +inf/-inf "
            "before any value)"
        )
    return eps_val, lo32, hi32
