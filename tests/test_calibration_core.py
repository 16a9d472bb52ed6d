"""Calibration searches (KL, MSE, percentile) and the histogram state of ``observers_core._calibration``.

Oracles: the float64 NumPy loops of ``_calibration_reference`` (one candidate at a time) and, where it
imports, NVIDIA ModelOpt's ``_compute_amax_entropy`` / ``_compute_amax_mse`` / ``_compute_amax_percentile``,
on 504 random histograms per method (normal, Laplace, uniform, one-sided, sparse, heavy outliers).
Where ModelOpt cannot be matched the mismatch is characterised and ours is shown no worse on the
objective. Then every backend of the ``xp`` fixture (and ``jax.jit``, with and without x64) gives the
numpy results, per channel.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest

import observers_core as oc
from _calibration_reference import (
    kl_divergences_ref,
    kl_threshold_ref,
    mse_errors_ref,
    percentile_range_ref,
    pick_ref,
    qparams_ref,
    quant_error_ref,
)
from conftest import to_numpy

FAMILIES = ("normal", "laplace", "uniform", "one_sided", "sparse", "outliers")
CASES_PER_FAMILY = 84  # 6 * 84 = 504 random histograms per method
NARROW_INT8 = oc.quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)  # ModelOpt's int8
MSE_SPECS = {  # name -> (spec, reference kwargs)
    "modelopt_int8": (NARROW_INT8, dict(quant_min=-127, quant_max=127, symmetric=True)),
    "modelopt_uint8": (oc.quant_spec("quint8"), dict(quant_min=0, quant_max=255, symmetric=False)),
    "qint8_symmetric": (oc.quant_spec("qint8", "per_tensor_symmetric"), dict(quant_min=-128, quant_max=127, symmetric=True)),
    "quint8_symmetric": (oc.quant_spec("quint8", "per_tensor_symmetric"),
                         dict(quant_min=0, quant_max=255, symmetric=True, zero_point_sym=128)),
    "quint4x2_affine": (oc.quant_spec("quint4x2"), dict(quant_min=0, quant_max=15, symmetric=False)),
    "float_qparams": (oc.quant_spec("quint8", "per_channel_affine_float_qparams"),
                      dict(quant_min=0, quant_max=255, symmetric=False, float_qparams=True)),
    "int16_symmetric": (oc.quant_spec("int16", "per_tensor_symmetric"),  # more levels than bins: by bin
                        dict(quant_min=-(2**15), quant_max=2**15 - 1, symmetric=True)),
}


# ----------------------------------------------------------------------------------------------
# Random histograms
# ----------------------------------------------------------------------------------------------


def sample(family: str, rng: np.random.Generator, n: int) -> np.ndarray:
    scale = 10 ** rng.uniform(-3, 3)
    if family == "normal":
        return rng.standard_normal(n) * scale
    if family == "laplace":
        return rng.laplace(size=n) * scale
    if family == "uniform":
        return rng.uniform(-1, 1, n) * scale
    if family == "one_sided":  # far from zero: the histogram of |x| starts with empty bins
        return rng.uniform(rng.uniform(0.2, 0.95), 1.0, n) * scale
    if family == "sparse":  # a few distinct values: mostly empty bins
        return rng.choice(rng.standard_normal(int(rng.integers(1, 30))), n) * scale
    if family == "outliers":  # a bulk plus a few values thousands of sigmas out
        x = rng.standard_normal(n)
        x[rng.integers(0, n, max(1, n // 2000))] *= rng.uniform(50, 5000)
        return x * scale
    raise AssertionError(family)


def abs_histogram(family: str, rng: np.random.Generator, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """A ModelOpt-style histogram of |x| over [0, max|x|] (int64 counts, float64 edges)."""
    x = np.abs(sample(family, rng, int(rng.integers(20, 20000))))
    return np.histogram(x, bins=bins, range=(0.0, float(x.max())))


def kl_cases(family: str):
    """Histograms and KL settings small enough for ModelOpt's pure-Python search (O(bins**2))."""
    rng = np.random.default_rng(FAMILIES.index(family) + 100)
    for _ in range(CASES_PER_FAMILY):
        num_bits = int(rng.choice([2, 3, 4, 5, 8]))
        unsigned = bool(rng.random() < 0.25) and num_bits < 8
        levels = 1 << (num_bits - 1 + unsigned)
        bins = int(rng.integers(levels, max(2 * levels, 96) + 1)) if levels < 128 else int(rng.integers(128, 200))
        h, e = abs_histogram(family, rng, bins)
        if rng.random() < 0.5:
            start = min(levels, bins)
        else:
            start = int(rng.integers(max(1, bins - 60), bins + 1))
        stride = int(rng.choice([1, 1, 2, 3]))
        yield h, e, num_bits, unsigned, levels, start, stride


def mse_cases(family: str):
    rng = np.random.default_rng(FAMILIES.index(family) + 200)
    names = list(MSE_SPECS)
    for _ in range(CASES_PER_FAMILY):
        bins = int(rng.integers(16, 300))
        h, e = abs_histogram(family, rng, bins)
        yield h, e, names[int(rng.integers(len(names)))], int(rng.integers(0, bins)), int(rng.choice([1, 1, 2, 5]))


def percentile_cases(family: str):
    rng = np.random.default_rng(FAMILIES.index(family) + 300)
    for _ in range(CASES_PER_FAMILY):
        bins = int(rng.integers(1, 3000))
        p = float(rng.choice([50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0, rng.uniform(0.5, 100)]))
        yield (*abs_histogram(family, rng, bins), p)


def edge_index(edges: np.ndarray, value: float, candidates) -> int:
    """The candidate bin index whose edge is ``value`` (compared in float32, as ModelOpt returns it)."""
    hits = [i for i in candidates if np.float32(edges[i]) == np.float32(value)]
    assert len(hits) >= 1, (value, edges[:3])
    return hits[-1]


