"""The L2 search's compiled kernels (``observers_core/_l2_search.py``) against its array-API code.

NumPy arrays and torch CPU tensors run the search through numba kernels (per-candidate errors, the
float32 sum in torch's order, the end-bound step counts) and look at the first 32 candidates first; the
array-API code is the reference. Every kernel must give the same bits as the array-API path, on random and
adversarial inputs (the stop decision compares consecutive float32 errors). The search as a whole is
compared with torch's loop, kernels on and off, in ``test_histogram_core.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import array_api_compat.numpy as xnp
import array_api_compat.torch as xt
import observers_core as oc
from observers_core import _compiled
from observers_core import _l2_search as S
from test_histogram_core import _long_walks, _random_histogram

F32 = np.float32
HOSTS = [pytest.param(xnp, id="numpy"), pytest.param(xt, id="torch")]

pytestmark = pytest.mark.skipif(not _compiled.AVAILABLE, reason="numba is not installed")


@pytest.fixture(autouse=True)
def _inf_and_nan_on_purpose():
    """Overflows to inf and NaN are among the inputs on purpose."""
    with np.errstate(all="ignore"):
        yield


@pytest.fixture
def kernels_off(monkeypatch):
    monkeypatch.setattr(_compiled, "ENABLED", False)


def _as(xp, a):
    return torch.from_numpy(np.array(a)) if xp is xt else np.asarray(a)


def _assert_same_bits(got, expected, what):
    got, expected = np.asarray(got, dtype=F32), np.asarray(expected, dtype=F32)
    assert got.shape == expected.shape, what
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan), what
    assert np.array_equal(got[~nan].view(np.int32), expected[~nan].view(np.int32)), what


def _adversarial_histograms():
    """(hist, lo, hi): zeros, single spikes, huge counts (a total that overflows to inf), subnormal and
    near-float32-max ranges."""
    rng = np.random.default_rng(7)
    out = []
    for n in (1, 2, 3, 7, 8, 9, 31, 32, 33, 255, 256, 257, 1000, 2048, 4096):
        spike = np.zeros(n, F32)
        spike[int(rng.integers(0, n))] = 5
        out += [(np.zeros(n, F32), -1.0, 1.0), (spike, -2.0, 6.0), (spike * F32(6e37), -1.0, 1.0),
                (np.full(n, 3e38, F32), -1e-3, 1e-3), (rng.random(n).astype(F32) * 1e6, -4.6e-41, 4.6e-41),
                (rng.random(n).astype(F32), -3.4e38, 3.4e38), (rng.random(n).astype(F32), 3.0e38, 3.0e38 + 1e34),
                (rng.random(n).astype(F32) ** 8, 1e-45, 3e-45), (rng.random(n).astype(F32), 2.0, 2.0)]  # fmt: skip
    return [(h, F32(lo), F32(hi)) for h, lo, hi in out]


def _cases():
    rng = np.random.default_rng(11)
    cases = [_random_histogram(rng) for _ in range(60)] + _adversarial_histograms()
    return cases + [(h, lo, hi) for h, lo, hi, _ in _long_walks()]


def _pairs(rng, hist):
    """(starts, ends): the walk's first candidates, random pairs, the full range and single bins."""
    n = hist.shape[0]
    starts, ends, count = S._candidates(S._cumsum32(hist, xnp), S.sum32(hist, xnp), n, xnp)
    k = int(rng.integers(1, 24))
    s = rng.integers(0, n, k)
    e = np.minimum(n - 1, s + rng.integers(0, n, k))
    s = np.concatenate([starts[: min(int(count), 40)], s, [0, 0, n - 1]]).astype(np.int64)
    e = np.concatenate([ends[: min(int(count), 40)], e, [n - 1, 0, n - 1]]).astype(np.int64)
    return s, e


@pytest.mark.parametrize("xp", [HOSTS[0], pytest.param(xt, id="torch", marks=pytest.mark.slow)])  # torch: a long grid
def test_errors_kernel_matches_the_array_code(xp, kernels_off):
    rng = np.random.default_rng(3)
    for hist, lo, hi in _cases():
        starts, ends = _pairs(rng, hist)
        width = (np.float64(hi) - np.float64(lo)) / hist.shape[0]
        for dst_nbins in (1, 3, 16, 256, 2**32):
            got, _ = S._errors_compiled(hist, starts, ends, width, dst_nbins)
            expected = S._errors(_as(xp, hist), _as(xp, starts), _as(xp, ends), _as(xp, width), dst_nbins, xp)
            _assert_same_bits(got, expected.numpy() if xp is xt else expected, (hist.shape, lo, hi, dst_nbins))


