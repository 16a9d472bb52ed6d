"""The MSE search in float32 arithmetic (JAX without x64): the exact int32 window sums by level
(``_squared_error_by_levels32``, one or two 16-bit limbs) against the bin-by-bin sum they replace and the
float64 search, on random and adversarial histograms (zeros, one bin, huge counts, non-integer counts,
NaN, few levels, ranges far from 0), and which branch runs when.

The float32 path runs on NumPy here too (``work_dtype`` patched to float32): the same array code, the
branch chosen on the host and observable; then under ``jax.jit`` (``lax.switch``) on JAX itself."""

from __future__ import annotations

import numpy as np
import pytest

import observers_core as oc
from observers_core import _calibration as cal

NARROW_INT8 = oc.quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)
SPECS = {
    "int8": NARROW_INT8,
    "uint8": oc.quant_spec("quint8"),
    "qint8_symmetric": oc.quant_spec("qint8", "per_tensor_symmetric"),
    "quint4x2": oc.quant_spec("quint4x2"),
}
FAMILIES = ("laplace", "normal", "uniform", "sparse", "outliers")


def run32(fn, limbs=None):
    """``(fn(), branches)``: ``fn()`` with NumPy computing in float32 and the float32 level sums forced
    to ``limbs`` (0 by bin, 1 or 2 limbs; None: as chosen); ``branches`` those that ran."""
    taken: list[int] = []
    window_sums, by_levels = cal._window_sums, cal._squared_error_by_levels32

    def spy_windows(prefix, top2, n, r, off, limbs_, xp):
        taken.append(limbs_)
        return window_sums(prefix, top2, n, r, off, limbs_, xp)

    def spy_levels(counts, edges, scale, levels, norm, dense, xp, limbs_=None, **blocks):
        def dense_spy():
            taken.append(0)
            return dense()

        return by_levels(counts, edges, scale, levels, norm, dense_spy, xp, limbs, **blocks)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cal, "work_dtype", lambda xp, device: xp.float32)
        mp.setattr(cal, "_window_sums", spy_windows)
        mp.setattr(cal, "_squared_error_by_levels32", spy_levels)
        out = fn()
    return out, sorted(set(taken))


def histogram(rng, bins, family="laplace", scale=1.0, n=None):
    n = int(rng.integers(20, 50000)) if n is None else n
    x = {"laplace": lambda: rng.laplace(size=n), "normal": lambda: rng.standard_normal(n),
         "uniform": lambda: rng.uniform(0, 1, n), "sparse": lambda: rng.choice(rng.standard_normal(5), n),
         "outliers": lambda: rng.standard_normal(n) * np.where(rng.random(n) < 0.001, 300.0, 1.0)}[family]()
    x = np.abs(x) * scale
    return np.histogram(x, bins=bins, range=(0.0, float(x.max()) or 1.0))