# ----------------------------------------------------------------------------------------------
# ModelOpt, where it imports
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modelopt():
    """ModelOpt's histogram calibrator module (``pip install nvidia-modelopt``; 0.47 also needs
    ``huggingface_hub``, which it imports without declaring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(
            "modelopt.torch.quantization.calib.histogram",
            reason="nvidia-modelopt is not installed or does not import here",
        )


def modelopt_mse_index(h, e, *, num_bits, unsigned, start, stride, bias_slot_bug=False):
    """ModelOpt's ``_compute_amax_mse`` loop, returning the candidate index it picks.

    The loop, the float32 arithmetic and the quantizer (``fake_tensor_quant``) are ModelOpt's own.
    ModelOpt 0.47 calls ``fake_tensor_quant(centers, amax, num_bits, unsigned)`` although the third
    parameter became ``bias``: ``bias_slot_bug=True`` reproduces that call, the default passes
    ``num_bits``/``unsigned`` to their parameters (``bias=None``)."""
    import torch
    from modelopt.torch.quantization.tensor_quant import fake_tensor_quant

    counts = torch.from_numpy(np.asarray(h)).float()
    edges = torch.from_numpy(np.asarray(e)).float()
    centers = (edges[1:] + edges[:-1]) / 2
    mses = []
    for i in range(start, len(centers), stride):
        if bias_slot_bug:
            q = fake_tensor_quant(centers, centers[i], num_bits, unsigned)
        else:
            q = fake_tensor_quant(centers, centers[i], None, num_bits, unsigned)
        mses.append(((q - centers) ** 2 * counts).mean())
    return start + stride * int(np.argmin(mses)), centers


# ----------------------------------------------------------------------------------------------
# KL
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_matches_reference(family):
    for h, e, num_bits, unsigned, levels, start, stride in kl_cases(family):
        curve = oc.kl_divergences(h, e, num_bits=num_bits, unsigned=unsigned, start_bin=start, stride=stride)
        ref = kl_divergences_ref(h, num_levels=levels, start_bin=start, stride=stride)
        assert to_numpy(curve.index).tolist() == [i for i, _ in ref]
        ours, theirs = to_numpy(curve.objective), np.array([v for _, v in ref])
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
        finite = np.isfinite(theirs)
        np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(to_numpy(curve.threshold), e[[i for i, _ in ref]])
        for ties in ("last", "first"):
            got = oc.kl_threshold(h, e, num_bits=num_bits, unsigned=unsigned, start_bin=start, stride=stride, ties=ties)
            assert float(got) == kl_threshold_ref(h, e, num_levels=levels, start_bin=start, stride=stride, ties=ties)


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_smoothing_and_options_match_reference(family):
    rng = np.random.default_rng(FAMILIES.index(family))
    for k, (h, e, num_bits, unsigned, levels, start, stride) in enumerate(kl_cases(family)):
        if k % 4:
            continue
        smoothing = float(rng.choice([1e-4, 1e-2, 0.5]))
        flatten = bool(k % 8)
        kw = dict(start_bin=start, stride=stride, smoothing=smoothing, flatten_first_bin=flatten)
        curve = oc.kl_divergences(h, e, num_levels=levels, **kw)
        theirs = np.array([v for _, v in kl_divergences_ref(h, num_levels=levels, **kw)])
        ours = to_numpy(curve.objective)
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
        np.testing.assert_allclose(ours[np.isfinite(theirs)], theirs[np.isfinite(theirs)], rtol=1e-9, atol=1e-12)
        assert float(oc.kl_threshold(h, e, num_levels=levels, **kw)) == kl_threshold_ref(h, e, num_levels=levels, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_matches_modelopt(family, modelopt):
    """Same threshold as ``_compute_amax_entropy``, except (characterised, and ours never worse):
    - ``modelopt_nan``: scipy's KL is NaN where the kept bins hold no data (0/0), ModelOpt's argmin
      takes NaN as the least value, and returns a threshold that clips all the data; ours gives
      such candidates +inf;
    - ``tie``: the two candidates' float64 divergences are within 1e-12 nats."""
    outcome = {"match": 0, "modelopt_nan": 0, "tie": 0}
    for h, e, num_bits, unsigned, levels, start, stride in kl_cases(family):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's 0/0 on the candidates that keep no data
            theirs = float(modelopt._compute_amax_entropy(h.copy(), e, num_bits, unsigned, stride, start))
        ours = float(oc.kl_threshold(h, e, num_bits=num_bits, unsigned=unsigned, start_bin=start, stride=stride))
        candidates = range(start, h.size + 1, stride)
        i_ours, i_theirs = edge_index(e, ours, candidates), edge_index(e, theirs, candidates)
        if i_ours == i_theirs:
            outcome["match"] += 1
            continue
        ref = dict(kl_divergences_ref(h, num_levels=levels, start_bin=start, stride=stride))
        assert ref[i_ours] <= ref[i_theirs] + 1e-12, (i_ours, i_theirs)
        flattened = np.concatenate([h[1:2], h[1:]])
        if flattened[:i_theirs].sum() == 0:
            outcome["modelopt_nan"] += 1
        else:
            assert abs(ref[i_ours] - ref[i_theirs]) <= 1e-12, (i_ours, i_theirs, ref[i_ours], ref[i_theirs])
            outcome["tie"] += 1
    assert outcome["match"] >= CASES_PER_FAMILY // 4, outcome


def test_kl_modelopt_nan_case_is_real(modelopt):
    """A one-sided histogram whose first candidates keep no data: ModelOpt returns the left edge of
    the data (clipping it all); ours keeps the data."""
    h = np.zeros(256, dtype=np.int64)
    h[200:256] = 1000
    e = np.linspace(0.0, 1.0, 257)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = float(modelopt._compute_amax_entropy(h.copy(), e, 8, False, 1, 128))
    ours = float(oc.kl_threshold(h, e))
    assert theirs == pytest.approx(e[200])
    assert ours == pytest.approx(kl_threshold_ref(h, e, num_levels=128, start_bin=128)) and ours > e[200]