def test_errors_kernel_stops_at_the_first_rise():
    """``first_rise`` is the first candidate whose error exceeds the previous one; with ``stop`` nothing
    after it is evaluated, and everything up to it is unchanged."""
    rng = np.random.default_rng(4)
    stopped = 0
    for hist, lo, hi in _cases():
        starts, ends = _pairs(rng, hist)
        width = (np.float64(hi) - np.float64(lo)) / hist.shape[0]
        full, rise = S._errors_compiled(hist, starts, ends, width, 256)
        rises = np.flatnonzero(full[1:] > full[:-1])
        assert rise == (rises[0] + 1 if rises.size else len(starts))
        part, rise_stop = S._errors_compiled(hist, starts, ends, width, 256, stop=True)
        assert rise_stop == rise
        _assert_same_bits(part[: rise + 1], full[: rise + 1], hist.shape)
        assert not part[rise + 1:].any()
        stopped += rise + 1 < len(starts)
    assert stopped > 20


def test_sum32_kernel_is_torch_sum():
    rng = np.random.default_rng(5)
    for n in [*range(1, 70), 127, 128, 129, 255, 256, 511, 512, 513, 1000, 2047, 2048, 2049, 4096, 5000, 32768]:
        for v in (rng.random(n).astype(F32), (rng.standard_cauchy(n) * 1e30).astype(F32),
                  rng.integers(0, 2**20, n).astype(F32) * F32(1e-3), np.full(n, 1e-45, F32)):  # fmt: skip
            got = _compiled.sum32_kernel(v, np.empty(n // 32 + 1, F32))
            _assert_same_bits(got, S.sum32(v, xnp), n)
            _assert_same_bits(got, torch.from_numpy(v).sum().numpy(), n)


@pytest.mark.parametrize("xp", HOSTS)
def test_cumsum32_kernel_matches_the_array_code(xp, monkeypatch):
    for hist, _, _ in _cases():
        monkeypatch.setattr(_compiled, "ENABLED", True)
        got = S._cumsum32(hist, xnp)
        monkeypatch.setattr(_compiled, "ENABLED", False)
        expected = S._cumsum32(_as(xp, hist), xp)
        _assert_same_bits(got, expected.numpy() if xp is xt else expected, hist.shape)


@pytest.mark.parametrize("xp", HOSTS)
def test_end_steps_kernel_matches_the_array_code(xp, monkeypatch):
    rng = np.random.default_rng(6)
    cases = [(h, S.sum32(h, xnp)) for h, _, _ in _cases()]
    cases += [(h, F32(t)) for h, _, _ in _cases()[:30] for t in (0.0, np.inf, np.nan, 1e-45, 3e38, -1.0)]
    for hist, total in cases:
        cs = S._cumsum32(hist, xnp)
        if rng.random() < 0.3:  # running sums off the total's scale
            cs = (cs * F32(rng.uniform(0.5, 2.0))).astype(F32)
        monkeypatch.setattr(_compiled, "ENABLED", True)
        got = S._end_steps(cs, np.asarray(total, F32), xnp)
        monkeypatch.setattr(_compiled, "ENABLED", False)
        expected = S._end_steps(_as(xp, cs), _as(xp, np.asarray(total, F32)), xp)
        np.testing.assert_array_equal(got, expected.numpy() if xp is xt else expected, err_msg=str(total))


@pytest.mark.parametrize("enabled", [True, False], ids=["kernels-on", "kernels-off"])
def test_first_candidates_are_a_prefix_of_all(enabled, monkeypatch):
    """``_candidates(limit=m)``: the first ``m`` candidates of the whole walk, and how many are real."""
    monkeypatch.setattr(_compiled, "ENABLED", enabled)
    for hist, _, _ in _cases():
        n = hist.shape[0]
        cs, total = S._cumsum32(hist, xnp), S.sum32(hist, xnp)
        starts, ends, count = S._candidates(cs, total, n, xnp)
        for m in sorted({1, 2, 5, 31, 32, 33, n // 2, n} & set(range(1, n + 1))):
            s, e, c = S._candidates(cs, total, n, xnp, limit=m)
            assert np.array_equal(s, starts[:m]) and np.array_equal(e, ends[:m]), (n, m)
            assert int(c) == min(int(count), m), (n, m)


def test_long_walks_go_past_the_first_candidates():
    """The long-walk cases of the search tests do reach the compiled search's second round."""
    for hist, lo, hi, dst_nbins in _long_walks():
        n = hist.shape[0]
        starts, ends, count = S._candidates(S._cumsum32(hist, xnp), S.sum32(hist, xnp), n, xnp)
        width = (np.float64(hi) - np.float64(lo)) / n
        _, rise = S._errors_compiled(hist, starts[: int(count)], ends[: int(count)], width, dst_nbins)
        assert rise > S._FIRST_CANDIDATES, (n, dst_nbins, rise)


@pytest.mark.parametrize("enabled", [True, False], ids=["kernels-on", "kernels-off"])
def test_torch_search_returns_cpu_float32_tensors(enabled, monkeypatch):
    monkeypatch.setattr(_compiled, "ENABLED", enabled)
    hist = torch.tensor([0.0, 3.0, 5.0, 1.0, 0.0, 2.0], requires_grad=enabled)
    before = hist.detach().clone()
    lo, hi = oc.non_linear_param_search(hist, torch.tensor(-1.0), torch.tensor(2.0), dst_nbins=256)
    for v in (lo, hi):
        assert isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.shape == () and v.device.type == "cpu"
    assert torch.equal(hist.detach(), before)


def _check_outcome(hist, lo, hi, **kwargs):
    """``None`` when :func:`check_histogram` accepts, else its message; no warning either way."""
    import warnings

    with warnings.catch_warnings(), np.errstate(all="warn"):
        warnings.simplefilter("error")
        try:
            S.check_histogram(hist, lo, hi, **kwargs)
        except ValueError as e:
            return str(e)
    return None


def test_host_check_equals_the_array_api_check():
    """NumPy histograms take the check in plain reductions (``_host_flags``; float32 first as uint32 bits,
    so -0.0, subnormals, NaN of either sign and float32's max are among the counts): the same accepted set and
    the same messages as the array-API check (on torch tensors of the same dtypes, the reference) on
    adversarial counts and bounds, with no floating-point warning (the fixture's errstate is lifted)."""
    counts = [[1.0, 2.0, 0.0], [0.0, -0.0, 3.0], [-0.0], [1.0, -1e-45, 2.0], [1.0, np.nan, 2.0], [np.inf, 1.0],
              [1.0, -np.inf], [3e38, 3e38], [np.nan, -1.0], [2.0, -np.nan], [1e-45, 0.0, 3.4028235e38], []]  # fmt: skip
    bounds = [(0.0, 1.0), (-1.0, -1.0), (2.0, 1.0), (np.nan, 1.0), (0.0, np.nan), (np.nan, np.nan), (-np.inf, 1.0),
              (0.0, np.inf), (-1e39, 1e39), (-0.0, 0.0), (1e-46, 2e-46), (3.4028235e38, 3.4028236e38)]  # fmt: skip
    dtypes = [np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_]
    seen = 0
    for c in counts:
        for dtype in dtypes:
            with np.errstate(all="ignore"):
                if dtype in (np.int64, np.uint8, np.bool_) and not np.all(np.abs(c) < 256):  # NaN fails too
                    continue
                hist = np.asarray(c, dtype=dtype)
            for lo, hi in bounds:
                for bound_dtype in (np.float32, np.float64, np.int32):
                    with np.errstate(all="ignore"):
                        if bound_dtype is np.int32 and not (abs(lo) < 2**31 and abs(hi) < 2**31):  # NaN fails too
                            continue
                        blo, bhi = np.asarray(lo, bound_dtype), np.asarray(hi, bound_dtype)
                    flags = S._host_flags(hist, blo, bhi)
                    assert flags is not None, (c, dtype, lo, hi, bound_dtype)
                    reference = tuple(torch.from_numpy(a.copy()) for a in (hist, blo, bhi))
                    expected = _check_outcome(*reference)
                    got = _check_outcome(hist, blo, bhi)
                    assert got == expected, (c, dtype, lo, hi, bound_dtype, got, expected)
                    got = _check_outcome(hist, bound_dtype(blo[()]), bound_dtype(bhi[()]))  # NumPy scalars
                    assert got == expected, (c, dtype, lo, hi, bound_dtype, "scalars")
                    seen += expected is None
    assert seen > 100  # accepted and rejected cases both occur


def test_host_check_leaves_other_inputs_to_the_array_api_check():
    """Non-NumPy arrays, non-real dtypes and bounds that are not 0-d go through the array-API check."""
    hist = np.ones(4, np.float32)
    assert S._host_flags(torch.ones(4), np.float32(0), np.float32(1)) is None
    assert S._host_flags(hist.astype(np.complex64), np.float32(0), np.float32(1)) is None
    assert S._host_flags(hist, np.zeros(1, np.float32), np.float32(1)) is None
    assert S._host_flags(hist, 0.0, 1.0) is None
    assert _check_outcome(torch.tensor([1.0, -1.0]), torch.tensor(0.0), torch.tensor(1.0)) is not None
    assert _check_outcome(torch.ones(2), torch.tensor(0.0), torch.tensor(1.0)) is None


def test_torch_search_checks_the_views_once(monkeypatch):
    """A torch CPU float32 state: the search takes NumPy views once (the check and the search share them)."""
    calls = []
    views = S.numpy_views
    monkeypatch.setattr(S, "numpy_views", lambda *a: calls.append(len(a)) or views(*a))
    hist = torch.tensor([0.0, 3.0, 5.0, 1.0, 0.0, 2.0])
    got = oc.non_linear_param_search(hist, torch.tensor(-1.0), torch.tensor(2.0), dst_nbins=256)
    assert len(calls) == 1
    calls.clear()  # float64 bounds: cast first, so views of the casts
    again = oc.non_linear_param_search(hist, torch.tensor(-1.0, dtype=torch.float64),
                                       torch.tensor(2.0, dtype=torch.float64), dst_nbins=256)  # fmt: skip
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(got, again))
    with pytest.raises(ValueError, match="counts"):
        oc.non_linear_param_search(torch.tensor([1.0, -1.0]), torch.tensor(0.0), torch.tensor(1.0), dst_nbins=256)
