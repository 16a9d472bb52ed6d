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


def test_device_constant_copies_each_table_once_per_device():
    """Off the CPU (``meta`` stands in for a GPU) a table is copied once and the copy reused; another
    table object, or another dtype, gets its own copy; on the CPU nothing is cached."""
    import array_api_compat.torch as txp

    from observers_core._namespace import device_constant

    table = np.arange(5, dtype=np.int64)
    first = device_constant(table, txp, torch.device("meta"))
    assert first.device.type == "meta" and device_constant(table, txp, torch.device("meta")) is first
    assert device_constant(table.copy(), txp, torch.device("meta")) is not first
    assert device_constant(table, txp, torch.device("meta"), dtype=torch.float32).dtype == torch.float32
    assert device_constant(table, txp, torch.device("cpu")) is not device_constant(table, txp, torch.device("cpu"))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_clamp_is_max_then_min_with_nan_kept(framework):
    import array_api_compat

    from observers_core._namespace import clamp

    xp = array_api_compat.array_namespace(RAW[framework].asarray(0.0))
    x = RAW[framework].asarray(np.array([-0.0, -3.0, 0.5, 9.0, np.nan], np.float32))
    got = to_numpy(clamp(x, 0.0, 2.0, xp))
    np.testing.assert_array_equal(got, np.array([0.0, 0.0, 0.5, 2.0, np.nan], np.float32))
    np.testing.assert_array_equal(to_numpy(clamp(x, None, 0.25, xp))[1:4], [-3.0, 0.25, 0.25])


@pytest.mark.parametrize("length", [1, 2, 7, 2051, 65539, 4096 * 2048 + 3])
def test_histc_bincount_equals_bincount(length):
    """The GPU counting (torch.histc of i + 0.5, run here on the CPU) counts exactly what torch.bincount
    does, indices at and beyond ``length`` dropped, for lengths up to the per-channel calibration
    histogram's (4096 channels x 2048 bins)."""
    torch = pytest.importorskip("torch")
    from observers_core._namespace import histc_bincount

    g = torch.Generator().manual_seed(length)
    index = torch.randint(0, length + 3, (50_000,), generator=g)
    index[:3] = torch.tensor([0, length - 1, length])  # both ends and the first index beyond
    expected = torch.bincount(index, minlength=length + 3)[:length]
    counts = histc_bincount(index, length)
    assert counts.dtype == torch.int64
    assert torch.equal(counts, expected)


def test_the_mse_search_reuses_one_candidate_table():
    """device_constant copies a table to a GPU once per table object: the MSE search's candidate table is
    one cached object per (start_bin, bins, stride), so its copy is made once (a fresh table per call
    was a host synchronisation in every CUDA forward; tests/test_gpu_sync.py)."""
    from observers_core._calibration import _mse_candidates

    table = _mse_candidates(128, 2048, 4)
    assert _mse_candidates(128, 2048, 4) is table
    np.testing.assert_array_equal(table, np.arange(128, 2048, 4))