# ----------------------------------------------------------------------------------------------
# MSE
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_mse_matches_reference(family):
    for h, e, name, start, stride in mse_cases(family):
        spec, ref_kw = MSE_SPECS[name]
        curve = oc.mse_errors(h, e, spec=spec, start_bin=start, stride=stride)
        ref = mse_errors_ref(h, e, start_bin=start, stride=stride, **ref_kw)
        assert to_numpy(curve.index).tolist() == [k for k, _, _ in ref]
        np.testing.assert_array_equal(to_numpy(curve.threshold), [c for _, c, _ in ref])
        theirs = np.array([v for _, _, v in ref])
        # By level (float64, at most `bins` levels) the sum is accurate to ~1e-10 relative; by bin, exact.
        np.testing.assert_allclose(to_numpy(curve.objective), theirs, rtol=1e-8, atol=1e-300)
        got = float(oc.mse_threshold(h, e, spec=spec, start_bin=start, stride=stride))
        k = pick_ref(theirs, tol=1e-9 * theirs.min(), ties="first")
        k_got = [c for _, c, _ in ref].index(got)
        assert k_got == k or theirs[k_got] <= theirs[k] * (1 + 1e-9), (name, k_got, k)


@pytest.mark.parametrize("family", FAMILIES)
def test_mse_matches_modelopt_quantizer(family, modelopt):
    """Same candidate as ModelOpt's MSE search (its loop, float32 arithmetic and ``fake_tensor_quant``),
    for its int8 (``quant_min=-127``) and unsigned (``quint8``) quantizers. A mismatch may only be a
    float32 near-tie: ModelOpt's pick is within 1e-5 of ours on the float64 objective, ours no worse."""
    rng = np.random.default_rng(FAMILIES.index(family) + 400)
    outcome = {"match": 0, "float32_tie": 0}
    for h, e, _, start, stride in mse_cases(family):
        unsigned = bool(rng.random() < 0.3)
        spec = oc.quant_spec("quint8") if unsigned else NARROW_INT8
        k_theirs, _ = modelopt_mse_index(h, e, num_bits=8, unsigned=unsigned, start=start, stride=stride)
        ours = float(oc.mse_threshold(h, e, spec=spec, start_bin=start, stride=stride))
        k_ours = int(np.nonzero((e[1:] + e[:-1]) / 2 == ours)[0][0])
        if k_ours == k_theirs:
            outcome["match"] += 1
            continue
        ref_kw = MSE_SPECS["modelopt_uint8" if unsigned else "modelopt_int8"][1]
        scale_ours, zp = qparams_ref((e[k_ours] + e[k_ours + 1]) / 2, **ref_kw)
        scale_theirs, _ = qparams_ref((e[k_theirs] + e[k_theirs + 1]) / 2, **ref_kw)
        qk = dict(quant_min=ref_kw["quant_min"], quant_max=ref_kw["quant_max"])
        err_ours = quant_error_ref(h, e, scale_ours, zp, **qk)
        err_theirs = quant_error_ref(h, e, scale_theirs, zp, **qk)
        assert err_ours <= err_theirs * (1 + 1e-9) and err_theirs <= err_ours * (1 + 1e-5), (k_ours, k_theirs)
        outcome["float32_tie"] += 1
    assert outcome["match"] >= 0.9 * CASES_PER_FAMILY, outcome


