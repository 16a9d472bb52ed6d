"""``HistogramObserver`` adapters (torch drop-in, numpy, JAX, CuPy) against torch 2.13's ``HistogramObserver``.

The oracle is always the installed ``torch.ao.quantization.observer.HistogramObserver`` fed the same
batches: ``histogram``, ``min_val``, ``max_val`` and ``calculate_qparams()`` must be equal after every batch
(bit for bit for the torch adapter). Where ours deliberately differs (NaN, non-float32 inputs, subnormals
flushed by XLA), the oracle is torch fed what ours is documented to see (finite values, ``x.float()``,
flushed values). Most cases use few bins: torch's own search loop is slow for 2048 bins.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.ao import quantization as tq  # noqa: E402
from torch.ao.quantization import observer as tobs  # noqa: E402

from observers_core import HistogramState  # noqa: E402
from observers_core.adapters import _array_histogram as aobs  # noqa: E402
from observers_core.adapters import torch as ours  # noqa: E402

from _torch_histogram_reference import torch_qparams as reference_qparams  # noqa: E402
from conftest import TraceDelta, to_numpy  # noqa: E402
from test_torch_parity import assert_bitwise_equal, one_torch_thread  # noqa: E402,F401

F32 = np.float32
TINY = np.finfo(F32).tiny


# ------------------------------------------------------------------------------------------------
# batch sequences and configurations


def make_sequence(kind: str, seed: int) -> list[np.ndarray]:
    """Float32 batches (various shapes) exercising one behaviour of ``forward``."""
    rng = np.random.default_rng(seed)
    n = lambda: int(rng.choice([1, 3, 40, 600, 3000]))  # noqa: E731
    if kind == "growing":
        return [(rng.normal(size=n()) * 1.9**i + 0.5 * i).astype(F32) for i in range(5)]
    if kind == "shrinking":
        return [(rng.normal(size=(20, 30)) / 1.9**i).astype(F32) for i in range(5)]
    if kind == "equal":  # the same range every batch: histograms just add up
        x = rng.normal(size=(8, 125)).astype(F32)
        x[0, 0], x[0, 1] = -3.5, 3.5
        return [x, np.clip(rng.normal(size=700), -3.5, 3.5).astype(F32), x[::-1].copy(), np.array([-3.5, 3.5], F32)]
    if kind == "constant":
        c = F32(rng.normal() * 10)
        return [np.full((3, 4), c), np.full(7, c), np.full(3, c + F32(1)), np.full(5, c - F32(2)), np.full(4, c)]
    if kind == "single":
        return [np.array([rng.normal() * 3], F32).reshape(()) if i % 2 else np.array([rng.normal()], F32)
                for i in range(6)]  # fmt: skip
    if kind == "one_sided":
        return [np.abs(rng.normal(size=(2, 3, n())) * (i + 1)).astype(F32) for i in range(4)] + [np.zeros(3, F32)]
    if kind == "negative":
        return [-np.abs(rng.laplace(size=n()) * (i + 1)).astype(F32) - F32(2) for i in range(4)]
    if kind == "outliers":
        return [np.concatenate([rng.normal(size=n()), [rng.normal() * 10**i]]).astype(F32) for i in range(1, 5)]
    if kind == "subnormal":  # ranges of ~4.6e-41: bins of a few ulps of the smallest subnormal
        return [(rng.normal(size=n()) * 4.6e-41 * (1 + i)).astype(F32) for i in range(3)]
    if kind == "near_max":  # values near float32 max, with a spread whose (x - lo) * bins stays finite
        base = F32(3.2e38)
        return [(base + F32(1e31) * rng.integers(-50, 50, size=n()).astype(F32)).astype(F32) for _ in range(3)]
    if kind == "near_min":
        return [(-F32(3.3e38) + F32(1e32) * rng.integers(-20, 20, size=n()).astype(F32)).astype(F32) for _ in range(3)]
    raise AssertionError(kind)


KINDS = ["growing", "shrinking", "equal", "constant", "single", "one_sided", "negative", "outliers", "subnormal",
         "near_max", "near_min"]  # fmt: skip

# torch keyword arguments; the same keywords build ours (torch dtypes and qschemes are accepted)
CONFIGS = [
    {},
    {"dtype": torch.qint8, "qscheme": torch.per_tensor_symmetric},
    {"reduce_range": True},
    {"dtype": torch.qint8, "quant_min": -20, "quant_max": 30},
    {"qscheme": torch.per_tensor_symmetric},
    {"dtype": torch.qint8, "qscheme": torch.per_tensor_symmetric, "reduce_range": False, "eps": 2**-12},
    {"quant_min": 0, "quant_max": 127},
    {"dtype": torch.quint4x2},
    {"dtype": torch.int16, "qscheme": torch.per_tensor_symmetric},
    {"dtype": torch.qint32},
    {"dtype": torch.uint8, "reduce_range": True},
]


def parity_cases():
    """Each kind with two configurations; bins mostly small, two kinds at torch's default 2048."""
    cases = []
    for i, kind in enumerate(KINDS):
        for j in range(2):
            config = CONFIGS[(2 * i + j) % len(CONFIGS)]
            bins = 2048 if (kind, j) in (("growing", 0), ("outliers", 1)) else (3, 64, 257)[(i + j) % 3]
            cases.append(pytest.param(kind, bins, config, id=f"{kind}-{bins}-{(2 * i + j) % len(CONFIGS)}"))
    return cases


