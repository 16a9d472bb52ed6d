"""The torch HistogramObserver's constructor rules, enumerated against the installed torch 2.13.

Every combination of dtype x qscheme x reduce_range x custom range x is_dynamic (and the other arguments
one at a time) is built with torch's class and ours: the accepted sets must be equal, apart from the
deliberate differences listed in ``DELIBERATE`` (each with its reason), and accepted configurations must
resolve to torch's quant_min/quant_max.
"""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.ao.quantization.observer import HistogramObserver as TorchHistogramObserver  # noqa: E402

from observers_core.adapters.torch import HistogramObserver  # noqa: E402

I32 = (-(2**31), 2**31 - 1)

#: (reason, predicate on the keyword arguments) for configurations torch accepts and ours rejects.
DELIBERATE = [
    ("zero points are int32: a custom range must lie within int32",
     lambda kw: kw.get("quant_min") is not None and kw.get("quant_max") is not None
     and not (I32[0] <= kw["quant_min"] and kw["quant_max"] <= I32[1])),
    ("bins outside [1, 2**24]: torch fails later (empty histogram) or counts stop being exact in float32",
     lambda kw: "bins" in kw and not (isinstance(kw["bins"], int) and 1 <= kw["bins"] <= 2**24)),
    ("eps must be positive and finite (torch takes any and gives a zero/NaN scale later)",
     lambda kw: "eps" in kw and not (isinstance(kw["eps"], float) and 0 < kw["eps"] < float("inf"))),
    ("reduce_range must be a bool (torch takes any truthy value)",
     lambda kw: "reduce_range" in kw and not isinstance(kw["reduce_range"], bool)),
    ("a custom range that reduce_range halves to one level ([0, 1] -> [0, 0]; torch gives scale = inf)",
     lambda kw: kw.get("reduce_range") is True and (kw.get("quant_min"), kw.get("quant_max")) == (0, 1)),
    ("is_dynamic must be a bool (torch takes any value's truthiness)",
     lambda kw: "is_dynamic" in kw and not isinstance(kw["is_dynamic"], bool)),
]  # fmt: skip

DTYPES = [torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.quint2x4, torch.uint8, torch.int8,
          torch.int16, torch.uint16, torch.int32, torch.float8_e4m3fn, torch.float16, torch.float32]  # fmt: skip
QSCHEMES = [torch.per_tensor_affine, torch.per_tensor_symmetric, torch.per_channel_affine,
            torch.per_channel_symmetric, torch.per_channel_affine_float_qparams]  # fmt: skip
RANGES = [(None, None), (0, 127), (-128, 127), (0, 255), (-64, 63), (0, 15), (-8, 7), (0, 65535), I32,
          (0, 2**31), (5, 3), (0, 0), (-1, 300), (0, None), (0, 1)]  # fmt: skip
SINGLE = [{"bins": b} for b in (1, 0, -1, 3.0, True, 2**24, 2**24 + 1)] + \
    [{"eps": e} for e in (1e-3, 0.0, -1.0, float("nan"), float("inf"))] + \
    [{"factory_kwargs": f} for f in (None, {"device": "cpu"}, {"dtype": torch.float32})] + \
    [{"reduce_range": r} for r in (True, 1, None)] + [{"is_dynamic": d} for d in (0, None)] + \
    [{"factory_kwargs": 3}]  # fmt: skip


def _build(cls, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls(**kw), None
        except Exception as e:  # noqa: BLE001 - the outcome is what is compared
            return None, e


def _configs():
    for d, q, rr, (lo, hi), dyn in itertools.product(DTYPES, QSCHEMES, [False, True], RANGES, [False, True]):
        yield {"dtype": d, "qscheme": q, "reduce_range": rr, "quant_min": lo, "quant_max": hi, "is_dynamic": dyn}
    yield from SINGLE


def test_accepted_configurations_are_torchs():
    mismatches, deliberate_seen = [], set()
    for kw in _configs():
        theirs, their_error = _build(TorchHistogramObserver, kw)
        ours, our_error = _build(HistogramObserver, kw)
        if ours is not None and theirs is not None:
            assert (ours.quant_min, ours.quant_max) == (theirs.quant_min, theirs.quant_max), kw
            continue
        if ours is None and theirs is None:
            assert isinstance(our_error, (ValueError, TypeError)), (kw, our_error)
            continue
        reasons = [reason for reason, rule in DELIBERATE if rule(kw)]
        if ours is None and reasons:
            assert isinstance(our_error, (ValueError, TypeError)), (kw, our_error)
            deliberate_seen.update(reasons)
            continue
        mismatches.append((kw, their_error, our_error))
    assert not mismatches, mismatches[:10]
    assert deliberate_seen == {reason for reason, _ in DELIBERATE}  # each listed difference is real


def test_symmetric_quint8_with_reduce_range_is_accepted_and_matches_torch():
    """torch's HistogramObserver (unlike MinMaxObserver) accepts symmetric quint8 with reduce_range."""
    gen = torch.Generator().manual_seed(0)
    for lo, hi in [(None, None), (0, 127), (0, 255)]:
        kw = dict(qscheme=torch.per_tensor_symmetric, reduce_range=True, quant_min=lo, quant_max=hi, bins=256)
        theirs, ours = TorchHistogramObserver(**kw), HistogramObserver(**kw)
        for i in range(3):
            x = torch.randn(500, generator=gen) * (i + 1) + 0.5
            theirs(x)
            ours(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (s1, z1), (s2, z2) = theirs.calculate_qparams(), ours.calculate_qparams()
        assert torch.equal(s1, s2) and torch.equal(z1, z2) and z1.dtype == z2.dtype, (kw, s1, z1, s2, z2)
