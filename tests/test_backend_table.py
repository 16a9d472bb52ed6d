"""One table for every public observer class on every CPU backend (numpy, array_api_strict, torch, JAX):
the same configurations are accepted or rejected, rejected ones with the same error, and accepted ones
give the same qparams and ranges, bit for bit, on the same batches (an empty batch among them).

The error rule: every backend raises the numpy observer's exception type, except that the torch
observers may raise the type torch.ao's own class raises for the same configuration (torch's
``NotImplementedError`` for a wrong qscheme, its bare ``Exception`` from ``PlaceholderObserver``), found
by running the installed torch.ao class here, not written down.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
array_api_strict = pytest.importorskip("array_api_strict")

import jax.numpy as jnp  # noqa: E402
import torch.ao.quantization.observer as tao  # noqa: E402

import observers_core.adapters.jax as jax_observers  # noqa: E402
import observers_core.adapters.torch as torch_observers  # noqa: E402
from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers  # noqa: E402

from _adversarial_strategies import make_batch  # noqa: E402

GENERIC = {
    name: getattr(module, name)
    for module in (_array_observers, _array_histogram, _array_calibration, _array_lowbit)
    for name in module.__all__
}
TORCH_DTYPES = {"quint8": torch.quint8, "qint8": torch.qint8, "qint32": torch.qint32, "float16": torch.float16,
                "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}  # fmt: skip

SYM = {"dtype": "qint8", "qscheme": "per_tensor_symmetric"}
PER_CH_SYM = {"ch_axis": 1, "qscheme": "per_channel_symmetric", "bins": 512}
CASES = [
    ("MinMaxObserver", {}),
    ("MinMaxObserver", SYM),
    ("MinMaxObserver", {"reduce_range": True}),
    ("MinMaxObserver", {"quant_min": 0, "quant_max": 15}),
    ("MinMaxObserver", {"quant_min": 5, "quant_max": 3}),
    ("MinMaxObserver", {"qscheme": "per_channel_affine"}),
    ("MinMaxObserver", {"dtype": "qint32"}),
    ("MinMaxObserver", {"eps": 0.0}),
    ("MinMaxObserver", {"eps": -1.0}),
    ("MinMaxObserver", {"dtype": "float16"}),
    ("MinMaxObserver", {"is_dynamic": True}),
    ("MinMaxObserver", {"is_dynamic": 0}),
    ("MinMaxObserver", {"factory_kwargs": 3}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 0.0}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 1.0}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 1.5}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": -0.1}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 0.3, "reduce_range": True, **SYM}),
    ("MovingAverageMinMaxObserver", {"is_dynamic": True}),
    ("MovingAverageMinMaxObserver", {"is_dynamic": True, "averaging_constant": 1.0}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1, "qscheme": "per_channel_symmetric", "dtype": "qint8"}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1, "qscheme": "per_tensor_affine"}),
    ("PerChannelMinMaxObserver", {"ch_axis": 7}),
    ("PerChannelMinMaxObserver", {"ch_axis": -1}),
    ("PerChannelMinMaxObserver", {"ch_axis": 1, "qscheme": "per_channel_affine_float_qparams"}),
    ("MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1, "averaging_constant": 0.5}),
    ("MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1, "averaging_constant": 2.0}),
    ("HistogramObserver", {"bins": 64}),
    ("HistogramObserver", {"bins": 64, **SYM}),
    ("HistogramObserver", {"bins": 0}),
    ("HistogramObserver", {"bins": 64, "upsample_rate": 4}),
    ("HistogramObserver", {"qscheme": "per_channel_affine"}),
    ("HistogramObserver", {"bins": 64, "reduce_range": True}),
    ("HistogramObserver", {"bins": 64, "reduce_range": True, "qscheme": "per_tensor_symmetric"}),  # torch's takes it
    ("HistogramObserver", {"bins": 64, "is_dynamic": True}),
    ("MinMaxObserver", {"reduce_range": True, "qscheme": "per_tensor_symmetric"}),  # torch's refuses it
    ("KLObserver", {"bins": 512}),
    ("KLObserver", {"bins": 512, "update_interval": 2}),
    ("KLObserver", {"bins": 64}),
    ("KLObserver", PER_CH_SYM),
    ("KLObserver", {"update_interval": 0}),
    ("MSEObserver", {"bins": 512}),
    ("MSEObserver", {"stride": 0}),
    ("MSEObserver", PER_CH_SYM),
    ("PercentileObserver", {"percentile": 99.0, "bins": 512}),
    ("PercentileObserver", {"percentile": 150.0}),
    ("PercentileObserver", {"percentile": 0.0}),
    ("MixObserver", {"bins": 512}),
    ("MixObserver", {"averaging_constant": 0.5, "dtype": "quint8", "qscheme": "per_tensor_affine", "bins": 512}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 3}),
    ("FixedQParamsObserver", {"scale": -1.0, "zero_point": 0}),
    ("FixedQParamsObserver", {"scale": [0.25], "zero_point": np.int64(2)}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 2.0}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 1.5}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": True}),
    ("FixedQParamsObserver", {"scale": True, "zero_point": 0}),
    ("FixedQParamsObserver", {"scale": "0.1", "zero_point": 0}),
    ("FixedQParamsObserver", {"scale": 1e300, "zero_point": 0}),
    ("FixedQParamsObserver", {"scale": [0.1, 0.2], "zero_point": 0}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 0, "dtype": "qint8", "quant_min": 0, "quant_max": 65535}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 0, "quant_min": None, "quant_max": None}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 0, "is_dynamic": True}),
    ("FixedQParamsObserver", {"scale": 0.1, "zero_point": 0, "is_dynamic": 0}),
    ("PlaceholderObserver", {}),
    ("NoopObserver", {}),
    ("PerGroupMinMaxObserver", {"group_size": 4}),
    ("PerGroupMinMaxObserver", {"group_size": 3}),
    ("PerGroupMinMaxObserver", {"dtype": "int8", "group_size": 8, "symmetric": True}),
    ("FP8Observer", {}),
    ("FP8Observer", {"dtype": "float8_e5m2"}),
    ("FP8Observer", {"dtype": "int8"}),
    ("PerBlockMXObserver", {"block_size": 8}),
    ("PerBlockMXObserver", {"dtype": "mxfp4", "block_size": 8}),
    ("PerBlockMXObserver", {"block_size": 0}),
    ("PerBlockBFPObserver", {}),
    ("PerBlockBFPObserver", {"block_size": 3}),
]

_rng = np.random.default_rng(0)
BATCHES = [(_rng.standard_normal((2, 4, 8)) * 10.0 ** _rng.uniform(-2, 2)).astype(np.float32) for _ in range(3)]
BATCHES.insert(1, np.zeros((0, 4, 8), np.float32))  # an empty batch: a no-op everywhere


def _torch_kwargs(kwargs: dict) -> dict:
    out = dict(kwargs)
    if out.get("dtype") in TORCH_DTYPES:
        out["dtype"] = TORCH_DTYPES[out["dtype"]]
    if isinstance(out.get("qscheme"), str) and isinstance(getattr(torch, out["qscheme"], None), torch.qscheme):
        out["qscheme"] = getattr(torch, out["qscheme"])
    return out


BACKENDS = {
    "numpy": (lambda name, kw: GENERIC[name](**kw), lambda a: a),
    "array_api_strict": (lambda name, kw: GENERIC[name](**kw, xp=array_api_strict), array_api_strict.asarray),
    "torch": (lambda name, kw: getattr(torch_observers, name)(**_torch_kwargs(kw)), torch.from_numpy),
    "jax": (lambda name, kw: getattr(jax_observers, name)(**kw), jnp.asarray),
}


def _outcome(make, name: str, kwargs: dict, convert) -> tuple:
    """``("rejected" | "failed", exception)`` or ``("ok", [qparams and range as float64 arrays])``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "must run observer" and torch's own warnings are not compared
        try:
            obs = make(name, kwargs)
        except Exception as e:  # noqa: BLE001  (the type is compared)
            return "rejected", e
        try:
            for batch in BATCHES:
                obs(convert(batch.copy()))
            q = obs.calculate_qparams()
        except Exception as e:  # noqa: BLE001
            return "failed", e
    values = list(q) if isinstance(q, tuple) else [q]
    values += [getattr(obs, k) for k in ("min_val", "max_val") if getattr(obs, k, None) is not None]
    return "ok", [np.asarray(v, dtype=np.float64) for v in values]


