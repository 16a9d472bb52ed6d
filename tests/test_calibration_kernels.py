"""The compiled host kernels of the calibration path (issue 12) against the array-API code they replace,
on many random and adversarial inputs: calibration-histogram updates, the finite range of
``aminmax(ignore_nonfinite=True)``, the KL and MSE searches and Mix's candidate errors (float64 sums in
NumPy's pairwise order) give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

import array_api_compat.numpy as xp
from observers_core import _compiled, aminmax, calib_histogram_init, calib_histogram_update, mse_threshold, quant_spec
from observers_core import calib_histogram_edges, kl_divergences
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


@pytest.mark.parametrize("bins", [256, 2048])
def test_mse_error_curves_are_bit_identical(bins, monkeypatch):
    """The compiled level sums and error terms give the array code's curves and bounds bit for bit (integer
    counts up to ~1e9 per bin, the boundary sums below 2**53 where the array code's float64 sums are exact;
    ``S2 = sum h j**2``, summed by the array code for both, reaches 2**53), empty and one-bin histograms,
    per tensor and per channel, symmetric and affine."""
    from observers_core import _calibration, mse_errors

    rng = np.random.default_rng(30 + bins)
    specs = [quant_spec("qint8", "per_tensor_symmetric"), quant_spec("quint8", "per_tensor_affine"),
             quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)]
    for case in range(24):
        channels = 1 + case % 3
        scale = 10.0 ** int(rng.integers(0, 7))
        h = np.floor(np.minimum(rng.pareto(1.5, (channels, bins)), 1e3) * scale)
        if case % 8 == 5:
            h[:] = 0.0
        elif case % 8 == 6:
            h[:] = 0.0
            h[:, int(rng.integers(bins))] = scale
        edges = np.linspace(0.0, float(rng.uniform(0.01, 100.0)), bins + 1)
        spec = specs[case % 3]
        norm = _calibration.error_norm(edges[None, :], xp)
        scales = np.asarray(rng.uniform(1e-3, 1.0, (channels, 7)) * edges[-1] / 64)
        levels = spec.quant_max - _calibration.mse_window(spec)[0] + 1
        array_path, compiled = _both(lambda: [np.asarray(a) for a in _calibration._squared_error_by_levels(
            h, np.broadcast_to(edges, (channels, bins + 1)), scales, levels, np.broadcast_to(norm, (channels,)), xp)],
            monkeypatch)
        for general, fast in zip(array_path, compiled):  # the errors, then their bounds
            np.testing.assert_array_equal(general, fast)
        curves = _both(lambda: np.asarray(mse_errors(h, edges, spec=spec, xp=xp).objective), monkeypatch)
        np.testing.assert_array_equal(curves[0], curves[1])
        thresholds = _both(lambda: np.asarray(mse_threshold(h, edges, spec=spec, xp=xp)), monkeypatch)
        np.testing.assert_array_equal(thresholds[0], thresholds[1])


def test_pairwise_sum_is_numpys():
    rng = np.random.default_rng(2)
    for n in [0, 1, 7, 8, 9, 127, 128, 129, 136, 255, 256, 1000, 100003, 1 << 20]:
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
        assert _compiled.pairwise_sum_kernel(x) == np.sum(x), n
        blocks = _compiled.pairwise_blocks(n)
        assert blocks[:, 1].sum() == n and (blocks[1:, 0] == np.cumsum(blocks[:, 1])[:-1]).all()


def test_kl_search_is_bit_identical(monkeypatch):
    rng = np.random.default_rng(4)
    for case in range(40):
        bins = int(rng.choice([128, 300, 512, 2048]))
        channels = int(rng.integers(1, 4))
        if case % 3 == 0:
            hist = rng.poisson(rng.exponential(50, (channels, bins)))
        elif case % 3 == 1:
            hist = (rng.random((channels, bins)) < 0.3) * rng.integers(0, 1000, (channels, bins))
        else:
            hist = np.histogram(np.abs(rng.standard_t(2, 50000)), bins=bins)[0][None].repeat(channels, 0)
        edges = np.linspace(0.0, 5.0, bins + 1)
        kwargs = dict(num_levels=int(rng.choice([16, 128])), stride=int(rng.integers(1, 4)))
        array_path, compiled = _both(
            lambda: np.asarray(kl_divergences(hist, edges, **kwargs).objective).tobytes(), monkeypatch)
        assert array_path == compiled, case


@pytest.mark.parametrize("per_channel", [False, True])
def test_mix_candidate_errors_are_bit_identical(per_channel, monkeypatch):
    rng = np.random.default_rng(5 + per_channel)
    qscheme = "per_channel_symmetric" if per_channel else "per_tensor_symmetric"
    config, _ = calib.make_config("t", "mix", dtype="qint8", qscheme=qscheme, quant_min=None, quant_max=None,
                                  ch_axis=1 if per_channel else -1, averaging_constant=0.01, bins=512)
    axis = 1 if per_channel else None
    checked = 0
    for case in range(100):
        shape = (int(rng.integers(1, 40)), 3, int(rng.integers(1, 3000))) if per_channel else (
            (int(rng.integers(1, 100000)),) if case % 2 else None)
        x = adversarial(rng, np.float32, shape)
        hist = calib.abs_histogram(x, axis=axis, bins=512, xp=xp)
        lo, hi = calib.observed_range(x, axis=axis, xp=xp)
        ranges = [calib.clip_range(lo, hi, calib.search_amax(m, hist, config, xp), xp) for m in calib.MIX_CANDIDATES]
        lo_k, hi_k = (xp.stack([r[i] for r in ranges], axis=-1) for i in (0, 1))
        for amax in (None, xp.maximum(-lo, hi)):  # the norm's magnitude computed, or given as mix_range does
            array_path, compiled = _both(lambda: np.asarray(calib.candidate_errors(
                x, lo_k, hi_k, axis=axis, spec=config.spec, xp=xp, amax=amax)).tobytes(), monkeypatch)
            assert array_path == compiled, (case, x)
        checked += 1
    assert checked == 100


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("per_channel", [False, True])
def test_candidate_errors_repeated_candidates_are_bit_identical(dtype, per_channel, monkeypatch):
    """The compiled sums take candidates two at a time (an odd last one with itself) and compute
    candidates with the same scale and zero point in every row once: any number of candidates, repeated
    ones (whole columns, or in some rows only), affine, symmetric and float qparams (float zero points, added
    before rounding), float32 and float64 rows."""
    rng = np.random.default_rng(11 + per_channel)
    axis = 1 if per_channel else None
    kinds = ["symmetric", "affine", "affine_float_qparams"] if per_channel else ["symmetric", "affine"]
    for case in range(60):
        kind = kinds[case % len(kinds)]
        qscheme = ("per_channel_" if per_channel else "per_tensor_") + kind
        spec = quant_spec("qint8" if kind == "symmetric" else "quint8", qscheme)
        shape = (int(rng.integers(1, 6)), 3, int(rng.integers(1, 400))) if per_channel else (
            (int(rng.integers(1, 3000)),))
        x = adversarial(rng, dtype, shape)
        lo, hi = calib.observed_range(x, axis=axis, xp=xp)
        amax = np.abs(rng.standard_normal((rng.integers(1, 4),) + lo.shape)).astype(np.float32)
        amax[0] = np.inf  # minmax: the observed range itself
        if per_channel and case % 3 == 0:
            amax[-1, 0] = np.inf  # repeats minmax in the first row only
        pick = rng.integers(0, amax.shape[0], size=int(rng.integers(1, 7)))
        ranges = [calib.clip_range(lo, hi, amax[k], xp) for k in pick]
        lo_k, hi_k = (xp.stack([r[i] for r in ranges], axis=-1) for i in (0, 1))
        array_path, compiled = _both(lambda: np.asarray(calib.candidate_errors(
            x, lo_k, hi_k, axis=axis, spec=spec, xp=xp)).tobytes(), monkeypatch)
        assert array_path == compiled, (case, pick)


def test_mse_level_errors_kernel_only_for_integer_counts(monkeypatch):
    """The compiled level sums add the prefix sums as int64: non-integer counts (weights, averaged
    histograms) take the array code, whose float64 curve they then match; integer counts keep the kernel."""
    rng = np.random.default_rng(8)
    spec = quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)
    calls = []
    kernel = _compiled.mse_level_errors_kernel

    def spy(*args):
        calls.append(1)
        return kernel(*args)

    from observers_core import _calibration, mse_errors

    monkeypatch.setattr(_calibration, "mse_level_errors_kernel", spy)
    for case in range(12):
        h = rng.integers(0, 1000, 512).astype(np.float64)
        if case % 2:
            h = h * rng.uniform(0.1, 3.0, 512) if case % 4 == 1 else h + 0.25
        edges = np.linspace(0.0, float(rng.uniform(0.5, 50)), 513)
        calls.clear()
        array_path, compiled = _both(lambda: mse_threshold(h, edges, spec=spec, xp=xp), monkeypatch)
        assert bool(calls) == (case % 2 == 0), case
        assert array_path == compiled, case
        curves = _both(lambda: np.asarray(mse_errors(h, edges, spec=spec, xp=xp).objective), monkeypatch)
        np.testing.assert_array_equal(curves[0], curves[1])


def _pct_cases(rng):
    """Histograms for the percentile fast path: random, and the hard cases (zeros, one bin, huge
    counts, counts near 2**40 and 2**53, non-integer counts, float32 and small integer dtypes)."""
    for case in range(40):
        bins = int(rng.choice([1, 2, 7, 31, 32, 33, 64, 100, 2048]))
        kind = case % 10
        h = rng.integers(0, 1000, bins).astype(np.int64)
        if kind == 1:
            h[:] = 0
        elif kind == 2:
            h[:] = 0
            h[rng.integers(bins)] = int(rng.integers(1, 10**6))
        elif kind == 3:
            h = rng.integers(0, 2**40 // max(bins, 1), bins)  # large, below the int64 lane limit
        elif kind == 4:
            h = h.astype(np.float64) + 0.5  # not integers: the array code
        elif kind == 5:
            h = (h * (2**43)).astype(np.float64)  # integers, totals beyond 2**53 for many bins
        elif kind == 6:
            h = h.astype(np.float32)
        elif kind == 7:
            h = np.minimum(h, 255).astype(np.uint8)
        elif kind == 8:
            h = np.where(rng.random(bins) < 0.9, 0, h)  # sparse, long empty tails
        elif kind == 9:
            h = rng.integers(2**40, 2**41, bins)  # past the int64 lane limit: the array code
        edges = np.cumsum(rng.random(bins + 1)) * 10.0 ** rng.integers(-3, 3)
        yield h, edges


@pytest.mark.parametrize("symmetric", [True, False])
def test_percentile_fast_path_equals_array_code(monkeypatch, symmetric):
    from observers_core import percentile_range

    rng = np.random.default_rng(21 + symmetric)
    for h, edges in _pct_cases(rng):
        for p in (100.0, 99.99, 99.9, 90.0, 50.0, 1e-3):
            for hh, ee in ((h, edges), (np.stack([h, h[::-1]]), np.stack([edges, edges])), (np.stack([h, h]), edges)):
                got = _both(lambda: [np.asarray(a) for a in percentile_range(hh, ee, percentile=p, symmetric=symmetric,
                                                                             xp=xp)], monkeypatch)
                for general, fast in zip(*got):
                    assert general.dtype == fast.dtype and general.shape == fast.shape
                    np.testing.assert_array_equal(general, fast)


def test_percentile_fast_path_runs_where_exact(monkeypatch):
    from observers_core import _calibration, percentile_range

    statuses = []
    kernel = _compiled.percentile_rows_kernel

    def spy(*args):
        status = kernel(*args)
        statuses.append(status)
        return status

    monkeypatch.setattr(_calibration, "percentile_rows_kernel", spy)
    monkeypatch.setattr(_compiled, "ENABLED", True)  # (also under OBSERVERS_CORE_NO_NUMBA=1)
    e = np.linspace(0.0, 1.0, 2049)
    for h, status in ((np.arange(2048), 0), (np.arange(2048.0), 0), (np.arange(2048, dtype=np.float32), 0),
                      (np.arange(2048) + 0.5, 4), (np.full(2048, 2.0**50), 4), (np.full(2048, 2**40), 4)):
        statuses.clear()
        lo, hi = percentile_range(h, e, percentile=99.0, xp=xp)
        assert statuses == [status], (h[:2], statuses)
        monkeypatch.setattr(_compiled, "ENABLED", False)
        assert float(hi) == float(percentile_range(h, e, percentile=99.0, xp=xp)[1])
        monkeypatch.setattr(_compiled, "ENABLED", True)


@pytest.mark.parametrize("bad", ["nan", "inf", "negative", "nan_edge", "falling_edge"])
def test_percentile_fast_path_rejects_as_before(monkeypatch, bad):
    from observers_core import percentile_range

    h = np.arange(1.0, 257.0)
    e = np.linspace(0.0, 1.0, 257)
    if bad in ("nan", "inf", "negative"):
        h[100] = {"nan": np.nan, "inf": np.inf, "negative": -1.0}[bad]
    else:
        e[50] = np.nan if bad == "nan_edge" else -1.0
    for per_channel in (False, True):
        hh, ee = (np.stack([h, h]), np.stack([e, e])) if per_channel else (h, e)
        messages = []
        for enabled in (False, True):
            monkeypatch.setattr(_compiled, "ENABLED", enabled)
            with pytest.raises(ValueError) as err:
                percentile_range(hh, ee, xp=xp)
            messages.append(str(err.value))
            if bad in ("nan", "inf"):  # check=False: NaN thresholds, as before
                assert np.isnan(np.asarray(percentile_range(hh, ee, check=False, xp=xp)[1])).all()
        assert messages[0] == messages[1]


def test_percentile_fast_path_torch_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as txp

    from observers_core import percentile_range

    rng = np.random.default_rng(5)
    h = rng.integers(0, 100, (3, 300))
    e = np.sort(rng.random((3, 301)), axis=-1).astype(np.float32)
    for hist in (torch.as_tensor(h), torch.as_tensor(h, dtype=torch.float32)):
        got = _both(lambda: percentile_range(hist, torch.as_tensor(e), percentile=99.5, symmetric=False, xp=txp),
                    monkeypatch)
        for general, fast in zip(*got):
            assert isinstance(fast, torch.Tensor) and fast.dtype == general.dtype == torch.float32
            assert torch.equal(general, fast)


def _pct_outcome(fn):
    """``fn()``'s arrays as (dtype, shape, bytes), or its error."""
    try:
        return [(a.dtype, a.shape, a.tobytes()) for a in map(np.asarray, fn())]
    except ValueError as err:
        return str(err)