def close(got, want, rtol=1e-4):
    """Each candidate within ``rtol`` of the float64 error (plus ``rtol * 1e-3`` of the curve's largest)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    slack = rtol * (np.abs(want) + 1e-3 * np.max(np.abs(want), axis=-1, keepdims=True))
    assert np.all(np.abs(got - want) <= slack), np.max(np.abs(got - want) / np.maximum(slack, 1e-300) * rtol)


def good_pick(h, e, got, spec, start_bin=None, stride=1):
    """``got`` is a candidate whose float64 error is within 1e-4 of the least."""
    kw = dict(spec=spec, start_bin=start_bin, stride=stride)
    curve = oc.mse_errors(h, e, **kw)
    errs, thresholds = np.asarray(curve.objective), np.asarray(curve.threshold)
    k = np.nonzero(np.float32(thresholds) == np.float32(got))[0]
    assert k.size, got
    assert errs[k].min() <= errs.min() * (1 + 1e-4) + 1e-300


@pytest.mark.parametrize("family", FAMILIES)
def test_level_sums32_match_float64_and_by_bin(family):
    rng = np.random.default_rng(FAMILIES.index(family))
    for trial in range(10):
        bins = int(rng.choice([128, 300, 1024, 2048]))
        spec = SPECS[list(SPECS)[trial % len(SPECS)]]
        h, e = histogram(rng, bins, family, 10 ** rng.uniform(-3, 3))
        kw = dict(spec=spec, start_bin=int(rng.integers(0, bins // 2)), stride=int(rng.choice([1, 3])))
        want = np.asarray(oc.mse_errors(h, e, **kw).objective)  # float64
        auto, branches = run32(lambda: np.asarray(oc.mse_errors(h, e, **kw).objective))
        close(auto, want)
        for limbs in (0, 1, 2):  # every branch that applies gives the same curve
            if limbs == 0 or limbs in branches or (limbs == 2 and branches == [1]):
                close(run32(lambda: oc.mse_errors(h, e, **kw).objective, limbs)[0], want)
        levels = spec.quant_max - cal.mse_window(spec)[0] + 1
        if levels <= bins and (spec is not SPECS["quint4x2"] or bins <= 300):
            assert branches in ([1], [2]), (family, trial, bins, branches)  # windows of <= 46 bins: by level
        got, _ = run32(lambda: float(oc.mse_threshold(h, e, **kw)))
        good_pick(h, e, got, **kw)


def test_level_sums32_branch_choice():
    rng = np.random.default_rng(5)
    h, e = histogram(rng, 2048, n=100_000)
    assert run32(lambda: oc.mse_errors(h, e, spec=NARROW_INT8))[1] == [1]  # N (L - 1)**2 <= 2**30: one limb
    big = h * 4096  # N = 4e8: two limbs
    assert run32(lambda: oc.mse_errors(big, e, spec=NARROW_INT8))[1] == [2]
    close(run32(lambda: oc.mse_errors(big, e, spec=NARROW_INT8).objective)[0],
          oc.mse_errors(big, e, spec=NARROW_INT8).objective)
    huge = h.astype(np.float64) * 2.0**30  # counts beyond int32: by bin
    assert run32(lambda: oc.mse_errors(huge, e, spec=NARROW_INT8))[1] == [0]
    half = h + 0.5  # non-integer counts: by bin
    assert run32(lambda: oc.mse_errors(half, e, spec=NARROW_INT8))[1] == [0]
    # 16 levels over 2048 bins: windows of up to 138 bins, beyond two limbs: by bin
    assert run32(lambda: oc.mse_errors(h, e, spec=SPECS["quint4x2"]))[1] == [0]
    # edges from -1000 w (signed data): level 0 takes the first 1000 bins, beyond two limbs: by bin
    for shift, branch in ((-1000, 0), (-3, 1), (3, 1), (1000, 1)):  # from 1000 w: the low levels hold no bin
        shifted = e + shift * (e[1] - e[0])
        assert run32(lambda: oc.mse_errors(h, shifted, spec=NARROW_INT8))[1] == [branch], shift
        close(run32(lambda: oc.mse_errors(h, shifted, spec=NARROW_INT8).objective)[0],
              oc.mse_errors(h, shifted, spec=NARROW_INT8).objective)


@pytest.mark.parametrize("case", ["zeros", "one_bin_low", "one_bin_mid", "one_bin_top", "two_bins", "max_int32",
                                  "sparse_huge", "int32_counts", "uint8_counts", "float32_counts"])
def test_level_sums32_adversarial(case):
    bins = 512
    e = np.linspace(0.0, 3.0, bins + 1)
    h = np.zeros(bins, np.int64)
    if case == "one_bin_low":
        h[0] = 7
    elif case == "one_bin_mid":
        h[200] = 123_456_789
    elif case == "one_bin_top":
        h[-1] = 1
    elif case == "two_bins":
        h[[3, 400]] = [2**31 - 128, 1]
    elif case == "max_int32":
        h[:] = 2**31 - 128  # every count at int32's limit (the largest float32 below 2**31): two limbs
    elif case == "sparse_huge":
        h[::37] = np.arange(1, h[::37].size + 1) * 99_999_989
    elif case in ("int32_counts", "uint8_counts", "float32_counts"):
        rng = np.random.default_rng(9)
        h = rng.integers(0, 200, bins)
        h = h.astype({"int32_counts": np.int32, "uint8_counts": np.uint8, "float32_counts": np.float32}[case])
    for spec in (NARROW_INT8, SPECS["uint8"]):
        want = oc.mse_errors(h, e, spec=spec).objective
        got, branches = run32(lambda: oc.mse_errors(h, e, spec=spec).objective)
        assert branches in ([1], [2]), (case, branches)
        close(got, want)
        close(run32(lambda: oc.mse_errors(h, e, spec=spec).objective, 0)[0], want)
        t32, _ = run32(lambda: float(oc.mse_threshold(h, e, spec=spec)))
        if case == "zeros":  # every candidate ties at 0: the first, as in float64
            assert t32 == float(oc.mse_threshold(h, e, spec=spec))
        else:
            good_pick(h, e, t32, spec)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_level_sums32_invalid_counts(bad):
    """NaN or Inf counts (check=False): NaN thresholds as before, by bin; negative counts are refused."""
    h = np.arange(256, dtype=np.float64)
    h[17] = bad
    e = np.linspace(0.0, 1.0, 257)
    with pytest.raises(ValueError, match="counts"):
        run32(lambda: oc.mse_threshold(h, e, spec=NARROW_INT8))
    if bad > 0 or np.isnan(bad):
        got, branches = run32(lambda: oc.mse_threshold(h, e, spec=NARROW_INT8, check=False))
        assert np.isnan(float(got)) and branches == [0]


def test_level_sums32_per_channel_and_one_level():
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(11)
    hs, es = zip(*(histogram(rng, 256, f) for f in FAMILIES))
    h, e = np.stack(hs), np.stack(es)
    want = oc.mse_errors(h, e, spec=NARROW_INT8).objective
    got, branches = run32(lambda: oc.mse_errors(h, e, spec=NARROW_INT8).objective)
    assert branches == [1]
    close(got, want)
    # a single level (no public spec has one): the top level's suffix sums alone, as by bin
    counts, edges = h.astype(np.float32), e.astype(np.float32)
    scale = np.float32(np.linspace(0.01, 1.0, 40))[None, :].repeat(5, 0) * edges[:, -1:]
    norm = cal.error_norm(edges, xp)
    centers = cal.bin_centers(edges, xp)
    by_bin = cal._squared_error(counts, centers, scale, np.zeros_like(scale), (0, 0), norm, xp)
    close(cal._squared_error_by_levels32(counts, edges, scale, 1, norm, None, xp), by_bin, 1e-5)


@pytest.mark.slow  # minutes of jit compiling
def test_level_sums32_under_jax_jit():
    """JAX without x64, jitted: lax.switch picks the branch on the device; the same curves."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(12)
    h, e = histogram(rng, 2048, n=999_983)
    cases = {"one limb": h, "two limbs": h * 4096, "by bin": h + 0.25}
    with jax.enable_x64(False):
        for name, counts in cases.items():
            for spec in (NARROW_INT8, SPECS["uint8"]):
                curve = jax.jit(lambda a, b: oc.mse_errors(a, b, spec=spec, xp=jnp).objective)
                pick = jax.jit(lambda a, b: oc.mse_threshold(a, b, spec=spec, xp=jnp))
                c32 = counts.astype(np.float32) if name == "by bin" else counts.astype(np.int32)
                got = np.asarray(curve(jnp.asarray(c32), jnp.asarray(e, jnp.float32)))
                want = np.asarray(oc.mse_errors(counts, e.astype(np.float32), spec=spec).objective)
                close(got, want)
                good_pick(counts, e.astype(np.float32), float(pick(jnp.asarray(c32), jnp.asarray(e, jnp.float32))), spec)