def _torch_ao_error(name: str, kwargs: dict) -> type | None:
    """The exception type the installed torch.ao class raises for this configuration and these batches."""
    cls = getattr(tao, name, None)
    if cls is None:
        return None
    outcome = _outcome(lambda n, kw: cls(**_torch_kwargs(kw)), name, kwargs, torch.from_numpy)
    return type(outcome[1]) if outcome[0] != "ok" else None


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_every_backend_agrees(name, kwargs):
    outcomes = {backend: _outcome(make, name, kwargs, convert) for backend, (make, convert) in BACKENDS.items()}
    kind, reference = outcomes["numpy"]
    for backend, (got_kind, got) in outcomes.items():
        assert got_kind == kind, (backend, got_kind, got, kind, reference)
        if kind == "ok":
            assert len(got) == len(reference), backend
            for a, b in zip(got, reference):
                np.testing.assert_array_equal(a, b, err_msg=f"{backend} {name} {kwargs}")
        elif not isinstance(got, type(reference)):
            allowed = _torch_ao_error(name, kwargs) if backend == "torch" else None
            assert allowed is not None and isinstance(got, allowed), (backend, got, reference, allowed)


def test_the_table_covers_every_public_observer_class():
    public = {n for n in jax_observers.__all__ if n.endswith("Observer") and n != "LowBitObserver"}
    assert public <= {name for name, _ in CASES}, public - {name for name, _ in CASES}
    make, convert = BACKENDS["numpy"]
    assert {_outcome(make, n, kw, convert)[0] for n, kw in CASES} == {"ok", "rejected", "failed"}


