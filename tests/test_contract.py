"""The contract every public observer class keeps on every backend, one test per clause, parametrized over
class x backend (numpy and array_api_strict: the generic classes; torch, JAX; CuPy only where a GPU exists).

The reference is the numpy observer (the generic class on NumPy) fed the same data: each backend gives its
state dict and qparams (bit for bit on the CPU, ``conftest.assert_same_on_device`` on a GPU). Its agreement
with torch.ao is the parity suites' job (test_array_adapters, test_torch_parity, test_histogram_adapters,
test_calibration_adapters, test_lowbit_adapters); which configurations each backend accepts is
test_backend_table's. The clauses:

- built with its defaults, ``obs(x)`` returns ``x`` itself and ``calculate_qparams()`` gives a scale (float32)
  and a zero point (integer; uint8 E8M0 exponents for MX/BFP) of the numpy observer's shapes and values;
  before any input it warns and gives the defaults;
- a bad constructor argument is a ``ValueError``/``TypeError`` naming it;
- a bad input (bool, complex, not an array, a shape the state cannot take) is a ``TypeError``/``ValueError``
  and leaves the state untouched; an empty input is a no-op;
- NaN, +-Inf, float16, bfloat16, float64 and integer inputs give the numpy observer's state and qparams
  (the dtype grid is slow on JAX: a compile per dtype);
- ``load_state_dict(state_dict())`` round-trips, across backends too (numpy arrays in, numpy observer out);
- ``reset_min_max_vals()`` gives the state of a fresh observer (torch's HistogramObserver raises
  ``NotImplementedError``, as torch.ao's).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import adapter_backend, assert_counts_one_bin_apart, assert_same_on_device, to_numpy
from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers

try:  # bfloat16 for numpy (installed with jax)
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

#: every public generic class by name (the numpy and array_api_strict backends' classes)
GENERIC = SimpleNamespace(**{name: getattr(module, name) for module in (
    _array_observers, _array_histogram, _array_calibration, _array_lowbit) for name in module.__all__})

BACKENDS = ["numpy", "array_api_strict", "torch", "jax", "cupy"]  # cupy: collected only where a GPU exists
PER_CHANNEL = ["PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"]
#: the observers with statistics; their state's shape follows the input's (per channel, per group, per block)
SHAPED = [*PER_CHANNEL, "PerGroupMinMaxObserver", "PerBlockMXObserver", "PerBlockBFPObserver"]
STATEFUL = ["MinMaxObserver", "MovingAverageMinMaxObserver", *PER_CHANNEL, "HistogramObserver", "KLObserver",
            "MSEObserver", "PercentileObserver", "MixObserver", "PerGroupMinMaxObserver", "FP8Observer",
            "PerBlockMXObserver", "PerBlockBFPObserver"]  # fmt: skip
STATELESS = ["FixedQParamsObserver", "PlaceholderObserver", "NoopObserver"]
#: the arguments a class cannot be built without
REQUIRED = {"FixedQParamsObserver": {"scale": 0.125, "zero_point": 3}}

#: per class: (keyword arguments, the argument the error must name), one bad value at a time
BAD_ARGUMENTS = {
    "MinMaxObserver": [({"quant_min": 5, "quant_max": 2}, "quant_min"), ({"eps": "tiny"}, "eps"),
                       ({"reduce_range": 1}, "reduce_range"), ({"dtype": "qint7"}, "dtype"),
                       ({"qscheme": "per_channel_affine"}, "qscheme"), ({"is_dynamic": 2}, "is_dynamic"),
                       ({"ignore_nonfinite": "yes"}, "ignore_nonfinite")],
    "MovingAverageMinMaxObserver": [({"averaging_constant": 1.5}, "averaging_constant"),
                                    ({"averaging_constant": "0.1"}, "averaging_constant")],
    "PerChannelMinMaxObserver": [({"ch_axis": 1.0}, "ch_axis"), ({"qscheme": "per_tensor_affine"}, "qscheme")],
    "MovingAveragePerChannelMinMaxObserver": [({"averaging_constant": 2}, "averaging_constant"),
                                              ({"ch_axis": True}, "ch_axis")],
    "HistogramObserver": [({"bins": 0}, "bins"), ({"upsample_rate": 0}, "upsample_rate"),
                          ({"qscheme": "per_channel_affine"}, "qscheme")],
    "KLObserver": [({"update_interval": 0}, "update_interval"), ({"bins": 3}, "bins")],
    "MSEObserver": [({"stride": 0}, "stride"), ({"quant_min": 0.5, "quant_max": 10}, "quant_min")],
    "PercentileObserver": [({"percentile": 150.0}, "percentile")],
    "MixObserver": [({"averaging_constant": -1}, "averaging_constant")],
    "PerGroupMinMaxObserver": [({"group_size": 0}, "group_size")],
    "FP8Observer": [({"dtype": "int8"}, "dtype")],
    "PerBlockMXObserver": [({"block_size": 0}, "block_size")],
    "PerBlockBFPObserver": [({"ignore_nonfinite": "no"}, "ignore_nonfinite")],
    "FixedQParamsObserver": [({"scale": -1.0, "zero_point": 0}, "scale"), ({"scale": 0.1, "zero_point": 1.5},
                                                                           "zero_point")],
    "PlaceholderObserver": [({"eps": "x"}, "eps"), ({"qscheme": "nope"}, "qscheme")],
}

_rng = np.random.default_rng(2026)
#: (4, 256): 4 channels along the default ch_axis=0, 2 groups of 128, 8 MX blocks of 32 per row
BATCHES = [(_rng.standard_normal((4, 256)) * scale).astype(np.float32) for scale in (3.0, 0.5)]


def _special(kind: str) -> np.ndarray:
    x = BATCHES[0]
    if kind in ("nan", "inf"):
        where = np.random.default_rng(1).random(x.shape) < 0.01
        return np.where(where, np.float32(np.nan if kind == "nan" else np.inf), x)
    if kind == "bfloat16":
        return x.astype(ml_dtypes.bfloat16)
    if kind in ("int32", "uint8"):
        return np.abs(x * 40).astype(kind) if kind == "uint8" else (x * 40).astype(kind)
    return x.astype(kind) * (1.0001 if kind == "float64" else 1)


SPECIAL_KINDS = ["nan", "inf", "float16", "bfloat16", "float64", "int32", "uint8"]
if ml_dtypes is None:  # pragma: no cover
    SPECIAL_KINDS.remove("bfloat16")


@pytest.fixture(params=BACKENDS)
def backend(request) -> SimpleNamespace:
    """The public classes of one backend: ``mod``, ``asarray`` (numpy input), ``kw`` (constructor extras)."""
    return adapter_backend(request.param, GENERIC)


def make(backend: SimpleNamespace, name: str, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's reduce_range deprecation
        return getattr(backend.mod, name)(**REQUIRED.get(name, {}), **kwargs, **backend.kw)


def observed(obs, backend: SimpleNamespace, batches) -> dict:
    """``obs`` after ``batches``: its state dict (copied to numpy) and qparams, warnings off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in batches:
            x = backend.asarray(batch)
            assert obs(x) is x
        return {"state": state_of(obs), "qparams": [to_numpy(a).copy() for a in obs.calculate_qparams()]}