def test_modelopt_compute_amax_mse_bias_slot(modelopt):
    """``_compute_amax_mse`` itself, as installed: ModelOpt 0.47 passes ``num_bits`` positionally into
    ``fake_tensor_quant``'s ``bias`` slot (and ``unsigned`` into ``num_bits``), so its thresholds are
    those of a broken quantizer. This test pins that down; if a fixed ModelOpt is installed, it
    checks ours against ``_compute_amax_mse`` directly instead."""
    rng = np.random.default_rng(7)
    differs = 0
    for k in range(12):
        h, e = abs_histogram(FAMILIES[k % len(FAMILIES)], rng, int(rng.integers(64, 300)))
        start = int(rng.integers(0, h.size // 2))
        theirs = float(modelopt._compute_amax_mse(h.copy(), e, 8, False, 1, start))
        k_fixed, centers = modelopt_mse_index(h, e, num_bits=8, unsigned=False, start=start, stride=1)
        ours = float(oc.mse_threshold(h, e, spec=NARROW_INT8, start_bin=start))
        if theirs == float(centers[k_fixed]):  # a ModelOpt whose call is fixed
            assert np.float32(ours) == pytest.approx(theirs, rel=1e-6)
            continue
        k_buggy, _ = modelopt_mse_index(h, e, num_bits=8, unsigned=False, start=start, stride=1, bias_slot_bug=True)
        assert theirs == float(centers[k_buggy])
        differs += 1
    assert differs == 0 or differs >= 6


# ----------------------------------------------------------------------------------------------
# Percentile
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_percentile_matches_reference(family):
    for h, e, p in percentile_cases(family):
        lo, hi = oc.percentile_range(h, e, percentile=p)
        assert (float(lo), float(hi)) == percentile_range_ref(h, e, percentile=p)
        lo, hi = oc.percentile_range(h, e, percentile=p, symmetric=False)
        assert (float(lo), float(hi)) == percentile_range_ref(h, e, percentile=p, symmetric=False)
        # The two-sided range of the mirrored histogram is the mirrored range, exactly.
        mlo, mhi = oc.percentile_range(h[::-1].copy(), -e[::-1], percentile=p, symmetric=False)
        assert (float(mlo), float(mhi)) == (-float(hi), -float(lo))


@pytest.mark.parametrize("family", FAMILIES)
def test_percentile_matches_modelopt(family, modelopt):
    """Same threshold as ``_compute_amax_percentile`` except where the exact cumulative fraction
    ``S_j / N`` equals ``p / 100`` (to 1e-9): ModelOpt compares a running float sum of fractions,
    which lands on either side (at p = 100 it often ends below 1 and returns the last edge)."""
    outcome = {"match": 0, "boundary": 0}
    for h, e, p in percentile_cases(family):
        theirs = float(modelopt._compute_amax_percentile(h, e, p))
        ours = float(oc.percentile_range(h, e, percentile=p)[1])
        i_ours = edge_index(e, ours, range(h.size + 1))
        i_theirs = edge_index(e, theirs, range(h.size + 1))
        if i_ours == i_theirs:
            outcome["match"] += 1
            continue
        fraction = np.cumsum(h)[min(i_ours, i_theirs)] / h.sum()
        assert abs(fraction - p / 100) <= 1e-9, (p, i_ours, i_theirs, fraction)
        outcome["boundary"] += 1
    assert outcome["match"] >= 0.75 * CASES_PER_FAMILY, outcome


# ----------------------------------------------------------------------------------------------
# Quantization error of given qparams (MixObserver)
# ----------------------------------------------------------------------------------------------


def test_histogram_quantization_error_matches_reference_and_mse_curve():
    rng = np.random.default_rng(11)
    for k in range(60):
        family = FAMILIES[k % len(FAMILIES)]
        x = sample(family, rng, 5000)
        h, e = np.histogram(x, bins=int(rng.integers(8, 400)))  # signed data, affine qparams
        spec = oc.quant_spec("quint8" if k % 2 else "qint8", "per_tensor_affine")
        qp = oc.calculate_qparams(np.float32(x.min()), np.float32(x.max()), spec)
        got = float(oc.histogram_quantization_error(h, e, qp.scale, qp.zero_point,
                                                      quant_min=spec.quant_min, quant_max=spec.quant_max))
        want = quant_error_ref(h, e, float(qp.scale[0]), float(qp.zero_point[0]),
                               quant_min=spec.quant_min, quant_max=spec.quant_max)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-300)
    # On a histogram of |x| it is the MSE search's objective at each candidate.
    h, e = abs_histogram("laplace", rng, 300)
    curve = oc.mse_errors(h, e, spec=NARROW_INT8, start_bin=10, stride=7)
    for k, amax, objective in zip(to_numpy(curve.index), to_numpy(curve.threshold), to_numpy(curve.objective)):
        qp = oc.calculate_qparams(np.float64(0), np.float64(amax), NARROW_INT8)
        err = oc.histogram_quantization_error(h, e, qp.scale, qp.zero_point, quant_min=-127, quant_max=127)
        assert float(err) == pytest.approx(objective, rel=1e-8)


def test_leading_shapes_and_shared_edges():
    """hist (2, 3, bins) gives (2, 3) thresholds, each that of its own row; 1-D edges are shared."""
    h, e = channel_stack(bins=200, per_family=1, seed=24)
    h6, e_shared = h.reshape(2, 3, 200), e[0]
    for fn in (lambda a, b: oc.kl_threshold(a, b, num_bits=5),
               lambda a, b: oc.mse_threshold(a, b, spec=NARROW_INT8, start_bin=20),
               lambda a, b: oc.percentile_range(a, b, percentile=99.5, symmetric=False)[0]):
        got = fn(h6, e_shared)
        assert got.shape == (2, 3)
        np.testing.assert_array_equal(got.reshape(-1), [float(fn(row, e_shared)) for row in h])
    curve = oc.kl_divergences(h6, e_shared, num_bits=5)
    assert curve.threshold.shape == curve.objective.shape == (2, 3, curve.index.shape[0])


def test_histogram_quantization_error_per_channel():
    rng = np.random.default_rng(12)
    hs, es = zip(*(np.histogram(sample(f, rng, 3000), bins=64) for f in FAMILIES))
    h, e = np.stack(hs), np.stack(es)
    scale = np.abs(e).max(axis=1) / 100
    zp = np.arange(6) - 3
    got = oc.histogram_quantization_error(h, e, scale, zp, quant_min=-128, quant_max=127)
    want = [quant_error_ref(h[c], e[c], scale[c], zp[c], quant_min=-128, quant_max=127) for c in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert float(oc.histogram_quantization_error(np.zeros(8), e[0][:9], 1.0, 0, quant_min=0, quant_max=255)) == 0.0


# ----------------------------------------------------------------------------------------------
# Edge cases: empty and degenerate histograms, dtypes, huge ranges
# ----------------------------------------------------------------------------------------------


def test_empty_histogram():
    h, e = np.zeros(256), np.linspace(0.0, 4.0, 257)
    curve = oc.kl_divergences(h, e)
    assert np.all(np.isinf(to_numpy(curve.objective)))
    assert float(oc.kl_threshold(h, e)) == 4.0  # every candidate ties: the last
    assert float(oc.kl_threshold(h, e, ties="first")) == e[128]
    assert float(oc.mse_threshold(h, e, spec=NARROW_INT8)) == (e[128] + e[129]) / 2  # all errors 0: the first
    assert float(oc.mse_threshold(h, e, spec=NARROW_INT8, ties="last")) == (e[255] + e[256]) / 2
    assert np.all(to_numpy(oc.mse_errors(h, e, spec=NARROW_INT8).objective) == 0)
    assert oc.percentile_range(h, e)[1] == 0.0
    lo, hi = oc.percentile_range(h, e, symmetric=False)
    assert (float(lo), float(hi)) == (4.0, 0.0)  # inverted: calculate_qparams falls back to scale 1
    assert float(oc.calculate_qparams(np.float32(lo), np.float32(hi), oc.quant_spec())[0][0]) == 1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_counts_give_nan(bad):
    h, e = np.ones((3, 256)), np.linspace(0.0, 1.0, 257)
    h[1, 7] = bad
    with pytest.raises(ValueError, match="finite counts"):  # checked by default (issue 11 item 13)
        oc.kl_threshold(h, e)
    # check=False (an observer's own histograms): the bad channel gives NaN, the others are unaffected
    with np.errstate(invalid="ignore"):  # numpy's own warnings for inf - inf
        results = (oc.kl_threshold(h, e, check=False), oc.kl_threshold(h, e, smoothing=1e-4, check=False),
                   oc.mse_threshold(h, e, spec=NARROW_INT8, check=False),
                   *oc.percentile_range(h, e, symmetric=False, check=False))
        err = oc.histogram_quantization_error(h, e, 0.01, 0, quant_min=0, quant_max=255, check=False)
    for got in results:
        got = to_numpy(got)
        assert np.isnan(got[1]) and np.all(np.isfinite(got[[0, 2]]))
    assert np.isnan(err[1]) and np.all(np.isfinite(err[[0, 2]]))


def test_zero_range_histogram():
    """All data exactly 0: every edge is 0, every threshold is 0."""
    h = np.zeros(256, dtype=np.int64)
    h[0] = 1000
    e = np.zeros(257)
    assert float(oc.kl_threshold(h, e)) == 0.0
    assert float(oc.mse_threshold(h, e, spec=NARROW_INT8)) == 0.0
    assert np.all(np.isfinite(to_numpy(oc.mse_errors(h, e, spec=NARROW_INT8).objective)))
    assert oc.percentile_range(h, e)[1] == 0.0


def test_single_nonempty_bin_and_tiny_histograms():
    h = np.zeros(300)
    h[150] = 7.0
    e = np.linspace(0, 3, 301)
    assert float(oc.kl_threshold(h, e)) == kl_threshold_ref(h, e, num_levels=128, start_bin=128)
    assert float(oc.percentile_range(h, e, percentile=100)[1]) == e[150]
    # The smallest histograms each search accepts.
    assert float(oc.kl_threshold(np.array([3.0]), np.array([0.0, 1.0]), num_bits=1)) == 1.0
    assert float(oc.mse_threshold(np.array([3.0]), np.array([0.0, 1.0]), spec=NARROW_INT8)) == 0.5
    assert float(oc.percentile_range(np.array([3.0]), np.array([0.0, 1.0]))[1]) == 0.0


@pytest.mark.parametrize("edge_dtype", ["float16", "float32", "float64", "int64"])
@pytest.mark.parametrize("count_dtype", ["int32", "int64", "float32", "float64"])
def test_input_dtypes(edge_dtype, count_dtype):
    rng = np.random.default_rng(3)
    h, _ = abs_histogram("normal", rng, 256)
    e = (np.arange(257) * (4 if edge_dtype == "int64" else 0.25)).astype(edge_dtype)  # uniform, exact in all
    h = h.astype(count_dtype)
    out_dtype = np.float64 if edge_dtype == "int64" else np.dtype(edge_dtype)
    for got in (oc.kl_threshold(h, e), oc.mse_threshold(h, e, spec=NARROW_INT8), oc.percentile_range(h, e)[1]):
        assert got.dtype == out_dtype
    e64 = e.astype(np.float64)
    assert float(oc.kl_threshold(h, e)) == kl_threshold_ref(h.astype(np.float64), e64, num_levels=128, start_bin=128)
    assert float(oc.percentile_range(h, e)[1]) == percentile_range_ref(h, e64, percentile=99.99)[1]
    ref = mse_errors_ref(h, e64, quant_min=-127, quant_max=127, symmetric=True, start_bin=128)
    vals = [v for *_, v in ref]
    assert float(oc.mse_threshold(h, e, spec=NARROW_INT8)) == ref[pick_ref(vals, tol=1e-9 * min(vals), ties="first")][1]


def test_bfloat16_edges_on_torch():
    import torch

    rng = np.random.default_rng(4)
    h, e = abs_histogram("laplace", rng, 256)
    eb = torch.as_tensor(e).to(torch.bfloat16)
    got = oc.kl_threshold(torch.as_tensor(h), eb)
    assert got.dtype == torch.bfloat16
    assert float(got) == kl_threshold_ref(h, eb.double().numpy(), num_levels=128, start_bin=128)


def test_huge_and_tiny_ranges():
    """The same bins at every scale: KL and percentile are scale free; MSE too while the candidate
    scales stay above torch's eps (1.2e-7), and its sums are normalised so 1e300 does not overflow."""
    rng = np.random.default_rng(5)
    h, unit = abs_histogram("normal", rng, 256)
    unit = unit / unit[-1]
    ref = mse_errors_ref(h, unit, quant_min=-127, quant_max=127, symmetric=True, start_bin=128)
    vals = [v for *_, v in ref]
    k_mse = ref[pick_ref(vals, tol=1e-9 * min(vals), ties="first")][0]
    k_kl = list(unit).index(kl_threshold_ref(h, unit, num_levels=128, start_bin=128))
    k_pct = list(unit).index(percentile_range_ref(h, unit, percentile=99.0)[1])
    for scale in (1e-30, 1e-3, 1.0, 1e30, 1e300):
        e = unit * scale
        assert float(oc.kl_threshold(h, e)) == e[k_kl]
        assert float(oc.percentile_range(h, e, percentile=99.0)[1]) == e[k_pct]
        if scale >= 1e-3:
            assert float(oc.mse_threshold(h, e, spec=NARROW_INT8)) == (e[k_mse] + e[k_mse + 1]) / 2
            with np.errstate(over="ignore"):
                objective = to_numpy(oc.mse_errors(h, e, spec=NARROW_INT8).objective)
            assert np.all(np.isfinite(objective)) == (scale < 1e150)  # squared data units overflow at 1e300


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

H, E = np.ones(256), np.linspace(0.0, 1.0, 257)


@pytest.mark.parametrize("percentile", [0, -1, 100.5, float("nan"), float("inf")])
def test_percentile_out_of_range(percentile):
    with pytest.raises(ValueError, match="percentile"):
        oc.percentile_range(H, E, percentile=percentile)


@pytest.mark.parametrize("percentile", [True, "99", None])
def test_percentile_type(percentile):
    with pytest.raises(TypeError, match="percentile"):
        oc.percentile_range(H, E, percentile=percentile)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(num_bits=0), ValueError, "num_bits"),
        (dict(num_bits=2.0), TypeError, "num_bits"),
        (dict(num_bits=10), ValueError, "bins"),  # 512 levels > 256 bins
        (dict(num_levels=0), ValueError, "num_levels"),
        (dict(num_levels=257), ValueError, "bins"),
        (dict(stride=0), ValueError, "stride"),
        (dict(stride=1.5), TypeError, "stride"),
        (dict(start_bin=0), ValueError, "start_bin"),
        (dict(start_bin=257), ValueError, "start_bin"),
        (dict(unsigned=1), TypeError, "unsigned"),
        (dict(smoothing=-1e-4), ValueError, "smoothing"),
        (dict(ties="middle"), ValueError, "ties"),
        (dict(tie_tol=-1.0), ValueError, "tie_tol"),
        (dict(flatten_first_bin=None), TypeError, "flatten_first_bin"),
    ],
)
def test_kl_validation(kwargs, error, name):
    with pytest.raises(error, match=name):
        oc.kl_threshold(H, E, **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(spec="qint8"), TypeError, "spec"),
        (dict(spec=NARROW_INT8, start_bin=256), ValueError, "start_bin"),
        (dict(spec=NARROW_INT8, start_bin=-1), ValueError, "start_bin"),
        (dict(spec=NARROW_INT8, stride=0), ValueError, "stride"),
        (dict(spec=NARROW_INT8, ties="any"), ValueError, "ties"),
    ],
)
def test_mse_validation(kwargs, error, name):
    with pytest.raises(error, match=name):
        oc.mse_threshold(H, E, **kwargs)


