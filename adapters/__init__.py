"""Stateful observers built on the pure core, one module per framework.

Installed as ``observers_core.adapters``; import ``observers_core.adapters.torch``, ``.jax`` or ``.cupy``.
Nothing here imports a framework until its module is imported.
"""
