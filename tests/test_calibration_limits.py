"""Calibration searches at float32's limits and on invalid histograms (issue 11, items 4 and 13).

Item 4: JAX without x64 runs the searches in float32. Bin centers of edges near float32's maximum
overflowed, and XLA divides by multiplying with the reciprocal, which is subnormal (flushed to zero) for a
norm above 2**126: every MSE error became 0 or NaN and the first candidate won. Item 13: the searches
accepted negative or NaN counts and decreasing or infinite edges silently.
"""

from __future__ import annotations

import numpy as np
import pytest

import observers_core as oc
from observers_core._calibration import bin_centers, error_norm

jax = pytest.importorskip("jax")
jnp = jax.numpy

SPEC = oc.quant_spec("qint8", "per_tensor_symmetric")


def _heavy_tailed(rng: np.random.Generator, magnitude: float, kind: int) -> np.ndarray:
    draw = (rng.standard_normal, lambda s: rng.uniform(-1, 1, s), rng.standard_cauchy)[kind]
    return np.clip(draw((16, 32)) * magnitude, -3.3e38, 3.3e38).astype(np.float32)


@pytest.mark.parametrize("seed", range(12))
def test_float32_searches_equal_float64_near_float32_max(seed):
    """mse/kl/percentile thresholds of a histogram of |x| with |x| up to 3.3e38: JAX float32 == NumPy float64."""
    rng = np.random.default_rng(seed)
    x = _heavy_tailed(rng, 10.0 ** rng.uniform(35, 38.5), seed % 3)
    results = {}
    for name, xp, arr in (("numpy", np, x), ("jax", jnp, jnp.asarray(x))):
        state = oc.calib_histogram_update(oc.calib_histogram_init(bins=2048, xp=xp), arr, absolute=True)
        edges = oc.calib_histogram_edges(state)
        results[name] = [
            float(oc.mse_threshold(state.counts, edges, spec=SPEC)),
            float(oc.kl_threshold(state.counts, edges)),
            float(oc.percentile_range(state.counts, edges, percentile=99.9)[1]),
        ]
    assert all(np.isfinite(results["jax"]))
    assert results["jax"] == results["numpy"]


@pytest.mark.parametrize("name", ["MSEObserver", "KLObserver", "MixObserver", "PercentileObserver"])
def test_jax_observers_equal_numpy_near_float32_max(name):
    from observers_core.adapters import _array_calibration as numpy_observers
    from observers_core.adapters import jax as jax_observers

    rng = np.random.default_rng(7)
    mismatches = []
    for trial in range(6):
        x = _heavy_tailed(rng, 10.0 ** rng.uniform(35, 38.5), trial % 3)
        ours_np, ours_jax = getattr(numpy_observers, name)(), getattr(jax_observers, name)()
        for batch in (x[:8], x[8:]):
            ours_np(batch)
            ours_jax(jnp.asarray(batch))
        s_np, s_jax = np.asarray(ours_np.calculate_qparams()[0]), np.asarray(ours_jax.calculate_qparams()[0])
        if not np.array_equal(s_np, s_jax):
            mismatches.append((trial, s_np, s_jax))
    assert not mismatches


def test_bin_centers_and_error_norm_at_the_limit():
    edges = np.array([[0.0, 1.6e38, 1.7014118e38, 3.4e38]], dtype=np.float32)
    centers = bin_centers(edges, np)
    assert np.all(np.isfinite(centers))
    np.testing.assert_array_equal(centers, (edges[:, :-1].astype(np.float64) + edges[:, 1:]) / 2)
    norm = error_norm(edges, np)
    assert norm.dtype == np.float32 and norm[0] == np.float32(2.0**126)  # 1 / norm stays normal
    small = error_norm(np.array([[0.0, 3.0, 5.0]], dtype=np.float32), np)
    assert small[0] == 8.0  # the smallest power of two >= max |edge|
    assert error_norm(np.zeros((2, 3), dtype=np.float64), np).tolist() == [1.0, 1.0]