def _pct_float_row(rng, bins):
    """One row for the float-count kernel (the 2**52 shift): random, zero, one-hot, the limits of the exact
    path (2**52 and 2**53, totals near 2**53), non-integers and invalid counts, in the full blocks or the tail."""
    kind = int(rng.integers(12))
    h = rng.integers(0, 50, bins).astype(np.float64)
    at = int(rng.integers(bins)) if kind % 2 else bins - 1  # (the tail after the full blocks, when there is one)
    if kind == 1:
        h[:] = 0.0
    elif kind == 2:
        h[:] = 0.0
        h[at] = float(rng.choice([1.0, 2.0**52 - 1, 2.0**52, 2.0**52 + 2, 2.0**53 - 2, 2.0**53]))
    elif kind == 3:
        h[:] = rng.choice([-0.0, 0.0], bins)
    elif kind == 4:
        h[at] = float(rng.choice([0.5, 1e-300, 5e-324, 2.0**52 - 0.5, 2.0**51 + 0.5, 3.0 + 2**-40]))
    elif kind == 5:
        h[at] = float(rng.choice([np.nan, np.inf, -np.inf, -1.0, -0.5, -2.0**52, -2.0**60, 1e308]))
    elif kind == 6:
        h = np.full(bins, float(2**53 // bins)) + rng.integers(0, 2, bins)  # totals around 2**53
    elif kind == 7:
        h = np.where(rng.random(bins) < 0.95, 0.0, rng.integers(1, 2**40, bins).astype(np.float64))
    return h


def test_percentile_totals_past_int64(monkeypatch):
    """Counts whose int64 sum would wrap around (4096 x 2**51 = 2**63), and uint64 counts from 2**63 (negative
    as int64): the array code, as with larger totals."""
    from observers_core import percentile_range

    for h in (np.full(4096, 2.0**51), np.full(4096, 2**51), np.full(4096, 2.0**40), np.full(4096, 2.0**39)):
        for hh in (h, np.stack([h, h[::-1]])):
            e = np.linspace(0.0, 1.0, 4097)
            got = _both(lambda: _pct_outcome(lambda: percentile_range(hh, e, percentile=99.0, symmetric=False, xp=xp)),
                        monkeypatch)
            assert got[0] == got[1]
    for h in (np.array([1, 2**63, 5], dtype=np.uint64), np.array([3, 2**40, 0], dtype=np.uint64),
              np.array([3, 2**40 - 1, 0], dtype=np.uint64), np.array([3, 2**40, 0], dtype=np.int64)):
        got = _both(lambda: _pct_outcome(lambda: percentile_range(h, np.arange(4.0), percentile=50.0, xp=xp)),
                    monkeypatch)
        assert got[0] == got[1] and not isinstance(got[0], str), h  # (uint64 from 2**63: no error, as before)


@pytest.mark.parametrize("symmetric", [True, False])
def test_percentile_float_counts_and_edges_adversarial(monkeypatch, symmetric):
    from observers_core import percentile_range

    rng = np.random.default_rng(31 + symmetric)
    for case in range(120):
        bins = int(rng.choice([1, 3, 31, 32, 33, 127, 128, 129, 256, 257]))
        channels = int(rng.choice([1, 2, 5]))
        h = np.stack([_pct_float_row(rng, bins) for _ in range(channels)])
        if case % 4 == 3:
            with np.errstate(over="ignore"):  # (1e308: inf)
                h = h.astype(np.float32)
        shared = case % 3 == 0
        e = np.cumsum(rng.random((1 if shared else channels, bins + 1)), axis=-1) - 1.0
        if case % 5 == 4:  # a bad edge: first, last, or in the tail
            where = int(rng.choice([0, bins, bins - 1, bins // 2]))
            e[int(rng.integers(e.shape[0])), where] = float(rng.choice([np.nan, np.inf, -np.inf, -50.0]))
        ee = e[0] if shared and case % 2 else e
        for p in (100.0, 99.99, 50.0):
            for check in (True, False):
                got = _both(lambda: _pct_outcome(lambda: percentile_range(h, ee, percentile=p, symmetric=symmetric,
                                                                          check=check, xp=xp)), monkeypatch)
                assert got[0] == got[1], (case, p, check, h, e)


def test_percentile_many_rows(monkeypatch):
    """Many rows, one of them (or of the edges) invalid anywhere: the kernel's results and errors are the
    array code's (it stops at the first row it cannot do exactly, the array code then runs)."""
    from observers_core import percentile_range

    rng = np.random.default_rng(41)
    channels, bins = 80, 2048
    for case in range(8):
        h = rng.integers(0, 1000, (channels, bins))
        h[rng.random(channels) < 0.2] = 0
        e = np.sort(rng.random((1 if case % 2 else channels, bins + 1)), axis=-1)
        if case >= 4:  # one invalid row or edge, anywhere
            h = h.astype(np.float64)
            if case == 4:
                h[int(rng.integers(channels)), 7] = np.nan
            elif case == 5:
                h[int(rng.integers(channels)), 3] = 0.5
            else:
                e[int(rng.integers(e.shape[0])), 9] = -1.0
        for symmetric in (True, False):
            got = _both(lambda: _pct_outcome(lambda: percentile_range(h, e, percentile=99.9, symmetric=symmetric,
                                                                      xp=xp)), monkeypatch)
            assert got[0] == got[1], case