def test_histogram_validation():
    with pytest.raises(ValueError, match="edges"):
        oc.kl_threshold(H, E[:-1])
    with pytest.raises(ValueError, match="edges"):
        oc.percentile_range(np.ones((2, 256)), np.ones((3, 257)))
    with pytest.raises(ValueError, match="hist"):
        oc.percentile_range(np.ones(0), np.ones(1))
    with pytest.raises(TypeError, match="hist"):
        oc.kl_threshold(H.astype(np.complex128), E)
    with pytest.raises(TypeError, match="hist"):
        oc.kl_threshold(H > 0, E)
    with pytest.raises(ValueError, match="quant_min"):
        oc.histogram_quantization_error(H, E, 1.0, 0, quant_min=5, quant_max=4)


# ----------------------------------------------------------------------------------------------
# Every backend, per channel; jax.jit
# ----------------------------------------------------------------------------------------------


def channel_stack(bins=256, per_family=3, seed=21):
    """(18, bins) histograms of |x| over per-channel ranges, 3 per family."""
    rng = np.random.default_rng(seed)
    hs, es = zip(*(abs_histogram(f, rng, bins) for f in FAMILIES for _ in range(per_family)))
    return np.stack(hs), np.stack(es)


SEARCHES = {
    "kl": lambda h, e, xp=None: oc.kl_threshold(h, e, xp=xp),
    "kl_smooth": lambda h, e, xp=None: oc.kl_threshold(h, e, smoothing=1e-4, stride=3, xp=xp),
    "mse": lambda h, e, xp=None: oc.mse_threshold(h, e, spec=NARROW_INT8, stride=2, xp=xp),
    "mse_uint8": lambda h, e, xp=None: oc.mse_threshold(h, e, spec=oc.quant_spec("quint8"), xp=xp),
    "percentile": lambda h, e, xp=None: oc.percentile_range(h, e, percentile=99.937, xp=xp)[1],
    "percentile_2sided": lambda h, e, xp=None: oc.percentile_range(h, e, percentile=99.937, symmetric=False, xp=xp)[0],
}