def _searches(hist, edges, **kw):
    """Every public search on (hist, edges)."""
    return [
        lambda: oc.kl_threshold(hist, edges, **kw),
        lambda: oc.kl_divergences(hist, edges, **kw),
        lambda: oc.mse_threshold(hist, edges, spec=SPEC, **kw),
        lambda: oc.mse_errors(hist, edges, spec=SPEC, **kw),
        lambda: oc.percentile_range(hist, edges, **kw),
        lambda: oc.histogram_quantization_error(hist, edges, 0.1, 0, quant_min=-128, quant_max=127, **kw),
    ]


def _invalid_cases():
    counts = np.arange(1, 257, dtype=np.float64)
    edges = np.linspace(0.0, 4.0, 257)
    negative = counts.copy(); negative[3] = -1
    nan = counts.copy(); nan[7] = np.nan
    inf = counts.copy(); inf[0] = np.inf
    decreasing = edges.copy(); decreasing[10] = decreasing[12]
    infinite = edges.copy(); infinite[-1] = np.inf
    nan_edge = edges.copy(); nan_edge[5] = np.nan
    return {
        "negative count": (negative, edges, "counts"),
        "nan count": (nan, edges, "counts"),
        "inf count": (inf, edges, "counts"),
        "decreasing edges": (counts, decreasing, "edges"),
        "infinite edge": (counts, infinite, "edges"),
        "nan edge": (counts, nan_edge, "edges"),
    }


@pytest.mark.parametrize("case", list(_invalid_cases()))
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_searches_reject_invalid_histograms(case, backend):
    hist, edges, what = _invalid_cases()[case]
    if backend == "torch":
        torch = pytest.importorskip("torch")
        hist, edges = torch.asarray(hist), torch.asarray(edges)
    elif backend == "jax":
        hist, edges = jnp.asarray(hist, dtype=jnp.float32), jnp.asarray(edges, dtype=jnp.float32)
    for search in _searches(hist, edges):
        with pytest.raises(ValueError, match=what):
            search()


def test_valid_histograms_pass_and_jit_skips_the_check():
    counts = np.arange(256, dtype=np.float32)
    edges = np.linspace(0.0, 4.0, 257, dtype=np.float32)
    for checked, unchecked in zip(_searches(counts, edges), _searches(counts, edges, check=False)):
        a, b = checked(), unchecked()  # accepted; check=False changes nothing for a valid histogram
        for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    traced = jax.jit(lambda h, e: oc.mse_threshold(h, e, spec=SPEC))  # tracers cannot be read: no check
    bad = counts.copy()
    bad[3] = -1
    assert np.isfinite(float(traced(jnp.asarray(bad), jnp.asarray(edges))))


