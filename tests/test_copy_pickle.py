"""Every observer class deep-copies and pickles on every CPU backend, and the copy continues identically
(issue 11, item 3: the NumPy / array_api_strict / JAX observers held their namespace module, which
neither ``copy.deepcopy`` nor ``pickle`` can take)."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

from conftest import to_numpy

# (class name, constructor kwargs, input shape)
CLASSES = [
    ("MinMaxObserver", {}, (4, 8)),
    ("MovingAverageMinMaxObserver", {}, (4, 8)),
    ("PerChannelMinMaxObserver", {}, (4, 8)),
    ("MovingAveragePerChannelMinMaxObserver", {}, (4, 8)),
    ("HistogramObserver", {"bins": 64}, (4, 8)),
    ("KLObserver", {}, (4, 8)),
    ("MSEObserver", {}, (4, 8)),
    ("PercentileObserver", {}, (4, 8)),
    ("MixObserver", {}, (4, 8)),
    ("PerGroupMinMaxObserver", {"dtype": "int4", "group_size": 4}, (4, 8)),
    ("FP8Observer", {"dtype": "float8_e4m3fn"}, (4, 8)),
    ("PerBlockMXObserver", {"dtype": "mxfp8_e4m3", "block_size": 8}, (4, 8)),
    ("PerBlockBFPObserver", {"dtype": "bfp16", "block_size": 8}, (4, 8)),
]


def _module(backend: str, name: str):
    if backend == "torch":
        pytest.importorskip("torch")
        from observers_core.adapters import torch as mod

        return mod, None
    if backend == "jax":
        pytest.importorskip("jax")
        from observers_core.adapters import jax as mod

        return mod, None
    from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers

    for mod in (_array_observers, _array_histogram, _array_calibration, _array_lowbit):
        if hasattr(mod, name):
            if backend == "array_api_strict":
                import array_api_strict

                return mod, array_api_strict
            return mod, None
    raise AssertionError(name)


def _asarray(backend: str, a: np.ndarray, xp):
    if backend == "torch":
        import torch

        return torch.from_numpy(a)
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.asarray(a)
    return a if xp is None else xp.asarray(a)


def _state(obs) -> dict:
    return {k: to_numpy(v) for k, v in obs.state_dict().items()}


def _qparams(obs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [to_numpy(v) for v in obs.calculate_qparams()]


@pytest.mark.slow_on("jax")  # every class compiles under jit
@pytest.mark.parametrize("backend", ["numpy", "array_api_strict", "torch", "jax"])
@pytest.mark.parametrize("name,kwargs,shape", CLASSES, ids=[c[0] for c in CLASSES])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_continue_identically(backend, name, kwargs, shape, how):
    mod, xp = _module(backend, name)
    kw = dict(kwargs)
    if xp is not None:
        kw["xp"] = xp
    try:
        obs = getattr(mod, name)(**kw)
    except TypeError as err:  # array_api_strict: classes that take no xp
        pytest.skip(f"{name} on {backend}: {err}")
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal(shape).astype(np.float32) * s for s in (1.0, 3.0, 0.5)]
    obs(_asarray(backend, batches[0], xp))
    obs(_asarray(backend, batches[1], xp))
    twin = copy.deepcopy(obs) if how == "deepcopy" else pickle.loads(pickle.dumps(obs))
    assert type(twin) is type(obs)
    for a, b in zip(_state(obs).values(), _state(twin).values()):
        np.testing.assert_array_equal(a, b)
    obs(_asarray(backend, batches[2], xp))
    twin(_asarray(backend, batches[2], xp))
    for a, b in zip(_state(obs).values(), _state(twin).values()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_qparams(obs), _qparams(twin)):
        np.testing.assert_array_equal(a, b)
