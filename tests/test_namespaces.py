"""``xp=`` takes a framework module or its array-API namespace alike, and empty inputs give the same
error on every backend (issue 11, item 12)."""

from __future__ import annotations

import numpy as np
import pytest

import observers_core as oc
from conftest import to_numpy

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")

RAW = {"numpy": np, "torch": torch, "jax": jnp}
INITS = {
    "minmax_init": lambda xp: oc.minmax_init(num_channels=3, xp=xp),
    "histogram_init": lambda xp: oc.histogram_init(bins=8, xp=xp),
    "calib_histogram_init": lambda xp: oc.calib_histogram_init(bins=8, num_channels=2, xp=xp),
}


@pytest.mark.parametrize("init", list(INITS))
@pytest.mark.parametrize("framework", list(RAW))
def test_raw_modules_are_namespaces(init, framework, request):
    import array_api_compat

    module = RAW[framework]
    state = INITS[init](module)
    canonical = array_api_compat.array_namespace(module.asarray(0.0))
    for a, b in zip(state, INITS[init](canonical)):
        assert array_api_compat.array_namespace(a) is canonical  # the framework's own arrays
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    # and the state feeds the core's updates like any other
    if init == "minmax_init":
        updated = oc.minmax_update(state, module.asarray(np.ones((4, 3), np.float32)), axis=1)
        assert to_numpy(updated.max_val).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", ["numpy", 3, object()])
def test_a_non_namespace_is_refused_naming_xp(bad):
    with pytest.raises(TypeError, match="xp="):
        oc.minmax_init(xp=bad)


@pytest.mark.parametrize("framework", list(RAW))
def test_empty_input_errors_alike(framework):
    empty = RAW[framework].zeros((0, 3))
    with pytest.raises(ValueError, match="must not be empty"):
        oc.aminmax(empty)
    with pytest.raises(ValueError, match="must not be empty"):
        oc.aminmax(empty, axis=1)
    state = oc.minmax_init(xp=RAW[framework])
    assert oc.minmax_update(state, empty) is state  # updates skip empty batches, as documented


UPDATES = {
    "minmax_update": (lambda xp: oc.minmax_init(xp=xp), lambda s, x: oc.minmax_update(s, x)),
    "moving_average_update": (lambda xp: oc.minmax_init(xp=xp),
                              lambda s, x: oc.moving_average_update(s, x, averaging_constant=0.1)),
    "histogram_update": (lambda xp: oc.histogram_init(bins=8, xp=xp), lambda s, x: oc.histogram_update(s, x)),
    "calib_histogram_update": (lambda xp: oc.calib_histogram_init(bins=8, xp=xp),
                               lambda s, x: oc.calib_histogram_update(s, x)),
}


@pytest.mark.parametrize("name", list(UPDATES))
def test_input_on_another_device_than_the_state_is_a_value_error(name):
    """A torch state on the CPU and ``x`` on another device (``meta`` stands in for CUDA here; the GPU run
    covers CUDA): ``ValueError`` naming ``x`` and both devices, not torch's mixed-device error."""
    init, update = UPDATES[name]
    state = init(torch)
    with pytest.raises(ValueError, match=r"x is on meta but the state is on cpu"):
        update(state, torch.empty(4, 3, device="meta"))
    update(state, torch.ones(4, 3))  # the same state still takes CPU input