def make_pair(bins: int, config: dict, upsample_rate: int = 16):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tobs.HistogramObserver(bins=bins, **config)
        mine = ours.HistogramObserver(bins=bins, upsample_rate=upsample_rate, **config)
    theirs.upsample_rate = upsample_rate  # torch honours the attribute (its constructor sets 16)
    return theirs, mine


def torch_qparams(obs):
    """torch's ``obs.calculate_qparams()``, its search loop reading the running sums from numpy (the
    same values, 100x faster; see ``_torch_histogram_reference``), as tensors."""
    scale, zero_point = reference_qparams(obs)
    return torch.from_numpy(scale), torch.from_numpy(zero_point)


def assert_same_state(theirs, mine, where: str) -> None:
    for name in ("histogram", "min_val", "max_val"):
        assert_bitwise_equal(getattr(theirs, name), getattr(mine, name), f"{where}: {name}")


def assert_same_qparams(expected, actual, where: str) -> None:
    assert_bitwise_equal(expected[0], actual[0], f"{where}: scale")
    assert_bitwise_equal(expected[1], actual[1], f"{where}: zero_point")


# ------------------------------------------------------------------------------------------------
# torch adapter == torch.ao, batch by batch


@pytest.mark.parametrize("kind, bins, config", parity_cases())
def test_torch_adapter_matches_torch_batch_by_batch(kind, bins, config):
    theirs, mine = make_pair(bins, config)
    for i, x in enumerate(make_sequence(kind, seed=KINDS.index(kind) + bins)):
        theirs(torch.from_numpy(x))
        tx = torch.from_numpy(x)
        assert mine(tx) is tx
        assert_same_state(theirs, mine, f"{kind} batch {i}")
        assert_same_qparams(torch_qparams(theirs), mine.calculate_qparams(), f"{kind} batch {i}")


@pytest.mark.parametrize("upsample_rate", [1, 3, 64])
def test_torch_adapter_honours_upsample_rate(upsample_rate):
    theirs, mine = make_pair(100, {}, upsample_rate)
    assert mine.upsample_rate == upsample_rate
    for i, x in enumerate(make_sequence("growing", seed=upsample_rate)):
        theirs(torch.from_numpy(x))
        mine(torch.from_numpy(x))
        assert_same_state(theirs, mine, f"batch {i}")
    # changing the attribute afterwards is honoured too, as in torch
    theirs.upsample_rate = mine.upsample_rate = 5
    x = torch.from_numpy(make_sequence("growing", seed=99)[-1] * F32(3))
    theirs(x)
    mine(x)
    assert_same_state(theirs, mine, "after changing upsample_rate")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.uint8])
def test_torch_adapter_bins_other_dtypes_in_float32(dtype):
    """Every real dtype is binned in float32: the oracle is torch fed ``x.float()`` (torch bins float64
    and float16 in their own precision and rejects integers in ``histc``)."""
    rng = np.random.default_rng(5)
    theirs, mine = make_pair(64, {"dtype": torch.qint8})
    for i in range(3):
        values = np.round(rng.normal(size=(10, 30)) * 30 * (i + 1))
        x = torch.from_numpy(np.abs(values) if dtype == torch.uint8 else values).to(dtype)
        theirs(x.float())
        mine(x)
        assert_same_state(theirs, mine, f"{dtype} batch {i}")
        assert_same_qparams(torch_qparams(theirs), mine.calculate_qparams(), f"{dtype} batch {i}")


def test_torch_adapter_2048_bins_untouched_torch_search_and_float64_buffers():
    """torch's calculate_qparams as it is (no fast running sums) at 2048 bins; float64 buffers
    (factory_kwargs) hold the same statistics as torch's float64 buffers, and the qparams are computed
    in float32: those of a float32 observer (torch computes them in the buffer dtype)."""
    theirs, mine = make_pair(2048, {})
    theirs64, mine64 = make_pair(2048, {"factory_kwargs": {"dtype": torch.float64}})
    assert mine64.histogram.dtype == mine64.min_val.dtype == torch.float64
    for i, x in enumerate(make_sequence("equal", seed=3)):
        for obs in (theirs, mine, theirs64, mine64):
            obs(torch.from_numpy(x))
        assert_same_state(theirs, mine, f"batch {i}")
        assert_same_state(theirs64, mine64, f"float64 buffers, batch {i}")
        assert_same_qparams(theirs.calculate_qparams(), mine.calculate_qparams(), f"batch {i}")
        assert_same_qparams(theirs.calculate_qparams(), mine64.calculate_qparams(), f"float64 buffers, batch {i}")


# ------------------------------------------------------------------------------------------------
# special values, empty input, warnings