def state_of(obs) -> dict:
    """The state dict as numpy copies (torch's entries are views of buffers written in place)."""
    return {key: to_numpy(value).copy() for key, value in obs.state_dict().items()}


def reference(name: str, batches, **kwargs) -> dict:
    return observed(getattr(GENERIC, name)(**REQUIRED.get(name, {}), **kwargs), adapter_backend("numpy", GENERIC),
                    batches)


def assert_same_state(got: dict, expected: dict, backend_name: str) -> None:
    assert list(got) == list(expected), (list(got), list(expected))
    for key, value in expected.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, (key, got[key], value)
        if key == "histogram" and backend_name in ("cupy", "jax-gpu", "torch-cuda"):
            assert_counts_one_bin_apart(got[key], value, key)
        else:
            assert_same_on_device(got[key], value, backend_name, key)


def assert_same_qparams(got: list, expected: list, backend_name: str) -> None:
    """Same shapes and values; the scale float32, the zero point (or MX/BFP exponent) of the same kind (the
    zero point's width is the backend's index dtype: int32 on JAX without x64, see the adapters' docs)."""
    assert len(got) == len(expected) == 2
    (scale, zero_point), (ref_scale, ref_zero_point) = got, expected
    assert scale.dtype == ref_scale.dtype == np.float32
    assert zero_point.dtype.kind == ref_zero_point.dtype.kind and zero_point.dtype.kind in "iuf"
    assert_same_on_device(scale, ref_scale, backend_name, "scale")
    assert_same_on_device(zero_point.astype(ref_zero_point.dtype), ref_zero_point, backend_name, "zero_point")