PER_CHANNEL_CASES = [(name, kw) for name, kw in CASES if kw.get("ch_axis") == 1 and _outcome(
    BACKENDS["numpy"][0], name, kw, BACKENDS["numpy"][1])[0] == "ok"]


@pytest.mark.parametrize(("name", "kwargs"), PER_CHANNEL_CASES, ids=[n for n, _ in PER_CHANNEL_CASES])
def test_another_channel_count_gives_one_message_on_every_backend(name, kwargs):
    """A per-channel observer that holds 4 channels refuses a batch with 5: ValueError, the same message
    on every backend (torch's min/max, calibration and the array observers share one check)."""
    messages = {}
    for backend, (make, convert) in BACKENDS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs = make(name, kwargs)
            obs(convert(BATCHES[0].copy()))
            with pytest.raises(ValueError) as err:
                obs(convert(np.ones((2, 5, 8), np.float32)))
        messages[backend] = str(err.value)
    assert set(messages.values()) == {
        "x has 5 channels along ch_axis=1 but the observer holds 4; "
        "call reset_min_max_vals() to observe a different channel count"}, messages


@pytest.mark.parametrize(("name", "kwargs"), PER_CHANNEL_CASES, ids=[n for n, _ in PER_CHANNEL_CASES])
def test_an_empty_batch_is_a_no_op_on_every_backend(name, kwargs):
    """An empty batch changes nothing and raises nothing on every backend, even one without the channel
    axis: every framework's observers run one observe step, which skips empty data before it looks at
    ``ch_axis`` (torch's calibration observers used to raise there, unlike the others)."""
    for backend, (make, convert) in BACKENDS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs = make(name, kwargs)
            obs(convert(BATCHES[0].copy()))
            before = [np.asarray(getattr(obs, k), dtype=np.float64) for k in ("min_val", "max_val")]
            empty = convert(np.zeros((0,), np.float32))
            assert obs(empty) is empty, backend
            after = [np.asarray(getattr(obs, k), dtype=np.float64) for k in ("min_val", "max_val")]
        for a, b in zip(after, before):
            np.testing.assert_array_equal(a, b, err_msg=backend)


