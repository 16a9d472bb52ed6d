"""The compiled host kernels of the calibration path (issue 12) against the array-API code they replace,
on many random and adversarial inputs: calibration-histogram updates, the finite range of
``aminmax(ignore_nonfinite=True)`` and the MSE search give the same bits; Mix's candidate errors (whose
float64 sums run in another order) agree to 1e-12 relative and pick the same candidate."""

from __future__ import annotations

import numpy as np
import pytest

import array_api_compat.numpy as xp
from observers_core import _compiled, aminmax, calib_histogram_init, calib_histogram_update, mse_threshold, quant_spec
from observers_core import calib_histogram_edges
from observers_core.families import calibration as calib

pytestmark = pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed")


def _both(fn, monkeypatch):
    """``fn()`` with the compiled kernels off, then on."""
    out = []
    for enabled in (False, True):
        monkeypatch.setattr(_compiled, "ENABLED", enabled)
        out.append(fn())
    return out


def adversarial(rng: np.random.Generator, dtype, shape=None) -> np.ndarray:
    """A random batch mixing the hard cases: wide magnitudes, zeros of both signs, subnormals, NaN/Inf,
    values near the dtype's maximum, all-equal and all-non-finite batches."""
    shape = tuple(rng.integers(1, 9, size=rng.integers(1, 4))) if shape is None else shape
    kind = rng.integers(8)
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30)
    if kind == 1:
        x = np.full(shape, rng.choice([0.0, -0.0, 1.5, -3e38]))
    elif kind == 2:
        x = np.where(rng.random(shape) < 0.5, np.nan, x)
    elif kind == 3:
        x = np.full(shape, rng.choice([np.nan, np.inf, -np.inf]))
    elif kind == 4:
        x = rng.standard_normal(shape) * 1e-42
    elif kind == 5:
        x = np.where(rng.random(shape) < 0.3, rng.choice([np.inf, -np.inf, -0.0, 3.4e38, -3.4e38]), x)
    elif kind == 6:
        x = np.exp(rng.standard_normal(shape) * 20)
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("absolute", [False, True])
def test_calib_histogram_update_is_bit_identical(dtype, absolute, monkeypatch):
    rng = np.random.default_rng(7 + absolute)
    for case in range(150):
        channels = int(rng.integers(1, 5))
        axis = 1 if case % 2 else None  # per channel: batches (n, C, m) with one C
        batches = [adversarial(rng, dtype, None if axis is None else (int(rng.integers(1, 6)), channels,
                                                                     int(rng.integers(1, 6)))) for _ in range(3)]

        def run():
            state = calib_histogram_init(bins=64, num_channels=batches[0].shape[1] if axis else None,
                                         dtype=xp.float64 if dtype == np.float64 else xp.float32, xp=xp)
            for b in batches:
                state = calib_histogram_update(state, b, axis=axis, absolute=absolute, xp=xp)
            return [np.asarray(a).tobytes() for a in state]

        array_path, compiled = _both(run, monkeypatch)
        assert array_path == compiled, (case, batches)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_range_is_bit_identical(dtype, monkeypatch):
    rng = np.random.default_rng(11)
    for case in range(200):
        x = adversarial(rng, dtype)
        axis = int(rng.integers(x.ndim)) if case % 2 else None
        if axis is not None and x.ndim == 1:
            continue
        array_path, compiled = _both(lambda: [np.asarray(a).tobytes() for a in aminmax(x, axis=axis, ignore_nonfinite=True, xp=xp)], monkeypatch)
        assert array_path == compiled, (case, x, axis)


def test_mse_search_is_bit_identical(monkeypatch):
    rng = np.random.default_rng(3)
    specs = [quant_spec("qint8", "per_tensor_symmetric"), quant_spec("quint8", "per_tensor_affine"),
             quant_spec("qint8", "per_channel_symmetric", quant_min=-127, quant_max=127)]
    for case in range(60):
        x = rng.standard_t(2 + case % 5, (4, 200)).astype(np.float32) * 10.0 ** rng.integers(-20, 20)
        spec = specs[case % 3]
        axis = 0 if spec.qscheme.is_per_channel else None
        state = calib_histogram_update(
            calib_histogram_init(bins=512, num_channels=4 if axis == 0 else None, xp=xp), x, axis=axis, absolute=True, xp=xp)
        edges = calib_histogram_edges(state, xp=xp)
        stride = 1 + case % 4
        array_path, compiled = _both(
            lambda: np.asarray(mse_threshold(state.counts, edges, spec=spec, stride=stride, xp=xp)).tobytes(), monkeypatch)
        assert array_path == compiled, case


def test_mix_candidate_errors_agree_and_pick_the_same(monkeypatch):
    rng = np.random.default_rng(5)
    config, _ = calib.make_config("t", "mix", dtype="qint8", qscheme="per_tensor_symmetric", quant_min=None,
                                  quant_max=None, ch_axis=-1, averaging_constant=0.01, bins=512)
    checked = 0
    for case in range(100):
        x = adversarial(rng, np.float32)
        hist = calib.abs_histogram(x, axis=None, bins=512, xp=xp)
        lo, hi = calib.observed_range(x, axis=None, xp=xp)
        if not bool(lo <= hi):
            continue
        ranges = [calib.clip_range(lo, hi, calib.search_amax(m, hist, config, xp), xp) for m in calib.MIX_CANDIDATES]
        lo_k, hi_k = (xp.stack([r[i] for r in ranges], axis=-1) for i in (0, 1))
        array_path, compiled = _both(
            lambda: np.asarray(calib.candidate_errors(x, lo_k, hi_k, axis=None, spec=config.spec, xp=xp)), monkeypatch)
        np.testing.assert_allclose(compiled, array_path, rtol=1e-12, atol=0)
        best = np.sort(array_path)
        if best.size < 2 or best[1] - best[0] > 1e-9 * best[1] or best[1] == best[0]:
            assert np.argmin(compiled) == np.argmin(array_path), (case, array_path, compiled)
        checked += 1
    assert checked > 50