def _namespace_and_maker(framework: str):
    """``(namespace, array maker from NumPy)`` of ``framework`` (torch: array-api-compat's namespace)."""
    if framework == "torch":
        torch = pytest.importorskip("torch")
        return pytest.importorskip("array_api_compat.torch"), torch.from_numpy
    xp = {"numpy": np, "jax": jnp}[framework]
    return xp, xp.asarray


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_averaged_range_never_overflows_to_an_infinity(framework):
    """The calibration observers' moving average of ranges: where ``lo - x_min`` overflows float32 it is
    the convex ``x_min (1 - c) + lo c`` (within 2 ulp of the float64 value), the same bits on every
    framework; entries that do not overflow keep the formula's bits. Found by the adversarial machine:
    a KLObserver holding (-1.7e38, 1.7e38) that saw a single -2.4e38 held max_val = -inf, and torch's
    calculate_qparams raised where numpy's returned (1, 0)."""
    from observers_core import MinMaxState, moving_average_update
    from observers_core.families.calibration import average_range

    xp, arr = _namespace_and_maker(framework)
    c = 0.01
    old = np.array([-1.7e38, 1.7e38, -1.0, 3.0e38], dtype=np.float32)  # the last: no overflow, huge
    lo = np.array([-2.4e38, -2.4e38, -2.0, -3.0e38], dtype=np.float32)
    hi = np.array([-2.4e38, -2.4e38, 5.0, 3.3e38], dtype=np.float32)
    state = MinMaxState(arr(old), arr(old))
    got = average_range(state, arr(lo), arr(hi), c, xp)
    plain = moving_average_update(state, xp.stack([arr(lo), arr(hi)], axis=-1), averaging_constant=c, axis=0,
                                  ignore_nonfinite=True, xp=xp)
    on_numpy = average_range(MinMaxState(old, old), lo, hi, c, np)
    for value, target, formula, reference in ((got.min_val, lo, plain.min_val, on_numpy.min_val),
                                              (got.max_val, hi, plain.max_val, on_numpy.max_val)):
        value, formula = np.asarray(value), np.asarray(formula)
        np.testing.assert_array_equal(value, reference)  # the same bits as numpy's
        assert np.all(np.isfinite(value)), value
        exact = old.astype(np.float64) * (1 - c) + target.astype(np.float64) * c
        assert np.all(np.abs(value - exact) <= 2 * np.spacing(np.abs(value))), (value, exact)
        finite = np.isfinite(formula)
        np.testing.assert_array_equal(value[finite], formula[finite])  # the formula's bits where it holds
        assert not finite.all()  # the case is exercised


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_the_convex_average_rounds_each_product_on_every_framework(framework):
    """The convex ``x_min (1 - c) + lo c`` rounds both products, then the sum (float32), on every framework:
    XLA would fuse one product into the addition (one rounding fewer: 1 ulp apart on these values, found
    by the adversarial machine as a MixObserver whose JAX min_val was numpy's + 1 ulp; JAX jit-compiled)."""
    from observers_core import MinMaxState
    from observers_core.families.calibration import average_range

    xp, arr = _namespace_and_maker(framework)
    f32, c = np.float32, 0.01
    old = np.array([-1.769655e38, -2.7312808e38, -3.1575872e38, -2.9404143e38], dtype=f32)
    lo = np.array([1.728097e38, 2.9401442e38, 1.7570956e38, 1.9986146e38], dtype=f32)  # lo - old overflows
    step = lambda state, low, high: average_range(state, low, high, c, xp)  # noqa: E731
    if framework == "jax":
        step = jax.jit(step)  # (as the JAX observers run it: compiled, where XLA fuses)
    got = step(MinMaxState(arr(old), arr(-old)), arr(lo), arr(lo))
    two_roundings = (old * f32(1 - c)) + (lo * f32(c))
    fused = (old.astype(np.float64) * f32(1 - c) + (lo * f32(c))).astype(f32)
    assert np.any(two_roundings != fused)  # the case tells the two apart
    np.testing.assert_array_equal(np.asarray(got.min_val), two_roundings)


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_averaged_range_stays_ordered_where_the_formula_cancels(framework):
    """``x + c * (t - x)`` cancels when ``x`` dwarfs ``t``: with ``c = 1`` a channel holding (-1, 1e30) that
    sees the single value 0.125 gets ``max_val = 1e30 + (0.125 - 1e30) = 0`` below ``min_val = 0.125``
    (torch's calculate_qparams then raised where numpy's returned (1, 0); found by the adversarial
    machine, PercentileObserver per channel). Such channels take the convex average on both sides, which
    is ordered; the others keep the formula's bits."""
    from observers_core import MinMaxState, moving_average_update
    from observers_core.families.calibration import average_range

    xp, arr = _namespace_and_maker(framework)
    old_min = np.array([-1.0, -1e30, -2.0, np.inf], dtype=np.float32)
    old_max = np.array([1e30, 1.0, 3.0, -np.inf], dtype=np.float32)  # the last: nothing seen yet
    lo = np.array([0.125, -0.5, -1.0, 0.25], dtype=np.float32)
    hi = np.array([0.125, -0.5, 2.0, 0.75], dtype=np.float32)
    for c in (1.0, 0.5):
        state = MinMaxState(arr(old_min), arr(old_max))
        got = [np.asarray(v) for v in average_range(state, arr(lo), arr(hi), c, xp)]
        plain = [np.asarray(v) for v in moving_average_update(
            state, xp.stack([arr(lo), arr(hi)], axis=-1), averaging_constant=c, axis=0, ignore_nonfinite=True, xp=xp)]
        assert np.all(got[0] <= got[1]), (c, got)
        cancelled = plain[0] > plain[1]
        assert cancelled.any() == (c == 1.0)  # the case is exercised (c = 1: the first two channels)
        for value, old, target, formula in zip(got, (old_min, old_max), (lo, hi), plain):
            convex = old[cancelled] * np.float32(1 - c) + target[cancelled] * np.float32(c)
            np.testing.assert_array_equal(value[cancelled], convex)
            np.testing.assert_array_equal(value[~cancelled], formula[~cancelled])
        if c == 1.0:
            np.testing.assert_array_equal(got[0][:2], lo[:2])  # c = 1: the batch's range exactly
            np.testing.assert_array_equal(got[1][:2], hi[:2])


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_averaged_range_per_tensor_stays_ordered_where_the_formula_cancels(framework):
    """The same per tensor with a batch range ``lo < hi`` (NumPy's per-tensor average runs on scalars):
    (-1, 1e30) seeing [0.125, 0.25] with ``c = 1`` gives ``max_val = 0`` by the formula; both sides take
    the convex average, the batch's range exactly. Likewise a side whose difference overflows."""
    from observers_core import MinMaxState
    from observers_core.families.calibration import average_range

    xp, arr = _namespace_and_maker(framework)
    f32 = np.float32
    for c, cancels in ((1.0, True), (0.5, False)):
        state = MinMaxState(arr(np.asarray(-1.0, dtype=f32)), arr(np.asarray(1e30, dtype=f32)))
        got = [np.asarray(v) for v in average_range(state, arr(np.asarray(0.125, dtype=f32)),
                                                     arr(np.asarray(0.25, dtype=f32)), c, xp)]
        formula = (f32(-1.0) + f32(c) * (f32(0.125) - f32(-1.0)), f32(1e30) + f32(c) * (f32(0.25) - f32(1e30)))
        assert (formula[0] > formula[1]) == cancels
        expected = (f32(0.125), f32(0.25)) if cancels else formula
        assert got[0].shape == () and got[0] <= got[1], (c, got)
        np.testing.assert_array_equal(np.stack(got), np.stack(expected))
    # (-3e38, -2e38) seeing [2e38, 3e38]: both differences overflow (the formula gives +inf on both sides,
    # still ordered); each side takes the convex average
    state = MinMaxState(arr(np.asarray(-3e38, dtype=f32)), arr(np.asarray(-2e38, dtype=f32)))
    got = [np.asarray(v) for v in average_range(state, arr(np.asarray(2e38, dtype=f32)),
                                                 arr(np.asarray(3e38, dtype=f32)), 0.5, xp)]
    expected = (f32(-3e38) * f32(0.5) + f32(2e38) * f32(0.5), f32(-2e38) * f32(0.5) + f32(3e38) * f32(0.5))
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))


def test_calibration_bins_stop_at_two_to_the_24():
    """Bins are indexed in the values' float type (float32 for float32 data), exact up to ``2**24``: more bins
    are a ``ValueError`` naming ``bins`` in the core (was a MemoryError or wrong bins) and in every observer."""
    from observers_core.adapters import _array_calibration as calibration

    with pytest.raises(ValueError, match="bins"):
        oc.calib_histogram_init(bins=2**24 + 1, xp=np)
    for cls in (calibration.KLObserver, calibration.MSEObserver, calibration.MixObserver):
        assert cls(bins=2**24).config.bins == 2**24  # the bound itself is accepted (nothing allocated yet)
        with pytest.raises(ValueError, match="bins"):
            cls(bins=2**24 + 1)
