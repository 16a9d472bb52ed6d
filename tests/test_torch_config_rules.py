"""The torch min/max, FixedQParams and Placeholder observers' constructor rules, enumerated against the
installed torch 2.13 (the HistogramObserver's are in tests/test_histogram_config_rules.py).

Every combination of dtype x qscheme x reduce_range x custom range x is_dynamic (and the other arguments
one at a time) is built with torch's class and ours. The accepted sets must be equal, apart from the
deliberate differences in ``DELIBERATE`` (each with its reason, each seen at least once); accepted
configurations must resolve to torch's attributes; where both refuse, ours raises ``ValueError``/
``TypeError`` or torch's own exception type (``NotImplementedError``).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.ao.quantization import observer as torch_ao  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402

I32 = (-(2**31), 2**31 - 1)
DTYPES = [torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.quint2x4, torch.uint8, torch.int8,
          torch.int16, torch.uint16, torch.int32, torch.float8_e4m3fn, torch.float16, torch.float32]  # fmt: skip
QSCHEMES = [torch.per_tensor_affine, torch.per_tensor_symmetric, torch.per_channel_affine,
            torch.per_channel_symmetric, torch.per_channel_affine_float_qparams]  # fmt: skip
RANGES = [(None, None), (0, 127), (-128, 127), (0, 255), (-64, 63), (0, 15), (-8, 7), (0, 65535), I32,
          (0, 2**31), (5, 3), (0, 0), (-1, 300), (0, None), (0, 1)]  # fmt: skip


def _not_float_in(lo, hi):
    return lambda v: isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi)


#: reason -> predicate on the keyword arguments, for configurations torch accepts and ours refuses.
MINMAX_DELIBERATE = {
    "zero points are int32: a custom range must lie within int32":
        lambda kw: kw.get("quant_min") is not None and kw.get("quant_max") is not None
        and not (I32[0] <= kw["quant_min"] and kw["quant_max"] <= I32[1]),
    "eps must be a positive finite float32 normal (torch takes any and gives a zero/NaN scale later)":
        lambda kw: "eps" in kw and not (isinstance(kw["eps"], float) and 2.0**-126 <= kw["eps"] < math.inf),
    "reduce_range must be a bool (torch takes any truthy value)":
        lambda kw: "reduce_range" in kw and not isinstance(kw["reduce_range"], bool),
    "a custom range that reduce_range halves to one level ([0, 1] -> [0, 0]; torch gives scale = inf)":
        lambda kw: kw.get("reduce_range") is True and (kw.get("quant_min"), kw.get("quant_max")) == (0, 1),
    "averaging_constant must be a float in [0, 1] (torch extrapolates outside)":
        lambda kw: "averaging_constant" in kw and (
            _not_float_in(0.0, 1.0)(kw["averaging_constant"]) or math.isnan(kw["averaging_constant"])),
    "ch_axis must be an int (torch takes a float or bool and fails at the first batch)":
        lambda kw: "ch_axis" in kw and (isinstance(kw["ch_axis"], bool) or not isinstance(kw["ch_axis"], int)),
    "is_dynamic must be a bool (torch takes any value's truthiness)":
        lambda kw: not isinstance(kw.get("is_dynamic", False), bool),
}  # fmt: skip
FIXED_DELIBERATE = {
    "per-channel qschemes: one fixed scale is per tensor (torch keeps the qscheme and quantizes per tensor)":
        lambda kw: kw["qscheme"] not in (torch.per_tensor_affine, torch.per_tensor_symmetric),
    "dtype must be a quantized integer dtype (torch takes float16/float32/quint2x4 and fails at convert)":
        lambda kw: kw["dtype"] in (torch.float16, torch.float32, torch.quint2x4),
    "quant_min < quant_max with 0 in the range":
        lambda kw: not (kw["quant_min"] < kw["quant_max"] and kw["quant_min"] <= 0 <= kw["quant_max"]),
    "scale must be a number, not a bool, positive and finite in float32 (torch stores inf, 0 or NaN)":
        lambda kw: isinstance(kw["scale"], bool) or not 0 < np.float32(kw["scale"]) < math.inf,
    "zero_point must be an integer, not a bool, in [quant_min, quant_max] (torch truncates 1.5 to 1)":
        lambda kw: isinstance(kw["zero_point"], bool) or kw["zero_point"] != int(kw["zero_point"])
        or not kw["quant_min"] <= kw["zero_point"] <= kw["quant_max"],
    "a custom range longer than the dtype's (8-bit: 256 values; 32-bit: 2**32), or an affine one beyond int32 "
    "(the min/max observers' rules, quant_spec's; torch's FixedQParams takes any)":
        lambda kw: kw["quant_max"] - kw["quant_min"] + 1 > 256 or kw["quant_max"] >= 2**31,
    "is_dynamic must be a bool (torch takes any value's truthiness)":
        lambda kw: not isinstance(kw.get("is_dynamic", False), bool),
}  # fmt: skip

PLACEHOLDER_DELIBERATE = {
    "qscheme must be a quantization scheme and eps a float (torch stores any value)":
        lambda kw: not isinstance(kw.get("qscheme", torch.per_tensor_affine), torch.qscheme)
        or not isinstance(kw.get("eps", 0.0), (float, type(None))),
}  # fmt: skip


def _build(cls, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls(**kw), None
        except Exception as e:  # noqa: BLE001 - the outcome is what is compared
            return None, e


def _minmax_configs(name):
    for d, q, rr, (lo, hi), dyn in itertools.product(DTYPES, QSCHEMES, [False, True], RANGES, [False, True]):
        yield {"dtype": d, "qscheme": q, "reduce_range": rr, "quant_min": lo, "quant_max": hi, "is_dynamic": dyn}
    yield from ({"eps": e} for e in (1e-3, 2.0**-126, 0.0, -1.0, 1e-40, float("nan"), float("inf")))
    yield from ({"factory_kwargs": f} for f in (None, {"device": "cpu"}, {"dtype": torch.float32}))
    yield from ({"reduce_range": r} for r in (True, 1, None))
    yield from ({"is_dynamic": d} for d in (0, None))
    yield {"factory_kwargs": 3}
    if "MovingAverage" in name:
        yield from ({"averaging_constant": a} for a in (0.0, 0.5, 1.0, 1, 1.5, -0.1, float("nan"), True))
    if "PerChannel" in name:
        yield from ({"ch_axis": c} for c in (0, 1, -1, 3, 1.0, True))


def _fixed_configs():
    ranges = [(0, 255), (-128, 127), (0, 127), (5, 3), (0, 0)]
    scales = [1 / 128, 2.0, 1, np.float32(0.25), 0.0, -1.0, math.inf, 1e300, 1e-50, True]
    for d, q, (lo, hi), s, z in itertools.product(DTYPES, QSCHEMES, ranges, scales,
                                                  [0, 64, 128, 2.0, np.int64(5), -1, 300, 1.5, True]):
        yield {"scale": s, "zero_point": z, "dtype": d, "qscheme": q, "quant_min": lo, "quant_max": hi}
    for d, (lo, hi) in itertools.product(DTYPES, [(0, 65535), (-(2**31), 2**31 - 1), (0, 2**31)]):
        yield {"scale": 0.5, "zero_point": 0, "dtype": d, "qscheme": torch.per_tensor_affine, "quant_min": lo,
               "quant_max": hi}
    for dyn in (0, None, True):
        yield {"scale": 0.5, "zero_point": 0, "dtype": torch.quint8, "qscheme": torch.per_tensor_affine,
               "quant_min": 0, "quant_max": 255, "is_dynamic": dyn}


def _placeholder_configs():
    for d, compute, qmin, dyn in itertools.product(DTYPES + [torch.bfloat16], [None, torch.float16, torch.float32],
                                                   [None, 0, -128], [False, True]):
        yield {"dtype": d, "compute_dtype": compute, "quant_min": qmin, "is_dynamic": dyn}
    yield from ({"qscheme": q} for q in (*QSCHEMES, "per_row", 3))
    yield from ({"eps": e} for e in (1e-3, "small", None))


ATTRIBUTES = ("dtype", "qscheme", "quant_min", "quant_max", "is_dynamic", "reduce_range", "ch_axis",
              "averaging_constant", "scale", "zero_point", "compute_dtype")  # fmt: skip


def _attributes(obs):
    out = {}
    for name in ATTRIBUTES:
        value = getattr(obs, name, None)
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        out[name] = value
    out["eps"] = float(obs.eps) if hasattr(obs, "eps") else None
    return out


CASES = {
    "MinMaxObserver": (_minmax_configs, MINMAX_DELIBERATE),
    "MovingAverageMinMaxObserver": (_minmax_configs, MINMAX_DELIBERATE),
    "PerChannelMinMaxObserver": (_minmax_configs, MINMAX_DELIBERATE),
    "MovingAveragePerChannelMinMaxObserver": (_minmax_configs, MINMAX_DELIBERATE),
    "FixedQParamsObserver": (lambda name: _fixed_configs(), FIXED_DELIBERATE),
    "PlaceholderObserver": (lambda name: _placeholder_configs(), PLACEHOLDER_DELIBERATE),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_accepted_configurations_are_torchs(name):
    configs, deliberate = CASES[name]
    deliberate = {reason: rule for reason, rule in deliberate.items()
                  if ("averaging_constant" not in reason or "MovingAverage" in name)
                  and ("ch_axis" not in reason or "PerChannel" in name)}
    theirs_cls, ours_cls = getattr(torch_ao, name), getattr(ours, name)
    mismatches, seen, count = [], set(), 0
    for kw in configs(name):
        count += 1
        theirs, their_error = _build(theirs_cls, kw)
        mine, my_error = _build(ours_cls, kw)
        if mine is not None and theirs is not None:
            if _attributes(mine) != _attributes(theirs):
                mismatches.append(("attributes", kw, _attributes(theirs), _attributes(mine)))
            continue
        if mine is None and theirs is None:
            if not isinstance(my_error, (ValueError, TypeError, type(their_error))):
                mismatches.append(("error type", kw, their_error, my_error))
            continue
        reasons = [reason for reason, rule in deliberate.items() if rule(kw)]
        if mine is None and reasons and isinstance(my_error, (ValueError, TypeError)):
            seen.update(reasons)
            continue
        mismatches.append(("accepted by one only", kw, their_error, my_error))
    assert count > 200
    assert not mismatches, mismatches[:10]
    assert seen == set(deliberate), set(deliberate) - seen  # each listed difference is real