def near_optimal(name, h, e, got, want) -> None:
    """For float32 arithmetic (JAX without x64): the pick is as good as numpy's on the float64 objective."""
    for c in range(h.shape[0]):
        if got[c] == pytest.approx(want[c], rel=1e-6):
            continue
        if name.startswith("kl"):
            smoothing = 1e-4 if name == "kl_smooth" else 0.0
            stride = 3 if name == "kl_smooth" else 1
            curve = dict(kl_divergences_ref(h[c], num_levels=128, start_bin=128, stride=stride, smoothing=smoothing))
            k_got = int(np.argmin(np.abs(e[c] - got[c])))
            assert curve[k_got] <= min(curve.values()) + 1e-4, (name, c)
        elif name.startswith("mse"):
            kw = MSE_SPECS["modelopt_uint8" if name == "mse_uint8" else "modelopt_int8"][1]
            stride = 2 if name == "mse" else 1
            ref = mse_errors_ref(h[c], e[c], start_bin=128, stride=stride, **kw)
            vals = {k: v for k, _, v in ref}
            k_got = int(np.argmin(np.abs((e[c][1:] + e[c][:-1]) / 2 - got[c])))
            assert vals[k_got] <= min(vals.values()) * (1 + 1e-4), (name, c)
        else:
            raise AssertionError((name, c, got[c], want[c]))


def on_backend(backend, fn):
    """``fn`` as the backend runs it: JAX under ``jax.jit`` (how the JAX adapter calls the core; eager
    JAX compiles each primitive for each new shape, minutes for these tests), the others eagerly."""
    if backend.name.startswith("jax"):
        import jax

        return jax.jit(fn)
    return fn


@pytest.mark.parametrize("name", list(SEARCHES))
def test_searches_on_every_backend(backend, name):
    h, e = channel_stack()
    e = e.astype(np.float32)  # every backend holds float32 edges, results in float32
    want = to_numpy(SEARCHES[name](h, e))
    run = on_backend(backend, functools.partial(SEARCHES[name], xp=backend.xp))
    got = to_numpy(run(backend.asarray(h), backend.asarray(e)))
    assert got.shape == (h.shape[0],)
    if backend.name.startswith("jax") and not _jax_x64():  # float32 arithmetic
        near_optimal(name, h, e.astype(np.float64), got.astype(np.float64), want)
    else:  # float64 arithmetic: the same bins as numpy
        np.testing.assert_array_equal(got, want)