#: The public classes with one declaration (docs/architecture.md): the generic class (signature, checks, steps)
#: and, per framework, a subclass that adds its storage; FixedQParamsObserver, PlaceholderObserver and
#: NoopObserver subclass torch's own classes on torch.
DECLARED_ONCE = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
                 "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "KLObserver", "MSEObserver",
                 "PercentileObserver", "MixObserver", "LowBitObserver", "PerGroupMinMaxObserver", "FP8Observer",
                 "PerBlockMXObserver", "PerBlockBFPObserver"]  # fmt: skip


def _frameworks() -> dict:
    """The public modules of the frameworks installed here (torch and JAX always, CuPy where present)."""
    import importlib.util

    modules = {"torch": torch_observers, "jax": jax_observers}
    if importlib.util.find_spec("cupy") is not None:
        import observers_core.adapters.cupy as cupy_observers

        modules["cupy"] = cupy_observers
    return modules


@pytest.mark.parametrize("name", DECLARED_ONCE)
def test_every_framework_has_the_generic_signature(name):
    """One declaration per public class: each framework's class (a plain class statement in its facade)
    subclasses the generic one and has its signature, parameter for parameter (names, kinds, defaults); the
    constructor is the generic class's own (no copy), so a bad keyword names the class itself."""
    import inspect

    generic = GENERIC[name]
    expected = [(p.name, p.kind, p.default) for p in inspect.signature(generic).parameters.values()]
    for framework, module in _frameworks().items():
        ours = getattr(module, name)
        assert issubclass(ours, generic), framework
        assert ours.__module__ == module.__name__ and ours.__qualname__ == name, framework
        assert ours.__init__ is generic.__init__, framework
        got = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
        assert got == expected, framework
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'bogus'"):
            ours(**({"dtype": "int4"} if name == "LowBitObserver" else {}), bogus=1)
    assert issubclass(torch_observers.__dict__[name], torch.nn.Module)


#: The arguments a class cannot be built without.
REQUIRED = {"FixedQParamsObserver": {"scale": 0.1, "zero_point": 0}}
#: Odd values for every constructor argument, one argument at a time (the rest at their defaults).
ODD_VALUES = [None, True, 1.5, -1, 0, 3, "x", 2**40, float("nan")]
#: Arguments of one framework only: the array observers' ``xp``/``device``; torch takes ``factory_kwargs``.
#: ``is_sync_quantize=True`` is torch's (torch.distributed sync, docs/distributed.md), ``NotImplementedError`` elsewhere.
BACKEND_ONLY = {"xp", "device"}


def _build_outcome(make, name: str, kwargs: dict) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            make(name, kwargs)
        except Exception as e:  # noqa: BLE001  (the type is compared)
            return type(e).__name__
    return "ok"