# ------------------------------------------------------------------------------------------- observe, qparams
@pytest.mark.parametrize("name", STATEFUL)
def test_defaults_observe_and_give_the_numpy_qparams(backend, name):
    got = observed(make(backend, name), backend, BATCHES)
    expected = reference(name, BATCHES)
    assert_same_state(got["state"], expected["state"], backend.name)
    assert_same_qparams(got["qparams"], expected["qparams"], backend.name)


@pytest.mark.parametrize("name", STATEFUL)
def test_qparams_before_any_input_warn_and_are_the_defaults(backend, name):
    with pytest.warns(UserWarning, match="must run observer|has not run a KL update"):
        got = [to_numpy(a) for a in make(backend, name).calculate_qparams()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [to_numpy(a) for a in getattr(GENERIC, name)().calculate_qparams()]
    assert_same_qparams(got, expected, backend.name)


def test_stateless_observers(backend):
    """FixedQParamsObserver returns its qparams; Placeholder/Noop refuse ``calculate_qparams``; all three
    return their input."""
    x = backend.asarray(BATCHES[0])
    fixed = make(backend, "FixedQParamsObserver")
    assert fixed(x) is x
    assert_same_qparams([to_numpy(a) for a in fixed.calculate_qparams()],
                        [np.array([0.125], np.float32), np.array([3], np.int32)], backend.name)
    for name in ("PlaceholderObserver", "NoopObserver"):
        obs = make(backend, name)
        assert obs(x) is x
        with pytest.raises(Exception, match="calculate_qparams should not be called"):
            obs.calculate_qparams()


# ------------------------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(("name", "kwargs", "argument"), [
    pytest.param(name, kwargs, argument, id=f"{name}-{argument}")
    for name, cases in BAD_ARGUMENTS.items() for kwargs, argument in cases])
def test_a_bad_argument_is_an_error_naming_it(backend, name, kwargs, argument):
    with pytest.raises((ValueError, TypeError), match=argument):
        getattr(backend.mod, name)(**{**REQUIRED.get(name, {}), **kwargs}, **backend.kw)


# ------------------------------------------------------------------------------------------- bad and empty inputs
@pytest.mark.parametrize("name", STATEFUL)
def test_a_bad_input_is_refused_and_the_state_kept(backend, name):
    """bool/complex arrays, a list, another framework's array (JAX takes NumPy's), and where the state's
    shape follows the input's: another channel count (or number of groups/blocks), an input without the
    axis (``ch_axis=1`` of a 1-d input), a 0-d input."""
    obs = make(backend, name, **({"ch_axis": 1} if name in PER_CHANNEL else {}))
    observed(obs, backend, BATCHES[:1])
    before = state_of(obs)
    x = BATCHES[0]
    bad = [(backend.asarray(x > 0), TypeError, "x must hold real|dtype"),
           (backend.asarray(x.astype(np.complex64)), TypeError, "x must hold real|dtype"),
           (x.tolist(), TypeError, "x must be")]
    if backend.name not in ("numpy", "jax"):
        bad.append((x, TypeError, "x must be"))
    if name in PER_CHANNEL:
        bad += [(backend.asarray(x[:, :96]), ValueError, "96 channels along ch_axis=1 but the observer holds 256"),
                (backend.asarray(x[0]), ValueError, "ch_axis=1 is out of range"),
                (backend.asarray(x[0, 0]), ValueError, "ch_axis=1 needs an input with at least one dimension")]
    elif name in SHAPED:
        bad += [(backend.asarray(x[:, :128]), ValueError, "statistics of shape"),
                (backend.asarray(x[0, 0]), ValueError, "axis=-1 needs an input with at least one dimension")]
    for x, error, match in bad:
        with pytest.raises(error, match=match):
            obs(x)
        assert_same_state(state_of(obs), before, backend.name)


@pytest.mark.parametrize("name", STATEFUL)
def test_an_empty_input_is_a_no_op(backend, name):
    """Before and after the first batch; also an empty input the state could not take (another channel
    count, number of groups or blocks)."""
    obs = make(backend, name)
    fresh = state_of(obs)
    empty = backend.asarray(np.zeros((0, 256), np.float32))
    assert obs(empty) is empty
    assert_same_state(state_of(obs), fresh, backend.name)
    observed(obs, backend, BATCHES[:1])
    before = state_of(obs)
    for x in (empty, backend.asarray(np.zeros((2, 0), np.float32))):
        assert obs(x) is x
        assert_same_state(state_of(obs), before, backend.name)


