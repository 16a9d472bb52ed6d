"""The host fast paths of the calibration searches (issue 12: the KL and MSE searches run on every forward of
the calibration observers) against the array-API code, bit for bit: the strict KL curve by two compiled
kernels around one ``np.log`` (``_kl_strict_host``), on random and adversarial histograms (all zeros, one
non-zero bin, counts of 1e15, empty tails, 512 to 4096 bins, per channel, strides, flatten_first_bin on and
off), compared with the NumPy array code (kernels off), with array_api_strict, and with the kernels missing
(numba not installed)."""

from __future__ import annotations

import numpy as np
import pytest

import array_api_compat.numpy as xp
from observers_core import _calibration, _compiled, kl_divergences, kl_threshold

pytestmark = pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed")


def _kl_cases(rng: np.random.Generator):
    """``(hist, kwargs)`` pairs: random histograms and the hard cases, per tensor and per channel."""
    for case in range(72):
        bins = int(rng.choice([128, 300, 512, 512, 2048, 4096])) if case >= 8 else [512, 2048, 4096, 512, 256, 512,
                                                                                  2048, 512][case]
        channels = (1, 1, 2, 3)[case % 4]
        kind = case % 12
        shape = (channels, bins)
        if kind == 0:
            h = rng.poisson(rng.exponential(50, shape)).astype(np.float64)
        elif kind == 1:
            h = np.zeros(shape)  # all zeros: every candidate +inf
        elif kind == 2:  # a single non-zero bin, at the start, in the middle or at the end
            h = np.zeros(shape)
            h[:, int(rng.choice([0, 1, 2, bins // 3, bins - 1]))] = float(rng.integers(1, 10**6))
        elif kind == 3:
            h = np.floor(rng.exponential(1.0, shape) * 1e15)  # huge counts: sums beyond 2**53 round
        elif kind == 4:  # data in the first bins, empty tail
            h = rng.integers(0, 1000, shape).astype(np.float64)
            h[:, int(rng.integers(1, bins // 2)):] = 0.0
        elif kind == 5:
            h = (rng.random(shape) < 0.3) * rng.integers(0, 1000, shape).astype(np.float64)  # sparse
        elif kind == 6:
            h = np.histogram(np.abs(rng.standard_t(2, 50000)), bins=bins)[0][None].repeat(channels, 0).astype(float)
        elif kind == 7:
            h = rng.random(shape) * 10.0 ** rng.integers(-3, 8)  # non-integer counts (weights)
        elif kind == 8:
            h = rng.integers(0, 5, shape).astype(np.int64)  # integer dtype, mostly tiny counts
        elif kind == 9:  # counts only beyond the first candidate, and one at the very end
            h = np.zeros(shape)
            h[:, bins // 2:] = rng.integers(0, 3, (channels, bins - bins // 2))
            h[:, -1] = 7.0
        elif kind == 10:  # a spike in bin 0 (ReLU zeros) over a smooth body
            h = np.floor(np.exp(-np.arange(bins) / (bins / 8.0)) * 1e6)[None].repeat(channels, 0)
            h[:, 0] = 1e9
        else:
            h = np.floor(rng.pareto(1.2, shape) * 100)
        levels = int(rng.choice([16, 128, 128, 256]))
        levels = min(levels, bins)
        kwargs = dict(num_levels=levels, stride=int(rng.choice([1, 1, 2, 3, 7])),
                      flatten_first_bin=bool(case % 3 != 2))
        if case % 5 == 4:
            kwargs["start_bin"] = int(rng.integers(1, bins + 1))
        yield case, h, kwargs


def _curves(h, edges, kwargs, monkeypatch):
    """The KL curve with the kernels off (the array code), on, and on with the KL kernels missing."""
    out = []
    for enabled, kernel in ((False, _compiled.kl_curve_kernel), (True, _compiled.kl_curve_kernel), (True, None)):
        monkeypatch.setattr(_compiled, "ENABLED", enabled)
        monkeypatch.setattr(_calibration, "kl_curve_kernel", kernel)
        out.append(np.asarray(kl_divergences(h, edges, **kwargs, xp=xp).objective))
    monkeypatch.setattr(_calibration, "kl_curve_kernel", _compiled.kl_curve_kernel)
    monkeypatch.setattr(_compiled, "ENABLED", True)
    return out


def test_kl_host_curve_is_bit_identical(monkeypatch):
    calls = []
    kernel = _compiled.kl_curve_kernel

    def spy(*args):
        calls.append(1)
        return kernel(*args)

    monkeypatch.setattr(_compiled, "kl_curve_kernel", spy)  # (what _curves puts back into _calibration)
    rng = np.random.default_rng(12)
    for case, h, kwargs in _kl_cases(rng):
        bins = h.shape[-1]
        edges = np.linspace(0.0, float(rng.uniform(0.1, 50.0)), bins + 1)
        calls.clear()
        array_path, fast, missing = _curves(h, edges, kwargs, monkeypatch)
        assert calls == [1], case  # the fast path ran (once: the other two runs are the array code)
        assert array_path.tobytes() == fast.tobytes() == missing.tobytes(), (case, kwargs)
        for ties in ("first", "last"):
            picks = []
            for enabled in (False, True):
                monkeypatch.setattr(_compiled, "ENABLED", enabled)
                picks.append(np.asarray(kl_threshold(h, edges, ties=ties, **kwargs, xp=xp)).tobytes())
            assert picks[0] == picks[1], (case, ties)


def test_kl_host_curve_equals_array_api_strict(monkeypatch):
    """array_api_strict (NumPy underneath, none of the host paths) gives the same bits."""
    xps = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(13)
    for case, h, kwargs in _kl_cases(rng):
        if case % 3:
            continue
        edges = np.linspace(0.0, 4.0, h.shape[-1] + 1)
        strict = kl_divergences(xps.asarray(h.astype(np.float64)), xps.asarray(edges), **kwargs)
        fast = kl_divergences(h, edges, **kwargs, xp=xp)
        assert np.asarray(strict.objective).tobytes() == np.asarray(fast.objective).tobytes(), case


@pytest.mark.parametrize("bad", ["negative", "nan", "inf", "overflow"])
def test_kl_host_path_leaves_invalid_counts_to_the_array_code(bad, monkeypatch):
    """Negative or non-finite counts (``check=False``) and totals from 2**1000 take the array code, whose
    result they then are (NaN thresholds included)."""
    calls = []
    kernel = _compiled.kl_curve_kernel
    monkeypatch.setattr(_calibration, "kl_curve_kernel", lambda *a: calls.append(1) or kernel(*a))
    h = np.arange(512.0)[None].repeat(2, 0)
    h[1, 300] = {"negative": -3.0, "nan": np.nan, "inf": np.inf, "overflow": 1e305}[bad]
    edges = np.linspace(0.0, 1.0, 513)
    got = []
    for enabled in (False, True):
        monkeypatch.setattr(_compiled, "ENABLED", enabled)
        got.append(np.asarray(kl_divergences(h, edges, check=False, xp=xp).objective).tobytes())
        got.append(np.asarray(kl_threshold(h, edges, check=False, xp=xp)).tobytes())
    assert calls == [] and got[0] == got[2] and got[1] == got[3]
    calls.clear()
    assert np.asarray(kl_divergences(h[:1], edges, check=False, xp=xp).objective).shape == (1, 385)
    assert calls == [1]  # the valid row alone takes the kernels


def test_kl_host_path_torch_cpu(monkeypatch):
    """torch CPU tensors keep the torch array code (the adapters run them as NumPy views); NumPy views of
    them take the host path and give the NumPy array code's bits."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(14)
    h = rng.poisson(30.0, (2, 512)).astype(np.float64)
    edges = np.linspace(0.0, 3.0, 513)
    t = torch.as_tensor(h)
    got = _curves(t.numpy(), edges, dict(num_levels=128), monkeypatch)
    assert got[0].tobytes() == got[1].tobytes()
    assert np.asarray(kl_divergences(t, torch.as_tensor(edges), num_levels=128).objective).shape == got[1].shape


def test_pairwise_gather_sum_is_numpys():
    rng = np.random.default_rng(15)
    sizes, phase, sums = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64)
    values = rng.standard_normal(5000) * 10.0 ** rng.integers(-8, 8, 5000)
    for n in [1, 7, 8, 9, 16, 127, 128, 129, 136, 200, 255, 256, 257, 1000, 2048, 4096, 40000]:
        index = rng.integers(0, values.size, n + 11)
        start = int(rng.integers(0, 11))
        expected = np.sum(values[index[start:start + n]])
        assert _compiled.pairwise_gather_sum(values, index, start, n, sizes, phase, sums) == expected, n
