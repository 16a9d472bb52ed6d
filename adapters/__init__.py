"""Stateful observers built on the pure core, one module per framework.

Installed as ``observers_core.adapters``; import ``observers_core.adapters.torch``, ``.jax`` or ``.cupy``.
Nothing here imports a framework until its module is imported.
"""


def adopt_public_names(namespace: dict) -> None:
    """Give every class listed in a facade's ``__all__`` the facade as its ``__module__``.

    The classes live in private per-family files (``_torch_minmax.py``, ...); their repr, pickles and
    docs should name the public import path (``observers_core.adapters.torch.MinMaxObserver``), which
    also keeps old pickles loadable when a class moves between private files.
    """
    for name in namespace["__all__"]:
        obj = namespace[name]
        if isinstance(obj, type) and obj.__module__.startswith(__name__ + "._"):
            obj.__module__ = namespace["__name__"]
