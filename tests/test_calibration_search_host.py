"""The host fast paths of the calibration searches (issue 12: the KL and MSE searches run on every forward of
the calibration observers) against the array-API code, bit for bit: the strict KL curve by two compiled
kernels around one ``np.log`` (``_kl_strict_host``), the MSE search's inputs in one kernel (``_mse_host``),
the picks (``_pick_host``) and the histogram grid (``_grid_host``), on random and adversarial inputs (all
zeros, one non-zero bin, counts of 1e15, empty tails, 128 to 4096 bins, per channel, strides,
flatten_first_bin on and off, edges of every kind), compared with the NumPy array code (kernels off), with
array_api_strict, and with the new kernels missing (numba without them: the code as before)."""

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
        # every other case a channel at a time (the host path's chunks, as the array code's, bound memory)
        chunk = 1000 if case % 2 else 1 << 22
        monkeypatch.setattr(_calibration, "_CHUNK_ELEMENTS", chunk)
        key = (bins, kwargs.get("start_bin", kwargs["num_levels"]), kwargs["stride"], kwargs["num_levels"])
        width = _calibration._kl_ranges(*key)[0].size + bins + 2 * _calibration._kl_tables(*key)[0].size + 1
        calls.clear()
        array_path, fast, missing = _curves(h, edges, kwargs, monkeypatch)
        assert calls == [1] * -(-h.shape[0] // max(1, chunk // width)), case  # the fast path ran, once per chunk
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


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the array code's, on invalid counts)
@pytest.mark.parametrize("chunk", [1000, 1 << 22])
@pytest.mark.parametrize("bad", ["negative", "nan", "inf", "overflow"])
def test_kl_host_path_leaves_invalid_counts_to_the_array_code(bad, chunk, monkeypatch):
    """Negative or non-finite counts (``check=False``) and totals from 2**1000 take the array code, whose
    result they then are (NaN thresholds included), also where they are met in a later chunk of channels."""
    monkeypatch.setattr(_calibration, "_CHUNK_ELEMENTS", chunk)
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
    assert calls == [1, 1] * (chunk == 1000) and got[0] == got[2] and got[1] == got[3]
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
    sizes, phase, sums, run = np.empty(64, np.int64), np.empty(64, np.int64), np.empty((64, 1)), np.empty(40000)
    values = rng.standard_normal(5000) * 10.0 ** rng.integers(-8, 8, 5000)
    for n in [1, 7, 8, 9, 16, 127, 128, 129, 136, 200, 255, 256, 257, 1000, 2048, 4096, 40000]:
        index = rng.integers(0, values.size, n + 11)
        start = int(rng.integers(0, 11))
        expected = np.sum(values[index[start:start + n]])
        assert _compiled.pairwise_gather_sum(values, index, start, n, run, sizes, phase, sums) == expected, n


# ----------------------------------------------------------------------------------------------
# MSE: mse_prepare_kernel + mse_level_errors_kernel, and the picks (pick_kernel)
# ----------------------------------------------------------------------------------------------


def _mse_specs():
    from observers_core import quant_spec

    return [quant_spec("qint8", "per_tensor_symmetric"), quant_spec("quint8", "per_tensor_affine"),
            quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127),
            quant_spec("qint8", "per_channel_symmetric"), quant_spec("quint8", "per_channel_affine"),
            quant_spec("quint8", "per_channel_affine_float_qparams"), quant_spec("qint8", "per_tensor_affine"),
            quant_spec("quint4x2", "per_tensor_affine")]