def _jax_x64() -> bool:
    import jax

    return bool(jax.config.read("jax_enable_x64"))


@pytest.mark.parametrize("name", list(SEARCHES))
def test_searches_under_jax_jit_x64(name):
    """With x64 JAX computes in float64, under jit: exactly numpy's thresholds."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    h, e = channel_stack(seed=22)
    want = to_numpy(SEARCHES[name](h, e))
    with jax.enable_x64(True):
        got = jax.jit(SEARCHES[name])(jnp.asarray(h), jnp.asarray(e))
        assert got.dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(got), want)


def test_curves_on_every_backend(backend):
    h, e = channel_stack(bins=160, per_family=1, seed=23)
    for curve_fn in (
        functools.partial(oc.kl_divergences, num_bits=6, start_bin=40),
        functools.partial(oc.mse_errors, spec=NARROW_INT8, start_bin=3, stride=4),
    ):
        want = curve_fn(h, e)
        got = on_backend(backend, functools.partial(curve_fn, xp=backend.xp))(backend.asarray(h), backend.asarray(e))
        assert to_numpy(got.index).tolist() == to_numpy(want.index).tolist()
        g_t, w_t = to_numpy(got.threshold), to_numpy(want.threshold)
        np.testing.assert_allclose(g_t, w_t, rtol=0 if g_t.dtype == np.float64 else 2e-7)
        w, g = to_numpy(want.objective), to_numpy(got.objective)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))
        rtol = 1e-9 if g.dtype == np.float64 else 1e-3
        atol = 0.0 if g.dtype == np.float64 else 1e-5 * float(np.nanmax(np.where(np.isinf(w), np.nan, w)))
        np.testing.assert_allclose(g[np.isfinite(w)], w[np.isfinite(w)], rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------------------------
# Histogram state
# ----------------------------------------------------------------------------------------------


def np_histogram_of(state, values) -> np.ndarray:
    """np.histogram of the finite values on the state's own edges (float64; exact power-of-two grid)."""
    edges = to_numpy(oc.calib_histogram_edges(state)).astype(np.float64)
    values = np.asarray(values, dtype=np.float64)
    return np.histogram(values[np.isfinite(values)], bins=edges)[0]