@pytest.mark.parametrize("name", sorted({name for name, _ in CASES}))
def test_every_argument_is_checked_alike_on_every_backend(name):
    """Every public class's constructor arguments, each given odd values (a bool, a float, None, a string,
    a huge int, NaN...) one at a time: numpy, JAX and torch accept the same values and refuse the others
    with the same exception type (the sweep that found the FixedQParams, factory_kwargs, is_dynamic and
    PlaceholderObserver drift between torch and the array observers)."""
    import inspect

    base = REQUIRED.get(name, {})
    params = [p for p in inspect.signature(GENERIC[name]).parameters.values()
              if p.kind is not p.VAR_KEYWORD and p.name not in BACKEND_ONLY]
    makers = {backend: BACKENDS[backend][0] for backend in ("numpy", "jax", "torch")}
    differ, count = [], 0
    for p in params:
        for value in ODD_VALUES:
            if p.name == "is_sync_quantize" and value is True:
                continue
            kwargs = {**base, p.name: value}
            outcomes = {backend: _build_outcome(make, name, kwargs) for backend, make in makers.items()}
            count += 1
            if len(set(outcomes.values())) > 1:
                differ.append((p.name, value, outcomes))
    assert count >= 9, count
    assert not differ, differ


#: Constructor arguments that make a class per channel / per group (the table's defaults are per tensor).
_GRANULAR = {"PerChannelMinMaxObserver": {"ch_axis": 1}, "MovingAveragePerChannelMinMaxObserver": {"ch_axis": 1},
             "KLObserver": PER_CH_SYM, "MSEObserver": PER_CH_SYM, "MixObserver": {**PER_CH_SYM, "ch_axis": 0},
             "PerGroupMinMaxObserver": {"group_size": 4}, "PerBlockMXObserver": {"block_size": 8}, **REQUIRED}  # fmt: skip


@pytest.mark.parametrize("kind", ["nan", "inf", "float32_max", "subnormal", "wide"])
def test_numpy_observers_are_as_quiet_as_torchs(kind):
    """NaN, inf, huge, subnormal and wide batches give NaN/inf/clipped results silently on every backend:
    NumPy's floating-point RuntimeWarnings (overflow in a range's width, invalid casts of NaN, a KL
    histogram's edges beyond float32) came from the numpy observers only (calculate_qparams,
    group_qparams, the calibration histogram's re-binning, which torch's calibration observers run too)."""
    names = sorted({n for n, _ in CASES} - {"PlaceholderObserver", "NoopObserver"})
    for (backend, (make, convert)), name in itertools.product([(b, BACKENDS[b]) for b in ("numpy", "torch")], names):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the observers' own UserWarnings are not the point
            warnings.simplefilter("error", RuntimeWarning)
            obs = make(name, _GRANULAR.get(name, {}))
            for k in (kind, "normal", kind):
                obs(convert(make_batch(k, 0, (4, 8), "float32")))
            obs.calculate_qparams()


def test_a_channel_that_saw_no_finite_value_gets_scale_one_on_every_backend():
    """Per channel with ``ignore_nonfinite=True``, a channel that saw only NaN keeps ``(+inf, -inf)``: every
    backend gives it scale 1 and zero point 0, the other channels their own qparams (torch.ao's
    ``calculate_qparams`` raises ``AssertionError`` for such a state). The torch observers also warn; the
    array observers do not read the state on the host in ``calculate_qparams`` (JAX, CuPy) and stay silent."""
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    x[:, 2, :] = np.nan
    for backend, (make, convert) in BACKENDS.items():
        obs = make("PerChannelMinMaxObserver", {"ch_axis": 1, "ignore_nonfinite": True})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            obs(convert(x.copy()))
            scale, zero_point = (np.asarray(v) for v in obs.calculate_qparams())
        assert scale[2] == 1.0 and zero_point[2] == 0 and np.all(scale[[0, 1, 3]] != 1.0), (backend, scale)
        warned = any("seen no finite value" in str(w.message) for w in caught)
        assert warned == (backend == "torch"), backend
    theirs = tao.PerChannelMinMaxObserver(ch_axis=1)
    theirs.min_val, theirs.max_val = torch.tensor([-1.0, -1.0, np.inf, -1.0]), torch.tensor([1.0, 1.0, -np.inf, 1.0])
    with pytest.raises(AssertionError):
        theirs.calculate_qparams()