def _mse_cases(rng: np.random.Generator):
    """``(case, hist, edges, kwargs)``: random histograms and the hard cases of counts and edges."""
    specs = _mse_specs()
    for case in range(64):
        bins = int(rng.choice([256, 512, 2048, 4096])) if case >= 6 else [512, 2048, 4096, 512, 300, 2048][case]
        channels = (1, 1, 2, 3)[case % 4]
        shape = (channels, bins)
        kind = case % 8
        if kind == 0:
            h = rng.poisson(rng.exponential(50, shape)).astype(np.float64)
        elif kind == 1:
            h = np.zeros(shape)
        elif kind == 2:
            h = np.zeros(shape)
            h[:, int(rng.choice([0, 1, bins // 2, bins - 1]))] = float(rng.integers(1, 10**6))
        elif kind == 3:
            h = np.floor(rng.exponential(1.0, shape) * 1e15 / (bins / 512))  # huge: prefix sums past 2**53
        elif kind == 4:
            h = rng.integers(0, 1000, shape).astype(np.float64)
            h[:, int(rng.integers(1, bins // 2)):] = 0.0  # empty tail
        elif kind == 5:
            h = rng.integers(0, 3, shape)  # an integer dtype
        elif kind == 6:
            h = np.floor(np.minimum(rng.pareto(1.5, shape), 1e3) * 10.0 ** int(rng.integers(0, 7)))
        else:
            h = (rng.random(shape) < 0.2) * rng.integers(0, 100, shape).astype(np.float64)
        edge_kind = case % 7
        top = float(rng.uniform(0.01, 100.0))
        if edge_kind == 0:
            edges = np.linspace(0.0, top, bins + 1)
        elif edge_kind == 1:
            edges = np.linspace(0.0, top, bins + 1).astype(np.float32)  # float32 edges (the observers')
        elif edge_kind == 2:
            edges = np.linspace(top, 2 * top, bins + 1)  # not starting at 0
        elif edge_kind == 3:
            edges = np.full(bins + 1, top)  # zero width
        elif edge_kind == 4:
            edges = np.linspace(-top, top, bins + 1)  # negative centers: scale 1 there
        elif edge_kind == 5:
            edges = np.linspace(0.0, 1e300, bins + 1) if case % 2 else np.linspace(0.0, 2.0**1023, bins + 1)
        else:
            edges = np.sort(rng.random((channels, bins + 1)) * top, axis=-1)  # per channel, uneven
        kwargs = dict(spec=specs[case % len(specs)], stride=int(rng.choice([1, 1, 2, 3, 5])))
        if case % 5 == 3:
            kwargs["start_bin"] = int(rng.integers(0, bins))
        yield case, h, edges, kwargs


def _float_sums_exact(h, kwargs) -> bool:
    """Whether the array code's float64 boundary sums (``Y0``, ``Y1 = sum (2m - 1) P0``, ``X1``) are exact, as the
    compiled level sums (int64) are: every partial sum below 2**53. Beyond, the two differ (as before the host
    path), and the host path is compared with the compiled level sums alone."""
    from observers_core._calibration import mse_window

    spec = kwargs["spec"]
    levels = spec.quant_max - mse_window(spec)[0] + 1
    h = np.asarray(h, dtype=np.float64)
    total = float(h.sum(axis=-1).max())
    moment = float((h * np.arange(h.shape[-1])).sum(axis=-1).max())
    return levels**2 * total < 2.0**52 and levels * moment < 2.0**52


def _mse_runs(h, edges, kwargs, monkeypatch):
    """``mse_errors`` and ``mse_threshold`` with the kernels off (the array code), on, and on with the new
    kernels missing (numba without them: the compiled level sums as before)."""
    from observers_core import mse_errors, mse_threshold

    out = []
    for enabled, missing in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(_compiled, "ENABLED", enabled)
        for name in ("mse_prepare_kernel", "pick_kernel"):
            monkeypatch.setattr(_calibration, name, None if missing else getattr(_compiled, name))
        curve = mse_errors(h, edges, **kwargs, xp=xp)
        out.append([np.asarray(curve.objective).tobytes(), np.asarray(curve.threshold).tobytes()] + [
            np.asarray(mse_threshold(h, edges, **kwargs, ties=ties, tie_tol=tol, xp=xp)).tobytes()
            for ties in ("first", "last") for tol in (None, 0.0, 1e-3)])
    monkeypatch.setattr(_compiled, "ENABLED", True)
    for name in ("mse_prepare_kernel", "pick_kernel"):
        monkeypatch.setattr(_calibration, name, getattr(_compiled, name))
    return out


def test_mse_host_search_is_bit_identical(monkeypatch):
    statuses = []
    kernel = _compiled.mse_prepare_kernel

    def spy(*args):
        statuses.append(kernel(*args))
        return statuses[-1]

    monkeypatch.setattr(_compiled, "mse_prepare_kernel", spy)
    rng = np.random.default_rng(16)
    ran = exact = 0
    for case, h, edges, kwargs in _mse_cases(rng):
        statuses.clear()
        array_path, fast, missing = _mse_runs(h, edges, kwargs, monkeypatch)
        assert fast == missing, (case, kwargs)
        if _float_sums_exact(h, kwargs):
            assert array_path == fast, (case, kwargs)
            exact += 1
        ran += statuses[:1] == [0]
    assert ran >= 50 and exact >= 40  # the host path ran for (nearly) every case


def test_mse_host_search_equals_array_api_strict():
    xps = pytest.importorskip("array_api_strict")
    from observers_core import mse_errors, mse_threshold

    rng = np.random.default_rng(17)
    for case, h, edges, kwargs in _mse_cases(rng):
        if case % 3 or not _float_sums_exact(h, kwargs):
            continue
        hs, es = xps.asarray(np.asarray(h, dtype=np.float64)), xps.asarray(edges)
        assert np.asarray(mse_errors(hs, es, **kwargs).objective).tobytes() == np.asarray(
            mse_errors(h.astype(np.float64), edges, **kwargs, xp=xp).objective).tobytes(), case
        assert np.asarray(mse_threshold(hs, es, **kwargs)).tobytes() == np.asarray(
            mse_threshold(h.astype(np.float64), edges, **kwargs, xp=xp)).tobytes(), case


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the array code's, on invalid edges)
@pytest.mark.parametrize("bad", ["fraction", "nan_edge", "tiny_edges", "beyond_2_62", "one_level"])
def test_mse_host_path_leaves_the_rest_to_the_array_code(bad, monkeypatch):
    """Non-integer counts, edges not finite, ``max |edges|`` subnormal, prefix sums from 2**62 and a single
    level take the array code, whose results they then are."""
    from observers_core import mse_threshold, quant_spec

    calls = []
    kernel = _compiled.mse_prepare_kernel
    monkeypatch.setattr(_compiled, "mse_prepare_kernel", lambda *a: calls.append(kernel(*a)) or calls[-1])
    h = np.arange(512.0)[None].repeat(2, 0)
    edges = np.linspace(0.0, 1.0, 513)
    kwargs = dict(spec=quant_spec("qint8", "per_tensor_symmetric"))
    if bad == "fraction":
        h[1, 7] = 0.5
    elif bad == "nan_edge":
        edges[100] = np.nan
    elif bad == "tiny_edges":
        edges = edges * 1e-310
    elif bad == "beyond_2_62":
        h[0, 3] = 2.0**62
    else:
        kwargs["spec"] = quant_spec("qint8", "per_tensor_symmetric", quant_min=-1, quant_max=0)  # levels [0, 0]
    array_path, fast, missing = _mse_runs(h, edges, dict(kwargs, check=False), monkeypatch)
    assert array_path == fast == missing
    assert 0 not in calls and (bad == "one_level" or calls)
    mse_threshold(np.arange(512.0), np.linspace(0.0, 1.0, 513), spec=quant_spec("qint8", "per_tensor_symmetric"),
                  xp=xp)
    assert calls[-1] == 0  # a valid histogram takes it


def test_pick_kernel_is_pick(monkeypatch):
    """The compiled pick against ``_pick`` on curves with ties, infinities and NaN."""
    monkeypatch.setattr(_compiled, "ENABLED", True)  # (also under OBSERVERS_CORE_NO_NUMBA=1)
    rng = np.random.default_rng(18)
    for case in range(300):
        k = int(rng.integers(1, 40))
        obj = np.round(rng.random((3, k)) * 4) / 4 + rng.choice([0.0, 1e-13, 1e-9], (3, k))
        if case % 5 == 1:
            obj[0, :] = np.inf
        if case % 5 == 2:
            obj[1, int(rng.integers(k))] = np.nan
        if case % 5 == 3:
            obj[2, int(rng.integers(k))] = np.inf
        tol = float(rng.choice([0.0, 2.0**-40, 0.3]))
        slack = rng.choice([0.0, 1e-10, 0.25], 3)
        for ties in ("first", "last"):
            expected = _calibration._pick(obj, lambda _: tol, ties, xp)
            assert np.array_equal(_calibration._pick_host(obj, tol, None, ties, xp), expected), case
            expected = _calibration._pick(obj, lambda m: tol * m + slack[:, None], ties, xp)
            assert np.array_equal(_calibration._pick_host(obj, tol, slack, ties, xp), expected), case


# ----------------------------------------------------------------------------------------------
# The calibration histogram's grid (grid_kernel), run by every update of the KL and MSE observers
# ----------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the array code's, on infinite bounds)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grid_host_is_bit_identical(dtype, monkeypatch):
    """``_grid`` by the kernel against the array code on ranges and width bounds of every kind: random
    magnitudes, powers of two, zeros of both signs, subnormals, values at the dtype's limits, infinities
    and NaN (empty ranges, infinite widths; a NaN bound raises in both, from the exponent table)."""
    rng = np.random.default_rng(19 + (dtype == np.float64))
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, -1e-45, 2.0**127, 2.0**-126,
                5e-39, 1e308, -1e308, 2.0**1023, 5e-324, 2.0**-1022]
    for case in range(3000):
        n = int(rng.integers(1, 6))

        def values():
            kind = rng.integers(4)
            if kind == 0:
                return np.asarray(rng.choice(specials, n))
            if kind == 1:
                return rng.standard_normal(n) * 10.0 ** rng.integers(-45, 39, n)
            if kind == 2:
                return np.exp2(rng.integers(-150, 150, n).astype(np.float64)) * rng.choice([1.0, -1.0], n)
            return rng.standard_normal(n) * 10.0 ** rng.integers(-320, 308, n)

        with np.errstate(all="ignore"):
            low, high = values().astype(dtype), values().astype(dtype)
            if case % 2:
                low = np.minimum(low, high)
            min_width = np.where(rng.random(n) < 0.5, 0.0, np.abs(values())).astype(dtype)
            if case % 3 == 0:  # widths as the states hold them: powers of two
                min_width = np.exp2(np.floor(np.log2(np.where(min_width > 0, min_width, 1.0)))).astype(dtype)
        bins = int(rng.choice([2, 3, 7, 64, 512, 2048]))
        got = []
        for enabled in (False, True):
            monkeypatch.setattr(_compiled, "ENABLED", enabled)
            try:
                lo, width = _calibration._grid(low, high, min_width, bins, xp)
                got.append((lo.dtype, lo.tobytes(), width.tobytes()))
            except IndexError:  # a NaN bound: the exponent table lookup fails in the array code
                got.append("IndexError")
        assert got[0] == got[1], (case, low, high, min_width, bins)
    monkeypatch.setattr(_compiled, "ENABLED", True)
    monkeypatch.setattr(_calibration, "grid_kernel", None)  # numba without the kernel: the array code
    lo, width = _calibration._grid(np.asarray([0.0, 1.0], dtype), np.asarray([3.0, 0.5], dtype),
                                   np.zeros(2, dtype), 512, xp)
    assert lo.tolist() == [0.0, 0.0] and width.tolist() == [2.0**-7, 0.0]
