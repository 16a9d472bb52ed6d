"""Configuration: quantized dtypes, schemes and ranges resolved and validated exactly as torch does."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from torch.ao.quantization.utils import calculate_qmin_qmax as torch_calculate_qmin_qmax
from torch.ao.quantization.utils import validate_qmin_qmax as torch_validate_qmin_qmax

import observers_core as oc

RANGES = [None, (0, 255), (-128, 127), (-64, 63), (0, 15), (-100, 120), (-(2**31), 2**31 - 1), (0, 300),
          (-200, 200), (1, 5), (-5, -1), (3, 3), (5, 2), (0, 2**32)]


@pytest.mark.parametrize("dtype", oc.QUANT_DTYPES)
def test_ranges_match_torch(dtype):
    torch_dtype = getattr(torch, dtype)
    for rng, reduce_range in itertools.product(RANGES, (False, True)):
        qmin, qmax = rng if rng else (None, None)
        custom = rng is not None
        try:
            if custom:
                torch_validate_qmin_qmax(qmin, qmax)
            expected = torch_calculate_qmin_qmax(qmin, qmax, custom, torch_dtype, reduce_range)
        except AssertionError:
            with pytest.raises(ValueError):
                oc.quant_spec(dtype, reduce_range=reduce_range, quant_min=qmin, quant_max=qmax)
            continue
        if not -(2**31) <= expected[0] <= expected[1] < 2**31:  # deliberate: see the next test
            with pytest.raises(ValueError, match="affine zero points are int32"):
                oc.quant_spec(dtype, reduce_range=reduce_range, quant_min=qmin, quant_max=qmax)
            continue
        spec = oc.quant_spec(dtype, reduce_range=reduce_range, quant_min=qmin, quant_max=qmax)
        assert (spec.quant_min, spec.quant_max) == expected, (dtype, rng, reduce_range)
        assert spec.has_customized_qrange is custom


def test_affine_range_beyond_int32_is_rejected():
    """torch accepts it and returns a wrapped-around int32 zero point; we refuse it up front."""
    with pytest.raises(ValueError, match="affine zero points are int32"):
        oc.quant_spec("quint8", quant_min=-(2**31), quant_max=2**31)
    with pytest.raises(ValueError, match="affine zero points are int32"):
        oc.quant_spec("int32", quant_min=0, quant_max=2**32 - 1)
    assert oc.quant_spec("int32", "per_tensor_symmetric", quant_min=0, quant_max=2**32 - 1).quant_max == 2**32 - 1


ONE_LEVEL = r"quant_min=0, quant_max=1 with reduce_range=True leave one level \[0, 0\]"


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "uint8", "int8", "qint32", "int16", "uint16", "quint4x2"])
@pytest.mark.parametrize("qscheme", ["per_tensor_affine", "per_tensor_symmetric", "per_channel_affine"])
def test_range_reduced_to_one_level_is_refused(dtype, qscheme):
    """torch.ao halves [0, 1] to [0, 0] and returns scale = inf; we refuse it naming the arguments."""
    assert torch_calculate_qmin_qmax(0, 1, True, getattr(torch, dtype), True) == (0, 0)  # torch's range
    with pytest.raises(ValueError, match=ONE_LEVEL):
        oc.quant_spec(dtype, qscheme, reduce_range=True, quant_min=0, quant_max=1)
    assert (oc.quant_spec(dtype, qscheme, quant_min=0, quant_max=1).quant_max,  # two levels stay accepted
            oc.quant_spec(dtype, qscheme, reduce_range=True, quant_min=-1, quant_max=0).quant_min,
            oc.quant_spec(dtype, qscheme, reduce_range=True, quant_min=0, quant_max=2).quant_max) == (1, -1, 1)


def _reduce_range_classes():
    """Every public observer class taking ``reduce_range``, per CPU framework (cupy where it imports)."""
    import importlib.util
    import inspect

    from observers_core.adapters import _array_calibration, _array_histogram, _array_lowbit, _array_observers
    from observers_core.adapters import jax as jobs
    from observers_core.adapters import torch as tobs

    modules = [("generic", None), ("torch", tobs), ("jax", jobs)]
    if importlib.util.find_spec("cupy") is not None:
        from observers_core.adapters import cupy as cobs

        modules.append(("cupy", cobs))
    cases = []
    generics = [getattr(m, name) for m in (_array_observers, _array_histogram, _array_calibration, _array_lowbit)
                for name in m.__all__ if isinstance(getattr(m, name), type) and name.endswith("Observer")
                and "Base" not in name and name != "LowBitObserver"]
    for generic in generics:
        if "reduce_range" not in inspect.signature(generic).parameters:
            continue
        for framework, mod in modules:
            cls = generic if mod is None else getattr(mod, generic.__name__)
            cases.append(pytest.param(cls, id=f"{framework}-{generic.__name__}"))
    return cases


@pytest.mark.parametrize("cls", _reduce_range_classes())
def test_observer_with_range_reduced_to_one_level_is_refused_at_construction(cls):
    per_channel = "PerChannel" in cls.__name__
    qscheme = "per_channel_affine" if per_channel else "per_tensor_affine"
    if cls.__module__.endswith("torch"):
        qscheme = getattr(torch, qscheme)
    with pytest.raises(ValueError, match=ONE_LEVEL):
        cls(quant_min=0, quant_max=1, reduce_range=True, qscheme=qscheme)
    cls(quant_min=0, quant_max=2, reduce_range=True, qscheme=qscheme)  # [0, 1]: two levels, accepted


def test_only_one_bound_given_is_ignored_as_in_torch():
    spec = oc.quant_spec("qint8", quant_min=-10)
    assert (spec.quant_min, spec.quant_max, spec.has_customized_qrange) == (-128, 127, False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "int4"}, "dtype='int4' is not a supported quantized dtype; allowed: qint8"),
        ({"dtype": "float32"}, "dtype="),
        ({"qscheme": "per_block"}, "qscheme='per_block' is not a known quantization scheme; allowed:"),
        ({"quant_min": 5, "quant_max": 2}, r"must include 0"),
        ({"quant_min": 0, "quant_max": 0}, r"quant_min=0 must be strictly less than quant_max=0"),
        ({"quant_min": 1, "quant_max": 10}, r"\[quant_min=1, quant_max=10\] must include 0"),
        ({"dtype": "qint8", "quant_min": -200, "quant_max": 200}, "must be positive and not exceed the 8-bit"),
        ({"eps": -1.0}, "eps=-1.0 must be a positive finite float"),
    ],
)
def test_invalid_configuration_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        oc.quant_spec(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"quant_min": 0.5, "quant_max": 10}, "quant_min must be an int"), ({"reduce_range": "yes"}, "reduce_range"),
     ({"eps": "small"}, "eps must be a float")],
)
def test_wrong_types_raise_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        oc.quant_spec(**kwargs)


def test_names_and_torch_prefixed_names_are_accepted():
    assert oc.quant_spec("torch.qint8", "torch.per_channel_symmetric") == oc.quant_spec(
        "qint8", oc.QScheme.PER_CHANNEL_SYMMETRIC)
    assert oc.QScheme.parse("per_tensor_affine").is_per_tensor
    assert oc.QScheme.PER_CHANNEL_SYMMETRIC.is_symmetric and oc.QScheme.PER_CHANNEL_SYMMETRIC.is_per_channel


def test_spec_is_hashable_for_jit():
    assert hash(oc.quant_spec()) == hash(oc.quant_spec())


def test_import_observers_core_imports_no_framework():
    code = (
        "import sys, observers_core, observers_core.adapters;"
        "bad = [m for m in ('torch', 'jax', 'jaxlib', 'cupy', 'tensorflow') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_api_is_listed():
    for name in oc.__all__:
        assert hasattr(oc, name), name
    assert oc.__version__