def test_inf_is_dropped_with_torchs_warning():
    rng = np.random.default_rng(11)
    batches = [rng.normal(size=100).astype(F32), np.array([np.inf, -np.inf], F32),
               np.concatenate([rng.normal(size=50) * 3, [np.inf, -np.inf]]).astype(F32),
               np.array([-np.inf, 1.0, 2.0], F32)]  # fmt: skip
    theirs, mine = make_pair(32, {})
    for i, x in enumerate(batches):
        has_inf = bool(np.isinf(x).any())
        with warnings.catch_warnings(record=True) as got_t:
            warnings.simplefilter("always")
            theirs(torch.from_numpy(x))
        with warnings.catch_warnings(record=True) as got_o:
            warnings.simplefilter("always")
            mine(torch.from_numpy(x))
        assert [str(w.message) for w in got_o] == [str(w.message) for w in got_t], i
        assert len(got_o) == has_inf and (not has_inf or "torch.inf detected" in str(got_o[0].message))
        assert_same_state(theirs, mine, f"batch {i}")
    assert_same_qparams(torch_qparams(theirs), mine.calculate_qparams(), "after inf")


def test_empty_input_changes_nothing():
    theirs, mine = make_pair(16, {})
    for obs in (theirs, mine):
        obs(torch.zeros(0))
        obs(torch.tensor([1.0, 2.0, 5.0]))
        obs(torch.zeros(3, 0))
    assert_same_state(theirs, mine, "empty")
    assert mine.histogram.sum() == 3


def test_uninitialised_calculate_qparams_warns_and_returns_defaults():
    theirs, mine = make_pair(16, {})
    with pytest.warns(UserWarning, match="must run observer before calling calculate_qparams") as rec:
        got = mine.calculate_qparams()
    assert len(rec) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = theirs.calculate_qparams()
    assert_bitwise_equal(expected[0], got[0], "scale")
    assert torch.equal(expected[1], got[1])