@pytest.mark.parametrize("backend", ["numpy float64", "numpy float32", pytest.param("jax", marks=pytest.mark.slow)])
def test_level_sums_in_candidate_blocks_equal_one_call(backend, monkeypatch):
    """Where one channel's level sums would hold more than ``_LEVEL_SUM_ELEMENTS`` elements the candidates
    run in blocks (JAX: ``lax.map``; others: a loop), with the bin width and the float32 branch of all
    candidates: every candidate's error is the one a single call gives, bit for bit. The bound is lowered
    here so that 2048 bins of int8 need ~50 blocks (int16's 32768 levels need them for real: next test)."""
    rng = np.random.default_rng(21)
    counts = np.stack([histogram(rng, 2048, f)[0] for f in ("laplace", "outliers", "sparse")])
    edges = np.stack([histogram(rng, 2048, f)[1] for f in ("laplace", "outliers", "sparse")]) * [[1.0], [3.0], [0.5]]
    cases = [(counts, NARROW_INT8), (counts * 4096, SPECS["uint8"]), (counts + 0.25, NARROW_INT8)]  # 1, 2 limbs, by bin
    if backend == "jax":
        jax = pytest.importorskip("jax")
        import jax.numpy as jnp

        def curve(c, e, spec):
            with jax.enable_x64(False):
                c = c.astype(np.float32 if np.any(c % 1) else np.int32)
                fn = jax.jit(lambda a, b: oc.mse_errors(a, b, spec=spec, xp=jnp).objective)
                return np.asarray(fn(jnp.asarray(c), jnp.asarray(e, jnp.float32)))
    elif backend == "numpy float32":
        def curve(c, e, spec):
            return np.asarray(run32(lambda: oc.mse_errors(c.astype(np.float32), e.astype(np.float32), spec=spec))[0].objective)
    else:
        monkeypatch.setattr(cal, "_mse_host", lambda *args: None)  # the array code (the host kernel does not block)

        def curve(c, e, spec):
            return np.asarray(oc.mse_errors(c, e, spec=spec).objective)

    calls = []
    blocks = cal._candidate_blocks

    def counted(fn, scale, zero_point, per_candidate, xp, budget):
        calls.append(budget)
        return blocks(fn, scale, zero_point, per_candidate, xp, budget)

    monkeypatch.setattr(cal, "_candidate_blocks", counted)
    for c, spec in cases:
        whole = curve(c, edges, spec)
        monkeypatch.setattr(cal, "_LEVEL_SUM_ELEMENTS", 40 * 256 * 6)  # 40 candidates of 256 levels a block
        blocked = curve(c, edges, spec)
        monkeypatch.setattr(cal, "_LEVEL_SUM_ELEMENTS", 1 << 25)
        assert blocked.shape == whole.shape == (3, 2048 - 128)
        np.testing.assert_array_equal(blocked, whole)
    assert 40 * 256 * 6 in calls


@pytest.mark.slow  # a large jitted search
def test_jax_int16_mse_runs_in_bounded_memory():
    """JAX MSE/Mix observers of qint16 (32768 levels, 32768 bins, ~32k candidates) ran out of memory (38 GB
    of level sums at once); in candidate blocks they run and equal NumPy's (its host kernel)."""
    jax_observers = pytest.importorskip("observers_core.adapters.jax")
    from observers_core.adapters import _array_calibration as generic

    x = (np.random.default_rng(3).standard_normal((16, 8)) * 3).astype(np.float32)
    kwargs = dict(dtype="qint16", bins=32768)
    ours, numpy_obs = jax_observers.MSEObserver(**kwargs), generic.MSEObserver(**kwargs)
    ours(x)
    numpy_obs(x)
    for a, b in zip(ours.state, numpy_obs.state):
        np.testing.assert_array_equal(np.asarray(a), b)
