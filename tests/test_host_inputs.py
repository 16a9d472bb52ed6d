"""NumPy inputs the array observers must not misread (found by probing every class with odd host arrays):

- a masked array is refused with a ``TypeError`` (the observers would count its masked entries: some
  classes did, others did not), the state untouched; a ``np.matrix`` or ``np.memmap`` is observed as the
  plain array (the numpy HistogramObserver crashed in numba on a matrix);
- the JAX observers without x64 observe int64/uint64 NumPy batches as NumPy's observers do (``jnp.asarray``
  wrapped them to 32 bits: 2**62 became 0);
- the calibration observers observe a float64 batch as float32 on every framework, so a value beyond
  float32's range is skipped as ±inf everywhere (NumPy and torch kept it: a NaN MixObserver range from
  finite data, and ranges unlike JAX's);
- the ``state`` setter refuses a state of integer arrays (every later update was truncated to integers)
  or of another library's arrays (a JAX observer kept NumPy float64 values), with a ``TypeError`` naming
  the entry, the state untouched."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers  # noqa: E402
from observers_core.adapters import jax as jax_observers  # noqa: E402
from observers_core.adapters import torch as torch_observers  # noqa: E402

from test_jax_x64 import KWARGS, NO_QPARAMS  # noqa: E402

MODULES = (_array_observers, _array_histogram, _array_calibration, _array_lowbit)
NAMES = [n for m in MODULES for n in m.__all__ if "Base" not in n]
STATEFUL = [n for n in NAMES if n not in ("FixedQParamsObserver", "PlaceholderObserver", "NoopObserver")]
CALIBRATION = ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"]


def _numpy_class(name: str):
    return getattr(next(m for m in MODULES if hasattr(m, name)), name)


def _results(obs, name: str) -> list[np.ndarray]:
    out = [np.asarray(v) for v in obs.state_dict().values()]
    if name not in NO_QPARAMS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out += [np.asarray(q) for q in obs.calculate_qparams()]
    return out


def _equal(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    """Equal values (NaN equal to NaN); dtypes may differ where documented (int32 zero points on JAX)."""
    return len(got) == len(want) and all(
        g.shape == w.shape and np.array_equal(g.astype(np.float64), w.astype(np.float64), equal_nan=True)
        for g, w in zip(got, want))


def _batch(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((4, 16)) * 3).astype(np.float32)


@pytest.mark.slow_on("jax")  # every class compiles under jit
@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize("name", STATEFUL)
def test_masked_arrays_are_refused_and_matrix_or_memmap_are_plain_arrays(name, framework, tmp_path):
    make = _numpy_class(name) if framework == "numpy" else getattr(jax_observers, name)
    plain, obs = make(**KWARGS.get(name, {})), make(**KWARGS.get(name, {}))
    for o in (plain, obs):
        o(_batch(0))
    before = _results(obs, name)
    masked = np.ma.array(_batch(1), mask=np.arange(64).reshape(4, 16) % 3 == 0)
    with pytest.raises(TypeError, match="masked array"):
        obs(masked)
    assert _equal(_results(obs, name), before), "a refused masked array changed the state"
    memmap = np.memmap(tmp_path / "batch.dat", dtype=np.float32, mode="w+", shape=(4, 16))
    memmap[:] = _batch(2)
    for view, data in ((np.asmatrix(_batch(1)), _batch(1)), (memmap, _batch(2))):
        obs(view)
        plain(data)
        assert _equal(_results(obs, name), _results(plain, name)), type(view).__name__


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("name", NAMES)
def test_jax_observes_64_bit_integer_numpy_batches_as_numpy(name, dtype):
    """Values beyond 32 bits (and small ones): the JAX observer's state and qparams are NumPy's."""
    assert not jax.config.jax_enable_x64  # (with x64, tests/test_jax_x64.py)
    rng = np.random.default_rng(0)
    low = 0 if dtype == np.uint64 else -(2**62)
    batches = [rng.integers(low, 2**62, size=(4, 16), dtype=dtype), np.arange(64, dtype=dtype).reshape(4, 16)]
    ours, ref = getattr(jax_observers, name)(**KWARGS.get(name, {})), _numpy_class(name)(**KWARGS.get(name, {}))
    for x in batches:
        ours(x)
        ref(x)
        assert _equal(_results(ours, name), _results(ref, name)), (x.dtype, _results(ours, name), _results(ref, name))


@pytest.mark.parametrize("name", CALIBRATION)
def test_calibration_observes_float64_batches_as_float32_everywhere(name):
    """Batches mixing ordinary values with float64 values beyond float32's range (and subnormal in float32):
    on NumPy, torch and JAX the state and qparams are those of the float32 cast, and no NaN appears."""
    rng = np.random.default_rng(1)
    batches = []
    for extreme in (1e300, 4e38, 3.5e38, 1e-50):
        x = rng.standard_normal((4, 16))
        x[0, :3] = (extreme, -extreme, extreme / 2)
        batches.append(x)
    frameworks = {
        "numpy": (_numpy_class(name), lambda a: a),
        "torch": (getattr(torch_observers, name), torch.from_numpy),
        "jax": (getattr(jax_observers, name), lambda a: a),
    }
    want_obs = _numpy_class(name)()
    for x in batches:
        want_obs(x.astype(np.float32))
    want = _results(want_obs, name)
    assert not any(np.isnan(w).any() for w in want)
    for framework, (make, convert) in frameworks.items():
        obs = make()
        for x in batches:
            obs(convert(x))
        assert _equal(_results(obs, name), want), (framework, _results(obs, name), want)


@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize("name", ["MinMaxObserver", "PerChannelMinMaxObserver", "HistogramObserver", "FP8Observer",
                                  "MSEObserver"])
def test_state_setter_takes_floating_arrays_of_the_observers_library(name, framework):
    make = _numpy_class(name) if framework == "numpy" else getattr(jax_observers, name)
    own = np.asarray if framework == "numpy" else jax.numpy.asarray
    other = jax.numpy.asarray if framework == "numpy" else np.asarray
    obs = make(**KWARGS.get(name, {}))
    obs(own(_batch(0)))
    good = type(obs.state)(*(own(np.asarray(a) * 2) for a in obs.state))
    obs.state = good  # floating arrays of its own library: taken as they are
    assert all(a is b for a, b in zip(obs.state, good))
    before = _results(obs, name)
    for bad in (type(good)(*(own(np.asarray(a).astype(np.int32)) for a in good)),
                type(good)(*(other(np.asarray(a)) for a in good))):
        with pytest.raises(TypeError, match=r"state\.\w+ must be a real floating array"):
            obs.state = bad
        assert _equal(_results(obs, name), before)


@pytest.mark.parametrize("framework", ["numpy", "jax"])
@pytest.mark.parametrize("name", ["MinMaxObserver", "PerChannelMinMaxObserver", "HistogramObserver", "FP8Observer",
                                  "MSEObserver", "KLObserver"])
def test_pure_steps_check_the_state_they_are_given(name, framework):
    """The pure steps take what the ``state`` setter takes: a state of other types, of integers or of
    another library raises ``TypeError`` naming it (an ``AttributeError`` or a silent float64/int run
    before); the observer's own states still run."""
    make = _numpy_class(name) if framework == "numpy" else getattr(jax_observers, name)
    own = np.asarray if framework == "numpy" else jax.numpy.asarray
    other = jax.numpy.asarray if framework == "numpy" else np.asarray
    obs = make(**KWARGS.get(name, {}))
    x = own(_batch(0))
    if name == "KLObserver":
        acc = obs.accumulate(None, x)
        state = obs.kl_step(None, acc)
        steps = {"state": lambda bad: obs.kl_step(bad, acc), "acc.seen": lambda bad: obs.kl_step(state, acc._replace(seen=bad))}
        good = {"state": state, "acc.seen": acc.seen}
        for bad in ((1, 2), "abc", 5):
            with pytest.raises(TypeError, match=r"acc(\.hist)? must be a"):
                obs.accumulate(bad, x)
    else:
        state = obs.update(None, x)
        steps = {"state": lambda bad: obs.update(bad, x), "state ": lambda bad: obs.qparams(bad)}
        good = {"state": state, "state ": state}
    for label, step in steps.items():
        step(good[label])  # its own kind of state runs
        kind = type(good[label])
        for bad in ((1, 2, 3, 4), "abc", 5):
            with pytest.raises(TypeError, match=rf"{label.strip()} must be a {kind.__name__}"):
                step(bad)
        for bad in (kind(*(own(np.asarray(a).astype(np.int32)) for a in good[label])),
                    kind(*(other(np.asarray(a)) for a in good[label]))):
            with pytest.raises(TypeError, match=rf"{re.escape(label.strip())}\.\w+ must be a real floating array"):
                step(bad)


def test_histogram_takes_a_float64_state_as_its_float32_values():
    """The histogram statistics are float32: a float64 state given to the setter or to ``update`` is taken
    as its float32 values (it crashed the compiled NumPy update with a numba TypingError; JAX without x64
    has no float64 arrays to give)."""
    obs = _numpy_class("HistogramObserver")(bins=64)
    state = obs.update(obs.init_state(), _batch(0))
    as64 = type(state)(*(np.asarray(a).astype(np.float64) for a in state))
    wider = _batch(1) * 4
    want = obs.update(state, wider)
    got = obs.update(as64, wider)
    for a, b in zip(got, want):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    obs.state = as64
    obs(wider)
    for a, b in zip(obs.state, want):
        np.testing.assert_array_equal(a, b)