def test_nan_poisons_the_state_with_a_warning_and_ignore_nonfinite_skips_it():
    """NaN (default): torch raises in histc; ours (every backend) keeps the histogram, sets min/max to
    NaN for good and gives a NaN scale, with a warning on torch. ``ignore_nonfinite=True``: NaN and inf
    are skipped silently: the oracle is torch fed the finite values."""
    rng = np.random.default_rng(12)
    x0 = rng.normal(size=100).astype(F32)
    x1 = np.concatenate([rng.normal(size=40) * 4, [np.nan, np.inf, -np.inf]]).astype(F32)
    x2 = (rng.normal(size=30) * 9).astype(F32)
    theirs, mine = make_pair(16, {})
    theirs(torch.from_numpy(x0))
    with pytest.raises(RuntimeError):
        theirs(torch.from_numpy(x1))
    mine(torch.from_numpy(x0))
    hist = mine.histogram.clone()
    with pytest.warns(UserWarning, match="NaN detected"):
        mine(torch.from_numpy(x1))
    mine(torch.from_numpy(x2))
    assert torch.isnan(mine.min_val) and torch.isnan(mine.max_val)
    assert torch.equal(mine.histogram, hist)
    with pytest.warns(UserWarning, match="NaN"):
        scale, _ = mine.calculate_qparams()
    assert torch.isnan(scale).all()
    # the numpy and JAX observers end in the same state
    np_obs = aobs.HistogramObserver(bins=16)
    for x in (x0, x1, x2):
        np_obs(x)
    np.testing.assert_array_equal(to_numpy(np_obs.histogram), hist.numpy())
    assert np.isnan(to_numpy(np_obs.min_val)) and np.isnan(to_numpy(np_obs.max_val))
    with np.errstate(invalid="ignore", over="ignore"):  # numpy's note on the NaN scale's zero point
        assert np.isnan(to_numpy(np_obs.calculate_qparams().scale)).all()
    pytest.importorskip("jax")
    from observers_core.adapters import jax as jobs

    # JAX, with the bins and input shape of the JAX parity cases (one compiled update)
    jax_obs, np_obs = jobs.HistogramObserver(bins=64), aobs.HistogramObserver(bins=64)
    for x in (x0, x1, x2):
        jax_obs(np.resize(x, 50))
        np_obs(np.resize(x, 50))
    assert np.isnan(to_numpy(jax_obs.min_val)) and np.isnan(to_numpy(jax_obs.max_val))
    assert np.any(to_numpy(np_obs.histogram))
    np.testing.assert_array_equal(to_numpy(jax_obs.histogram), to_numpy(np_obs.histogram))

    finite, skipping = make_pair(16, {})
    skipping.ignore_nonfinite = True
    for x in (x0, x1, x2):
        finite(torch.from_numpy(x[np.isfinite(x)]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning at all
            skipping(torch.from_numpy(x))
    assert_same_state(finite, skipping, "ignore_nonfinite")
    assert_same_qparams(torch_qparams(finite), skipping.calculate_qparams(), "ignore_nonfinite")


def test_first_batch_of_only_nan_and_inf():
    theirs, mine = make_pair(8, {})
    with pytest.warns(UserWarning, match="torch.inf detected"):
        theirs(torch.tensor([np.inf, -np.inf]))
    with pytest.warns(UserWarning, match="torch.inf detected"):
        mine(torch.tensor([np.inf, -np.inf]))
    assert_same_state(theirs, mine, "all inf")
    skipping = ours.HistogramObserver(bins=8, ignore_nonfinite=True)
    skipping(torch.tensor([np.nan, np.inf]))
    assert_same_state(theirs, skipping, "all non-finite, skipped")


# ------------------------------------------------------------------------------------------------
# configuration and input errors


def test_bad_configuration_raises_naming_the_argument():
    for bins, err in ((0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(err, match="bins"):
            ours.HistogramObserver(bins=bins)
        with pytest.raises(err, match="bins"):
            aobs.HistogramObserver(bins=bins)
    for rate, err in ((0, ValueError), (-2, ValueError), (1.5, TypeError)):
        with pytest.raises(err, match="upsample_rate"):
            ours.HistogramObserver(upsample_rate=rate)
        with pytest.raises(err, match="upsample_rate"):
            aobs.HistogramObserver(upsample_rate=rate)
    for qscheme in (torch.per_channel_affine, torch.per_channel_symmetric, torch.per_channel_affine_float_qparams):
        with pytest.raises(ValueError, match="qscheme") as info:
            ours.HistogramObserver(qscheme=qscheme)
        assert isinstance(info.value, NotImplementedError)  # what torch raises
        with pytest.raises(NotImplementedError):
            tobs.HistogramObserver(qscheme=qscheme)
        with pytest.raises(ValueError, match="qscheme"):
            aobs.HistogramObserver(qscheme=str(qscheme).removeprefix("torch."))
    with pytest.raises(ValueError, match="is_dynamic") as info:
        ours.HistogramObserver(is_dynamic=True)
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(ValueError, match="is_dynamic"):
        aobs.HistogramObserver(is_dynamic=True)
    for dtype in (torch.float8_e4m3fn, "float8_e5m2"):
        with pytest.raises(ValueError, match="dtype"):
            ours.HistogramObserver(dtype=dtype)
    with pytest.raises(ValueError, match="dtype"):
        aobs.HistogramObserver(dtype="float8_e4m3fn")
    with pytest.raises(TypeError, match="ignore_nonfinite"):
        ours.HistogramObserver(ignore_nonfinite=1)
    with warnings.catch_warnings():  # torch 2.13's HistogramObserver accepts symmetric quint8 + reduce_range
        warnings.simplefilter("ignore")  # torch's reduce_range deprecation note
        accepted = ours.HistogramObserver(qscheme=torch.per_tensor_symmetric, reduce_range=True)
        anchor = tobs.HistogramObserver(qscheme=torch.per_tensor_symmetric, reduce_range=True)
    assert (accepted.quant_min, accepted.quant_max) == (anchor.quant_min, anchor.quant_max)
    with pytest.raises(ValueError, match="quant_min"):
        ours.HistogramObserver(quant_min=5, quant_max=3)


def test_bad_input_leaves_the_buffers_untouched():
    mine = ours.HistogramObserver(bins=8)
    mine(torch.tensor([0.5, 1.0, 4.0]))
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    with pytest.raises(TypeError, match="x must"):
        mine(torch.tensor([True, False]))
    with pytest.raises(TypeError, match="x must"):
        mine(torch.tensor([1 + 2j]))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        mine(np.ones(3, F32))
    with pytest.raises(ValueError, match="device"):
        mine(torch.ones(3, device="meta"))
    mine.upsample_rate = 0
    with pytest.raises(ValueError, match="upsample_rate"):
        mine(torch.tensor([-9.0, 9.0]))
    mine.upsample_rate = 16
    with pytest.raises(ValueError, match="min_val"):
        mine.reset_histogram(torch.ones(3), torch.tensor(2.0), torch.tensor(1.0))
    with pytest.raises(ValueError, match="min_val"):
        mine.reset_histogram(torch.ones(3), torch.ones(2), torch.tensor(1.0))
    mine.bins = 9
    with pytest.raises(ValueError, match="bins"):
        mine(torch.ones(3))
    with pytest.raises(ValueError, match="bins"):
        mine.calculate_qparams()
    mine.bins = 8
    for k, v in mine.state_dict().items():
        assert_bitwise_equal(before[k], v, k)

    np_obs = aobs.HistogramObserver(bins=8)
    np_obs(np.array([0.5, 1.0, 4.0], F32))
    saved = {k: np.array(v) for k, v in np_obs.state_dict().items()}
    for bad, err in ((np.array([True]), TypeError), (np.array([1j]), TypeError), (torch.ones(3), TypeError)):
        with pytest.raises(err, match="x must"):
            np_obs(bad)
    with pytest.raises(ValueError, match="state must hold shapes"):
        np_obs.update(HistogramState(np.zeros(4, F32), np.float32(0), np.float32(1)), np.ones(3, F32))
    for k, v in np_obs.state_dict().items():
        np.testing.assert_array_equal(v, saved[k])


def test_reset_histogram_and_reset_min_max_vals_as_torch():
    theirs, mine = make_pair(16, {})
    x = torch.from_numpy(np.random.default_rng(2).normal(size=300).astype(F32))
    lo, hi = torch.tensor(-1.0), torch.tensor(1.5)  # values outside are not counted
    theirs.reset_histogram(x, lo, hi)
    mine.reset_histogram(x, lo, hi)
    assert_same_state(theirs, mine, "reset_histogram")
    theirs(x * 2)
    mine(x * 2)
    assert_same_state(theirs, mine, "after reset_histogram")
    for obs in (theirs, mine):
        with pytest.raises(NotImplementedError, match="Cannot reset min/max values"):
            obs.reset_min_max_vals()


# ------------------------------------------------------------------------------------------------
# module behaviour: repr, copies, state dicts, pickling


def _observed_pair(bins=32, **config):
    theirs, mine = make_pair(bins, config)
    for x in make_sequence("growing", seed=bins):
        theirs(torch.from_numpy(x))
        mine(torch.from_numpy(x))
    return theirs, mine


def test_repr_deepcopy_and_attributes():
    theirs, mine = _observed_pair()
    assert repr(mine) == repr(theirs)  # "HistogramObserver(min_val=..., max_val=...)"
    for name in ("bins", "dst_nbins", "upsample_rate", "quant_min", "quant_max", "dtype", "qscheme", "reduce_range"):
        assert getattr(mine, name) == getattr(theirs, name), name
    assert "upsample_rate=4" in repr(ours.HistogramObserver(upsample_rate=4))
    assert "ignore_nonfinite=True" in repr(ours.HistogramObserver(ignore_nonfinite=True))
    clone = copy.deepcopy(mine)
    clone(torch.tensor([100.0]))
    assert mine.max_val < 100 and clone.max_val == 100
    assert isinstance(mine, tobs.ObserverBase)


def test_default_histogram_observer_builds_torchs_configuration():
    theirs, mine = tobs.default_histogram_observer(), ours.default_histogram_observer()
    assert type(mine) is ours.HistogramObserver
    for attr in ("bins", "dtype", "qscheme", "quant_min", "quant_max", "reduce_range", "is_dynamic",
                 "has_customized_qrange", "dst_nbins", "upsample_rate"):
        assert getattr(mine, attr) == getattr(theirs, attr), attr
    for key, value in theirs.state_dict().items():
        assert_bitwise_equal(value, mine.state_dict()[key], key)


def test_state_dict_interop_with_torch_both_ways():
    theirs, mine = _observed_pair(64, dtype=torch.qint8)
    sd_t, sd_o = theirs.state_dict(), mine.state_dict()
    assert list(sd_o) == list(sd_t) == ["eps", "histogram", "min_val", "max_val"]
    assert sd_o._metadata[""]["version"] == sd_t._metadata[""]["version"] == 3
    for k in sd_t:
        assert_bitwise_equal(sd_t[k], sd_o[k], k)
    # torch's state into a fresh adapter, ours into a fresh torch observer: same qparams, same future
    into_theirs, into_mine = make_pair(64, {"dtype": torch.qint8})
    into_mine.load_state_dict(sd_t)
    into_theirs.load_state_dict(sd_o)
    assert into_mine.min_val.data_ptr() != sd_t["min_val"].data_ptr()  # copied, not aliased
    expected = torch_qparams(theirs)
    assert_same_qparams(expected, into_mine.calculate_qparams(), "torch -> ours")
    assert_same_qparams(expected, torch_qparams(into_theirs), "ours -> torch")
    # the numpy observer loads torch's state dict as it is, and torch loads the numpy one
    np_obs = aobs.HistogramObserver(bins=64, dtype="qint8")
    np_obs.load_state_dict(sd_t)
    np.testing.assert_array_equal(np_obs.calculate_qparams().scale, expected[0].numpy())
    fresh_t = tobs.HistogramObserver(bins=64, dtype=torch.qint8)
    fresh_t.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in np_obs.state_dict().items()})
    assert_same_state(theirs, fresh_t, "numpy -> torch")
    # all of them continue alike
    x = torch.from_numpy(make_sequence("outliers", seed=1)[-1])
    for obs in (theirs, into_mine, into_theirs):
        obs(x)
    assert_same_state(theirs, into_mine, "continued after torch -> ours")
    assert_same_state(theirs, into_theirs, "continued after ours -> torch")


def test_old_state_dict_versions_load_as_in_torch():
    """Version < 3: never-updated min_val/max_val had shape (0,): loaded as +inf/-inf; version 1 has no eps."""
    sd = {"histogram": torch.zeros(16), "min_val": torch.zeros(0), "max_val": torch.zeros(0)}
    for version in (1, 2):
        theirs, mine = make_pair(16, {})
        for obs in (theirs, mine):
            state = dict(sd, **({"eps": torch.tensor([2**-10])} if version == 2 else {}))
            obs._load_from_state_dict(state, "", {"version": version}, True, [], [], [])
        assert_same_state(theirs, mine, f"version {version}")
        assert_bitwise_equal(theirs.eps, mine.eps, "eps")
        assert mine.min_val.item() == float("inf") and mine.max_val.item() == float("-inf")


def test_bad_state_dicts_raise_and_change_nothing():
    _, mine = _observed_pair(32)
    good = mine.state_dict()
    before = {k: v.clone() for k, v in good.items()}
    bad_cases = [
        ({"histogram": torch.ones(31)}, "histogram.*shape"),
        ({"histogram": torch.full((32,), -1.0)}, "non-negative"),
        ({"min_val": torch.tensor(5.0), "max_val": torch.tensor(1.0)}, "min_val=5.0 and max_val=1.0"),
        ({"min_val": torch.tensor(float("-inf"))}, "min_val"),
        ({"min_val": torch.ones(2)}, "min_val"),
    ]
    for change, match in bad_cases:
        with pytest.raises(ValueError, match=match):
            mine.load_state_dict({**good, **change})
        for k, v in mine.state_dict().items():
            assert_bitwise_equal(before[k], v, k)
    np_obs = aobs.HistogramObserver(bins=32)
    np_obs.load_state_dict(good)
    for change, match in bad_cases + [({"eps": torch.tensor([0.0])}, "eps")]:
        with pytest.raises(ValueError, match=match):
            np_obs.load_state_dict({**good, **change})
    with pytest.raises(ValueError, match="missing"):
        np_obs.load_state_dict({k: v for k, v in good.items() if k != "histogram"})
    np.testing.assert_array_equal(to_numpy(np_obs.histogram), before["histogram"].numpy())


def test_torch_save_and_load():
    theirs, mine = _observed_pair(32, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    mine.ignore_nonfinite = True
    buf = io.BytesIO()
    torch.save({"module": mine, "state": mine.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    module, state = loaded["module"], loaded["state"]
    assert type(module) is ours.HistogramObserver and module.ignore_nonfinite and module.upsample_rate == 16
    assert_same_state(theirs, module, "pickled module")
    fresh = ours.HistogramObserver(bins=32, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    fresh.load_state_dict(state)
    assert_same_qparams(torch_qparams(theirs), fresh.calculate_qparams(), "loaded state")
    assert_same_qparams(torch_qparams(theirs), pickle.loads(pickle.dumps(mine)).calculate_qparams(), "pickle")


# ------------------------------------------------------------------------------------------------
# torch's tooling: eager post-training quantization with default_histogram_observer


def test_eager_ptq_with_default_histogram_observer_matches_torch():
    from test_torch_flow import ENGINE, _quiet, assert_same_quantized_model, make_batches, make_model, quantize

    if ENGINE is None:
        pytest.skip("no x86/fbgemm quantized engine on this CPU")
    torch.backends.quantized.engine = ENGINE
    assert "default_histogram_observer" in ours.__all__ and "HistogramObserver" in ours.__all__
    model, batches = make_model(), make_batches()
    recipes = {
        "default_histogram_observer": lambda m: tq.QConfig(activation=m.default_histogram_observer,
                                                           weight=m.default_weight_observer),
        "x86 default (reduce_range, per-channel weights)": lambda m: tq.QConfig(
            activation=m.HistogramObserver.with_args(reduce_range=True),
            weight=m.default_per_channel_weight_observer),
    }  # fmt: skip
    test = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    for name, recipe in recipes.items():
        with _quiet():
            _, quantized_t = quantize(model, recipe(tobs), batches)
            prepared_o, quantized_o = quantize(model, recipe(ours), batches)
        assert isinstance(prepared_o.conv2.activation_post_process, ours.HistogramObserver), name
        assert_same_quantized_model(quantized_t, quantized_o)
        with _quiet():
            assert torch.equal(quantized_t(test), quantized_o(test)), name


def test_fake_quantize_with_histogram_observer_matches_torchs_default_histogram_fake_quant():
    """torch's ``default_histogram_fake_quant`` recipe with our observer class: same outputs and qparams."""
    kwargs = {"quant_min": 0, "quant_max": 255, "dtype": torch.quint8, "qscheme": torch.per_tensor_affine,
              "reduce_range": True, "bins": 64}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tq.FakeQuantize(observer=tobs.HistogramObserver, **kwargs)
        mine = tq.FakeQuantize(observer=ours.HistogramObserver, **kwargs)
    for x in make_sequence("outliers", seed=5):
        x = torch.from_numpy(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(theirs(x), mine(x))
    assert_bitwise_equal(theirs.scale, mine.scale, "scale")
    assert_bitwise_equal(theirs.zero_point, mine.zero_point, "zero_point")
    assert_same_state(theirs.activation_post_process, mine.activation_post_process, "fake quantize observer")


# ------------------------------------------------------------------------------------------------
# numpy (generic) and JAX observers vs torch


def _flush(x: np.ndarray) -> np.ndarray:
    """Subnormals replaced by zero of the same sign (what XLA on CPU reads)."""
    return np.where(np.abs(x) < TINY, np.copysign(F32(0), x), x).astype(F32)


def _array_config(config: dict) -> dict:
    """A torch configuration with names instead of torch objects (the array observers' spelling)."""
    out = dict(config)
    for key in ("dtype", "qscheme"):
        if key in out:
            out[key] = str(out[key]).removeprefix("torch.")
    return out


def assert_array_parity(theirs, obs, where: str, flushed: bool = False) -> None:
    """numpy/JAX observer == torch observer: histogram bit for bit, bounds equal (either sign of zero
    when ``flushed``), qparams values equal."""
    np.testing.assert_array_equal(to_numpy(obs.histogram), theirs.histogram.numpy(), err_msg=where)
    for name in ("min_val", "max_val"):
        got, expected = to_numpy(getattr(obs, name)), getattr(theirs, name).numpy()
        if flushed:
            assert got == expected, (where, name)
        else:
            assert got.tobytes() == expected.tobytes(), (where, name, got, expected)
    scale, zero_point = torch_qparams(theirs)
    qp = obs.calculate_qparams()
    np.testing.assert_array_equal(to_numpy(qp.scale), scale.numpy(), err_msg=where)
    np.testing.assert_array_equal(to_numpy(qp.zero_point), zero_point.numpy(), err_msg=where)


NUMPY_CASES = [("growing", 64, 0), ("shrinking", 3, 1), ("constant", 257, 2), ("single", 64, 3),
               ("one_sided", 64, 4), ("outliers", 2048, 5), ("subnormal", 64, 6), ("near_max", 64, 7),
               ("equal", 64, 10)]  # fmt: skip


@pytest.mark.parametrize("kind, bins, config_index", NUMPY_CASES)
def test_numpy_observer_matches_torch(kind, bins, config_index):
    config = CONFIGS[config_index]
    theirs, _ = make_pair(bins, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obs = aobs.HistogramObserver(bins=bins, **_array_config(config))
    for i, x in enumerate(make_sequence(kind, seed=7 * bins + config_index)):
        theirs(torch.from_numpy(x))
        assert obs(x) is x
        assert_array_parity(theirs, obs, f"{kind} batch {i}")


def test_array_api_strict_observer_matches_torch():
    xp = pytest.importorskip("array_api_strict")
    theirs, _ = make_pair(32, {})
    obs = aobs.HistogramObserver(bins=32, xp=xp)
    for i, x in enumerate(make_sequence("growing", seed=2)):
        theirs(torch.from_numpy(x))
        obs(xp.asarray(x))
        np.testing.assert_array_equal(to_numpy(obs.histogram), theirs.histogram.numpy(), err_msg=f"batch {i}")
    np.testing.assert_array_equal(to_numpy(obs.calculate_qparams().scale), torch_qparams(theirs)[0].numpy())


def test_numpy_observer_pure_api_and_other_dtypes():
    obs = aobs.HistogramObserver(bins=16, dtype="qint8")
    theirs, _ = make_pair(16, {"dtype": torch.qint8})
    state = obs.state
    assert float(state.min_val) == np.inf and not np.any(state.histogram)
    rng = np.random.default_rng(4)
    for dtype in (np.int16, np.float16, np.float64, np.uint8):
        x = np.abs(rng.normal(size=200) * 50).astype(dtype)
        state = obs.update(state, x)
        theirs(torch.from_numpy(x.astype(F32)))
    obs.state = state
    assert_array_parity(theirs, obs, "pure update, int/float dtypes")
    qp = obs.qparams(state)
    np.testing.assert_array_equal(qp.scale, obs.calculate_qparams().scale)
    obs.reset_min_max_vals()
    assert float(obs.min_val) == np.inf
    with pytest.warns(UserWarning, match="must run observer"):
        qp = obs.calculate_qparams()
    assert float(qp.scale[0]) == 1.0 and int(qp.zero_point[0]) == 0
    assert obs.bins == 16 and obs.dst_nbins == 256 and obs.upsample_rate == 16
    assert "bins=16" in repr(obs)


# one shape, bins and configuration: JAX compiles the update and the search once for all of these
# (each compile takes seconds); the numpy cases above cover the configurations with the same core
JAX_KINDS = ["growing", "subnormal", "outliers", "constant", "near_max"]


@pytest.mark.parametrize("kind", JAX_KINDS)
def test_jax_observer_matches_torch(kind):
    jax = pytest.importorskip("jax")
    from observers_core.adapters import jax as jobs

    theirs, _ = make_pair(64, {})
    obs = jobs.HistogramObserver(bins=64)
    flush = jax.default_backend() == "cpu"  # XLA:CPU flushes subnormals (jax-ml/jax#16200)
    for i, x in enumerate(make_sequence(kind, seed=JAX_KINDS.index(kind))):
        x = np.resize(x, (50,))  # one shape: one compiled update for every case
        theirs(torch.from_numpy(_flush(x) if flush else x))
        obs(x)
        assert_array_parity(theirs, obs, f"{kind} batch {i}", flushed=flush)


def test_jax_update_and_qparams_are_jitted_and_traced_once():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from observers_core.adapters import jax as jobs
    from observers_core.families import histogram as family

    updates = TraceDelta(jobs.TRACES, family.update)
    qparams = TraceDelta(jobs.TRACES, family.qparams)
    # a configuration no other test uses, so that nothing is compiled yet
    obs = jobs.HistogramObserver(bins=24, upsample_rate=7, dtype="qint8", quant_min=-37, quant_max=41)
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.normal(size=(3, 5)).astype(F32) * (i + 1)) for i in range(4)]
    obs(xs[0])  # the first batch goes through the same compiled update
    obs.calculate_qparams()
    with jax.transfer_guard_device_to_host("disallow"):
        for x in xs[1:]:
            assert obs(x) is x
        first = obs.calculate_qparams()
    assert updates.count == 1 and qparams.count == 1
    other = jobs.HistogramObserver(bins=24, upsample_rate=7, dtype="qint8", quant_min=-37, quant_max=41)
    other(xs[0])
    second = other.calculate_qparams()
    assert updates.count == 1 and qparams.count == 1  # shared by observers with the same configuration
    assert float(first.scale[0]) != float(second.scale[0])  # new values, same trace

    # the pure update composes with the user's jit and scan; the state is a pytree
    @jax.jit
    def calibrate(state, batches):
        return jax.lax.scan(lambda s, x: (obs.update(s, x), None), state, batches)[0]

    state = calibrate(other.init_state(), jnp.stack(xs))
    qp = obs.qparams(state)
    eager = jobs.HistogramObserver(bins=24, upsample_rate=7, dtype="qint8", quant_min=-37, quant_max=41)
    for x in xs:
        eager(x)
    np.testing.assert_array_equal(np.asarray(state.histogram), np.asarray(eager.histogram))
    np.testing.assert_array_equal(np.asarray(qp.scale), np.asarray(eager.calculate_qparams().scale))
    with pytest.raises(TypeError, match="cannot run inside jit"):
        jax.jit(lambda x: obs(x))(xs[0])


def test_jax_state_dict_interop_with_torch():
    pytest.importorskip("jax")
    from observers_core.adapters import jax as jobs

    theirs, _ = _observed_pair(64)  # the bins and spec of the parity cases: no new compile
    obs = jobs.HistogramObserver(bins=64)
    obs.load_state_dict(theirs.state_dict())
    np.testing.assert_array_equal(np.asarray(obs.calculate_qparams().scale), torch_qparams(theirs)[0].numpy())
    back = tobs.HistogramObserver(bins=64)
    back.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in obs.state_dict().items()})
    assert_same_state(theirs, back, "jax -> torch")


# ------------------------------------------------------------------------------------------------
# GPU: torch CUDA and CuPy (skipped without a GPU)


def _gpu_sequence() -> list[np.ndarray]:
    """Two batches, the second widening the range: the re-binned counts are multiples of 1/16 far below
    2**20, so their sums are exact in any order (GPU scatter-adds accumulate in no fixed order)."""
    batches = make_sequence("growing", seed=1)[:2]
    assert batches[1].min() < batches[0].min() or batches[1].max() > batches[0].max()
    return batches


@pytest.mark.gpu("torch-cuda")
def test_torch_cuda_matches_torch_ao_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    theirs, mine = make_pair(256, {})
    theirs, mine = theirs.cuda(), mine.cuda()
    for i, x in enumerate(_gpu_sequence()):
        theirs(torch.from_numpy(x).cuda())
        mine(torch.from_numpy(x).cuda())
        assert mine.histogram.device.type == "cuda"
        assert_same_state(theirs, mine, f"cuda batch {i}")
    expected, got = torch_qparams_untouched(theirs), mine.calculate_qparams()
    assert got[0].device.type == "cuda"
    assert_same_qparams(expected, got, "cuda")


def torch_qparams_untouched(obs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return obs.calculate_qparams()


@pytest.mark.gpu("cupy")
def test_cupy_observer_keeps_state_on_the_input_device():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception:  # no driver
        pytest.skip("cupy has no CUDA device here")
    from observers_core.adapters import cupy as cobs

    theirs, _ = make_pair(64, {})
    obs = cobs.HistogramObserver(bins=64)
    for i, x in enumerate(_gpu_sequence()):
        theirs(torch.from_numpy(x))
        obs(cupy.asarray(x))
        assert obs.histogram.device == cupy.cuda.Device(0)
        np.testing.assert_array_equal(obs.histogram.get(), theirs.histogram.numpy(), err_msg=f"batch {i}")
        assert float(obs.min_val) == theirs.min_val.item() and float(obs.max_val) == theirs.max_val.item()
    qp = obs.calculate_qparams()
    assert isinstance(qp.scale, cupy.ndarray) and qp.scale.device == cupy.cuda.Device(0)
    scale, zero_point = torch_qparams(theirs)
    np.testing.assert_array_equal(qp.scale.get(), scale.numpy())
    np.testing.assert_array_equal(qp.zero_point.get(), zero_point.numpy())
    with pytest.raises(TypeError, match="cupy.ndarray"):
        obs(np.ones(3, F32))


def test_torch_private_helpers_equal_torchs():
    """torch's own tools call ``_compute_quantization_error`` and ``_get_norm`` on a HistogramObserver:
    ours give torch's floats for many (start, end) pairs on the same observed data."""
    torch = pytest.importorskip("torch")
    from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver

    from observers_core.adapters.torch import HistogramObserver

    gen = torch.Generator().manual_seed(4)
    for bins in (16, 256, 2048):
        theirs, ours = TorchHistogramObserver(bins=bins), HistogramObserver(bins=bins)
        for scale in (1.0, 5.0, 0.2):
            x = torch.randn(3000, generator=gen) ** 3 * scale
            theirs(x)
            ours(x)
        pairs = [(0, bins - 1), (1, bins - 2), (bins // 4, 3 * bins // 4), (bins // 2, bins // 2), (0, 0)]
        for start, end in pairs:
            assert ours._compute_quantization_error(start, end) == theirs._compute_quantization_error(start, end)
        begin, end, density = torch.randn(5, generator=gen), torch.rand(5, generator=gen), torch.rand(5, generator=gen)
        assert torch.equal(ours._get_norm(begin, end, density), theirs._get_norm(begin, end, density))