# ------------------------------------------------------------------------------------------- special inputs
#: the classes whose dtype grid runs by default on JAX too (a compile per dtype; the others' grid is slow there)
JAX_DEFAULT = ("MinMaxObserver", "MovingAveragePerChannelMinMaxObserver")
SPECIAL_CASES = [
    pytest.param(backend, name, kind, id=f"{backend}-{name}-{kind}",
                 marks=[pytest.mark.slow] if backend == "jax" and name not in JAX_DEFAULT else [])
    for backend in BACKENDS for name in STATEFUL for kind in SPECIAL_KINDS
    if not (backend == "array_api_strict" and kind in ("float16", "bfloat16"))  # not in that namespace
    and not (backend == "cupy" and kind == "bfloat16")  # nor in CuPy
]


@pytest.mark.parametrize(("backend", "name", "kind"), SPECIAL_CASES, indirect=["backend"])
def test_nonfinite_narrow_and_integer_inputs_give_the_numpy_result(backend, name, kind):
    batches = [BATCHES[1], _special(kind)]  # after a float32 batch, so NaN meets a state
    got = observed(make(backend, name), backend, batches)
    expected = reference(name, batches)
    assert_same_state(got["state"], expected["state"], backend.name)
    assert_same_qparams(got["qparams"], expected["qparams"], backend.name)
    if kind == "nan" and name not in ("KLObserver", "MSEObserver", "PercentileObserver", "MixObserver",
                                      "PerBlockBFPObserver"):  # the searches and BFP16 always skip NaN
        assert np.isnan(got["state"]["min_val"]).any()  # NaN poisons by default, as torch


@pytest.mark.parametrize("name", [n for n in STATEFUL if n not in ("HistogramObserver", "KLObserver", "MSEObserver",
                                                                   "PercentileObserver", "MixObserver")])
def test_ignore_nonfinite_skips_nan_and_inf(backend, name):
    """With ``ignore_nonfinite=True`` NaN and +-Inf leave the result of the finite values alone (the searches
    always skip them and have no such argument)."""
    finite = BATCHES[0]
    dirty = finite.copy()
    dirty[0, :3] = [np.nan, np.inf, -np.inf]
    dirty[1, 5] = np.nan
    clean = finite.copy()
    clean[0, :3] = clean[0, 3]
    clean[1, 5] = clean[1, 4]
    got = observed(make(backend, name, ignore_nonfinite=True), backend, [dirty])
    expected = reference(name, [clean], ignore_nonfinite=True)
    assert_same_qparams(got["qparams"], expected["qparams"], backend.name)


# ------------------------------------------------------------------------------------------- state dict, reset
@pytest.mark.parametrize("name", [*STATEFUL, "FixedQParamsObserver"])
def test_state_dict_round_trips_within_and_across_backends(backend, name):
    obs = make(backend, name)
    got = observed(obs, backend, BATCHES)
    numpy_obs = getattr(GENERIC, name)(**REQUIRED.get(name, {}))
    sources = [(obs, make(backend, name)), (obs, numpy_obs), (reference_observer(name, "numpy"), make(backend, name)),
               (reference_observer(name, "torch"), make(backend, name))]  # NumPy arrays, torch CPU tensors in
    for source, target in sources:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target.load_state_dict(source.state_dict())
            qparams = [to_numpy(a) for a in target.calculate_qparams()]
        assert_same_state(state_of(target), got["state"], backend.name)
        assert_same_qparams(qparams, got["qparams"], backend.name)


def reference_observer(name: str, backend_name: str):
    """An observer of ``backend_name`` (numpy or torch: CPU arrays every backend loads) after ``BATCHES``."""
    backend = adapter_backend(backend_name, GENERIC)
    obs = make(backend, name)
    observed(obs, backend, BATCHES)
    return obs


@pytest.mark.parametrize("name", STATEFUL)
def test_reset_gives_a_fresh_observer(backend, name):
    obs = make(backend, name)
    fresh = state_of(obs)
    observed(obs, backend, BATCHES[:1])
    if backend.name == "torch" and name == "HistogramObserver":
        with pytest.raises(NotImplementedError, match="Cannot reset"):  # torch.ao's HistogramObserver raises too
            obs.reset_min_max_vals()
        return
    obs.reset_min_max_vals()
    assert_same_state(state_of(obs), fresh, backend.name)
    other = BATCHES[1][:2, :128] if name in SHAPED else BATCHES[1]  # another channel count etc. is fine now
    got = observed(obs, backend, [other])
    expected = observed(make(backend, name), backend, [other])
    assert_same_state(got["state"], expected["state"], backend.name)
    assert_same_qparams(got["qparams"], expected["qparams"], backend.name)