def check_grid(state, values, bins, *, absolute=False) -> None:
    """lo a multiple of the power-of-two width; the canonical (smallest) width for the data range."""
    lo, width = float(to_numpy(state.lo)), float(to_numpy(state.width))
    vals = np.asarray(values, dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    assert width > 0 and math.frexp(width)[0] == 0.5 and lo / width == math.floor(lo / width)
    low, high = (0.0 if absolute else vals.min()), vals.max()
    assert lo <= low and high < lo + bins * width
    assert (float(to_numpy(state.min_val)), float(to_numpy(state.max_val))) == (low, high)
    half = width / 2  # the next smaller power of two does not cover the range (or breaks precision)
    fits = math.floor(high / half) - math.floor(low / half) < bins and half >= max(abs(low), abs(high)) * 2.0**-22
    assert not fits or half < 2.0**-126


@pytest.mark.parametrize("absolute", [False, True])
def test_histogram_state_counts_exactly(absolute):
    rng = np.random.default_rng(31)
    for trial in range(30):
        bins = int(rng.choice([2, 3, 16, 128, 2048]))
        state = oc.calib_histogram_init(bins=bins, xp=np)
        seen = []
        for step in range(int(rng.integers(1, 6))):
            x = sample(FAMILIES[(trial + step) % 6], rng, int(rng.integers(1, 3000))).astype(np.float32)
            x *= np.float32(10 ** rng.uniform(-4, 4))  # ranges grow and shrink between batches
            state = oc.calib_histogram_update(state, x, absolute=absolute)
            seen.append(np.abs(x) if absolute else x)
            values = np.concatenate(seen)
            np.testing.assert_array_equal(to_numpy(state.counts), np_histogram_of(state, values))
            check_grid(state, values, bins, absolute=absolute)
        if absolute:
            assert float(state.lo) == 0.0


def test_histogram_state_merge_is_exact_associative_commutative():
    rng = np.random.default_rng(32)
    for trial in range(20):
        bins = int(rng.choice([4, 64, 512]))
        init = oc.calib_histogram_init(bins=bins, num_channels=3, xp=np)
        batches = [sample(FAMILIES[(trial + k) % 6], rng, 300 * 3).reshape(300, 3) * 10 ** rng.uniform(-3, 3)
                   for k in range(3)]
        a, b, c = (oc.calib_histogram_update(init, x, axis=1) for x in batches)
        ab_c = oc.calib_histogram_merge(oc.calib_histogram_merge(a, b), c)
        a_bc = oc.calib_histogram_merge(a, oc.calib_histogram_merge(b, c))
        c_ab = oc.calib_histogram_merge(c, oc.calib_histogram_merge(b, a))
        sequential = init
        for x in batches:
            sequential = oc.calib_histogram_update(sequential, x, axis=1)
        for other in (a_bc, c_ab, sequential):
            for field, u, v in zip(oc.CalibHistogram._fields, ab_c, other):
                np.testing.assert_array_equal(u, v, err_msg=field)
        identity = oc.calib_histogram_merge(init, a)
        for u, v in zip(identity, a):
            np.testing.assert_array_equal(u, v)
        for ch in range(3):
            values = np.concatenate([x[:, ch] for x in batches]).astype(np.float32)
            channel = oc.CalibHistogram(*(f[ch] for f in ab_c))
            np.testing.assert_array_equal(channel.counts, np_histogram_of(channel, values))


def test_histogram_state_nonfinite_empty_and_degenerate():
    state = oc.calib_histogram_init(bins=16, xp=np)
    assert oc.calib_histogram_update(state, np.zeros((0, 3), np.float32)) is state
    s = oc.calib_histogram_update(state, np.array([np.nan, np.inf, -np.inf], np.float32))
    assert int(s.counts.sum()) == 0 and float(s.width) == 0.0 and float(s.min_val) == np.inf
    s = oc.calib_histogram_update(s, np.array([1.5, np.nan, -np.inf, 2.5], np.float32))
    assert int(s.counts.sum()) == 2
    np.testing.assert_array_equal(s.counts, np_histogram_of(s, [1.5, 2.5]))
    z = oc.calib_histogram_update(state, np.zeros(10, np.float32), absolute=True)
    assert int(z.counts[0]) == 10 and float(z.lo) == 0.0 and float(z.width) == 2.0**-126
    c = oc.calib_histogram_update(state, np.full(5, -3.25, np.float32))
    assert int(c.counts.sum()) == 5 and float(c.min_val) == float(c.max_val) == -3.25
    big = np.array([-3e38, 1e30, 3e38], np.float32)  # beyond +/-2**127: the grid is capped there
    hb = oc.calib_histogram_update(state, big)
    assert (float(hb.lo), float(hb.width)) == (-(2.0**127), 2.0**124) and (hb.min_val, hb.max_val) == tuple(big[[0, 2]])
    assert hb.counts[0] == 1 and hb.counts[8] == 1 and hb.counts[-1] == 1 and np.isfinite(oc.calib_histogram_edges(hb)).all()


@pytest.mark.parametrize("dtype", ["float16", "int32", "int8", "float64"])
def test_histogram_state_input_dtypes(dtype):
    rng = np.random.default_rng(33)
    x = (rng.standard_normal(500) * 50).astype(dtype)
    s = oc.calib_histogram_update(oc.calib_histogram_init(bins=64, xp=np), x)
    np.testing.assert_array_equal(s.counts, np_histogram_of(s, x.astype(np.float32)))


def test_histogram_state_bfloat16_on_torch():
    import torch

    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    import array_api_compat.torch as xpt

    s = oc.calib_histogram_update(oc.calib_histogram_init(bins=64, xp=xpt), x, absolute=True)
    np.testing.assert_array_equal(to_numpy(s.counts), np_histogram_of(s, x.abs().float().numpy()))


def test_histogram_state_validation():
    with pytest.raises(ValueError, match="bins"):
        oc.calib_histogram_init(bins=1, xp=np)
    with pytest.raises(TypeError, match="bins"):
        oc.calib_histogram_init(bins=8.0, xp=np)
    per_channel = oc.calib_histogram_init(bins=8, num_channels=3, xp=np)
    with pytest.raises(ValueError, match="axis"):
        oc.calib_histogram_update(per_channel, np.ones((2, 3)))
    with pytest.raises(ValueError, match="num_channels=2"):
        oc.calib_histogram_update(per_channel, np.ones((4, 2)), axis=1)
    with pytest.raises(ValueError, match="merge"):
        oc.calib_histogram_merge(per_channel, oc.calib_histogram_init(bins=8, xp=np))
    with pytest.raises(TypeError, match="absolute"):
        oc.calib_histogram_update(per_channel, np.ones((2, 3)), axis=1, absolute="yes")
    before = [a.copy() for a in per_channel]
    with pytest.raises(TypeError):
        oc.calib_histogram_update(per_channel, np.ones((2, 3), np.complex64), axis=1)
    for u, v in zip(before, per_channel):  # state untouched
        np.testing.assert_array_equal(u, v)


def test_histogram_state_on_every_backend(backend):
    """Updates and merges on every backend equal numpy's, counts and grid, per channel."""
    xp = backend.xp
    rng = np.random.default_rng(34)
    batches = [(sample(FAMILIES[k], rng, 4 * 200).reshape(200, 4) * 10 ** rng.uniform(-2, 2)).astype(np.float32)
               for k in range(4)]
    batches[1][3, 2] = np.nan
    for absolute in (False, True):
        update = on_backend(backend, functools.partial(oc.calib_histogram_update, axis=1, absolute=absolute, xp=xp))
        want = oc.calib_histogram_init(bins=128, num_channels=4, xp=np)
        got = oc.calib_histogram_init(bins=128, num_channels=4, device=backend.device, xp=xp)
        for x in batches:
            want = oc.calib_histogram_update(want, x, axis=1, absolute=absolute)
            got = update(got, backend.asarray(x))
        for field, u, v in zip(oc.CalibHistogram._fields, want, got):
            np.testing.assert_array_equal(to_numpy(v), u, err_msg=field)
        merged = on_backend(backend, functools.partial(oc.calib_histogram_merge, xp=xp))(got, got)
        np.testing.assert_array_equal(to_numpy(merged.counts), 2 * want.counts)
        edges = oc.calib_histogram_edges(got)
        # The searches take the state directly.
        if absolute:
            t = on_backend(backend, functools.partial(oc.kl_threshold, num_bits=4, start_bin=8, xp=xp))(got.counts, edges)
            np.testing.assert_array_equal(to_numpy(t), oc.kl_threshold(want.counts, oc.calib_histogram_edges(want),
                                                                       num_bits=4, start_bin=8))


def test_histogram_state_under_jax_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    update = jax.jit(functools.partial(oc.calib_histogram_update, axis=0, absolute=True))
    merge = jax.jit(oc.calib_histogram_merge)
    rng = np.random.default_rng(35)
    xs = [(rng.standard_normal((2, 500)) * 10 ** rng.uniform(-3, 3)).astype(np.float32) for _ in range(3)]
    state = oc.calib_histogram_init(bins=256, num_channels=2, xp=jnp)
    want = oc.calib_histogram_init(bins=256, num_channels=2, xp=np)
    for x in xs:
        state = update(state, jnp.asarray(x))
        want = oc.calib_histogram_update(want, x, axis=0, absolute=True)
    for u, v in zip(want, state):
        np.testing.assert_array_equal(np.asarray(v), u)
    doubled = merge(state, state)
    np.testing.assert_array_equal(np.asarray(doubled.counts), 2 * want.counts)
