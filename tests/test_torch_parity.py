"""Parity of ``observers_core.adapters.torch`` with the installed ``torch.ao.quantization.observer``.

The anchor is torch itself: every configuration is built in both, the same batches go through both,
and after every batch the ``min_val``/``max_val`` buffers, the scale (bit for bit, NaN-aware) and the
zero point (value, dtype and shape) must agree; where torch refuses a configuration or an input, ours
must refuse it too (``NotImplementedError`` where torch raises it, ``ValueError``/``TypeError`` where
torch raises ``AssertionError``/``IndexError``/``RuntimeError``).
"""

from __future__ import annotations

import itertools
import random
import warnings
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402
from torch.ao.quantization import observer as tobs  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402

CLASSES = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
           "MovingAveragePerChannelMinMaxObserver"]
PER_CHANNEL = {"PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"}
DTYPES = [torch.qint8, torch.quint8, torch.quint4x2, torch.qint32, torch.int8, torch.uint8, torch.int16,
          torch.uint16, torch.int32, torch.float8_e4m3fn, torch.float8_e5m2]
QSCHEMES = [torch.per_tensor_affine, torch.per_tensor_symmetric, torch.per_channel_affine,
            torch.per_channel_symmetric, torch.per_channel_affine_float_qparams]
# (quant_min, quant_max): default, valid custom ranges, one-sided (ignored, as in torch), invalid ones.
RANGES = [(None, None), (0, 127), (-127, 127), (-8, 7), (0, 15), (0, 255), (-128, 127), (None, 127),
          (-(2**31), 2**31 - 1), (0, 65535), (1, 10), (-10, -1), (5, 3), (0, 0), (-200, 200),
          (-(2**31), 2**31)]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The tensors here are tiny: with one intra-op thread torch never waits for a second thread to be
    scheduled on a busy machine (10x faster on 2 loaded cores); min/max do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_bitwise_equal(expected: torch.Tensor, actual: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape, device and bits (floats: same NaN positions, identical bits elsewhere)."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.device == expected.device, f"{what}: device {actual.device} != {expected.device}"
    if expected.dtype.is_floating_point:
        nan_e, nan_a = torch.isnan(expected), torch.isnan(actual)
        assert torch.equal(nan_e, nan_a), f"{what}: NaN positions differ: {expected} vs {actual}"
        bits = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                torch.bfloat16: torch.int16}[expected.dtype]
        e, a = expected[~nan_e].view(bits), actual[~nan_a].view(bits)
        assert torch.equal(e, a), f"{what}: {expected} != {actual}"
    else:
        assert torch.equal(expected, actual), f"{what}: {expected} != {actual}"


def _kwargs(cls_name, dtype, qscheme, reduce_range, qrange, ch_axis=0, averaging_constant=0.25):
    kwargs = dict(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range)
    if qrange[0] is not None:
        kwargs["quant_min"] = qrange[0]
    if qrange[1] is not None:
        kwargs["quant_max"] = qrange[1]
    if cls_name in PER_CHANNEL:
        kwargs["ch_axis"] = ch_axis
    if cls_name.startswith("MovingAverage"):
        kwargs["averaging_constant"] = averaging_constant
    return kwargs


def _build(module, cls_name, kwargs):
    """The observer, or the exception its constructor raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return getattr(module, cls_name)(**kwargs)
        except Exception as exc:  # noqa: BLE001  (the kind is compared below)
            return exc


def _same_failure_kind(torch_exc: BaseException, our_exc: BaseException) -> bool:
    """Where torch raises ``NotImplementedError`` ours is one too (``UnsupportedConfigError``, which is also
    a ``ValueError``); elsewhere ours is a ``ValueError``/``TypeError`` and not a ``NotImplementedError``."""
    if isinstance(torch_exc, NotImplementedError):
        return isinstance(our_exc, NotImplementedError)
    return isinstance(our_exc, (ValueError, TypeError)) and not isinstance(our_exc, NotImplementedError)


CONFIG_GRID = list(itertools.product(CLASSES, DTYPES, QSCHEMES, (False, True), RANGES))


def _valid_configs():
    valid = []
    for cls_name, dtype, qscheme, reduce_range, qrange in CONFIG_GRID:
        kwargs = _kwargs(cls_name, dtype, qscheme, reduce_range, qrange)
        if not isinstance(_build(ours, cls_name, kwargs), Exception):
            valid.append((cls_name, dtype, qscheme, reduce_range, qrange))
    return valid


def _fails_on_first_qparams(observer) -> bool:
    """Whether torch's observer, accepted at construction, cannot compute qparams for a batch."""
    observer(torch.randn(2, 3))
    try:
        observer.calculate_qparams()
    except RuntimeError:
        return True
    return False


VALID_CONFIGS = _valid_configs()


def test_config_grid_accepts_and_rejects_like_torch():
    """Every dtype x qscheme x reduce_range x range x class: same acceptance, same resolved config."""
    n_ok = n_failed = 0
    for cls_name, dtype, qscheme, reduce_range, qrange in CONFIG_GRID:
        kwargs = _kwargs(cls_name, dtype, qscheme, reduce_range, qrange)
        theirs, mine = _build(tobs, cls_name, kwargs), _build(ours, cls_name, kwargs)
        where = f"{cls_name}({kwargs})"
        if isinstance(theirs, Exception):
            n_failed += 1
            assert isinstance(mine, Exception), f"{where}: torch raised {theirs!r}, ours accepted it"
            assert _same_failure_kind(theirs, mine), f"{where}: torch {theirs!r} vs ours {mine!r}"
            continue
        if isinstance(mine, Exception):
            # ours refuses early a range that torch accepts but then fails on (out of int32)
            assert isinstance(mine, ValueError) and _fails_on_first_qparams(theirs), f"{where}: ours raised {mine!r}"
            n_failed += 1
            continue
        n_ok += 1
        for attr in ("dtype", "qscheme", "reduce_range", "quant_min", "quant_max", "has_customized_qrange",
                     "is_dynamic", "ch_axis", "averaging_constant"):
            assert getattr(mine, attr, None) == getattr(theirs, attr, None), f"{where}: {attr}"
        assert mine.state_dict().keys() == theirs.state_dict().keys()
        for key, value in theirs.state_dict().items():
            assert_bitwise_equal(value, mine.state_dict()[key], f"{where}: {key}")
    # the grid holds both kinds, and every invalid range fails
    assert n_ok > 300 and n_failed > 300


# -- data ------------------------------------------------------------------------------------------

INPUT_KINDS = ["normal", "wide", "constant", "zeros", "all_negative", "all_positive", "subnormal", "near_max",
               "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "nan", "inf", "empty"]


def make_batch(kind: str, shape: tuple, rng: np.random.Generator) -> torch.Tensor:
    """A batch of the given kind; every kind is an ordinary case the observers must handle."""
    normal = np.asarray(rng.standard_normal(shape))
    if kind == "empty":
        shape = (0,) + tuple(shape[1:]) if len(shape) else (0,)
        return torch.empty(shape)
    if kind == "normal":
        return torch.from_numpy(normal.astype(np.float32))
    if kind == "wide":
        return torch.from_numpy(np.asarray(normal * 10.0 ** rng.uniform(-6, 6), dtype=np.float32))
    if kind == "constant":
        return torch.full(shape, float(rng.uniform(-3, 3)), dtype=torch.float32)
    if kind == "zeros":
        return torch.zeros(shape)
    if kind == "all_negative":
        return torch.from_numpy(np.asarray(-np.abs(normal) - 0.5, dtype=np.float32))
    if kind == "all_positive":
        return torch.from_numpy(np.asarray(np.abs(normal) + 0.5, dtype=np.float32))
    if kind == "subnormal":
        return torch.from_numpy(np.asarray(normal * 1e-41, dtype=np.float32))
    if kind == "near_max":
        return torch.from_numpy(np.asarray(np.clip(normal, -1, 1) * 3.4e38, dtype=np.float32))
    if kind in ("float16", "bfloat16", "float64"):
        return torch.from_numpy(np.asarray(normal * 100)).to(getattr(torch, kind))
    if kind in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(kind)
        lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
        return torch.from_numpy(np.asarray(rng.integers(lo, hi, size=shape, endpoint=True), dtype=kind))
    x = normal.astype(np.float32)
    if x.size:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 4), replace=False)
        flat[idx] = np.nan if kind == "nan" else rng.choice([np.inf, -np.inf], size=idx.size)
    return torch.from_numpy(x)


def _compare_qparams(theirs, mine, where):
    """Both give the same qparams, or both refuse (torch AssertionError <-> ours ValueError)."""
    with warnings.catch_warnings(record=True) as w_theirs:
        warnings.simplefilter("always")
        try:
            expected = theirs.calculate_qparams()
        except AssertionError:
            expected = None
    with warnings.catch_warnings(record=True) as w_mine:
        warnings.simplefilter("always")
        if expected is None:
            with pytest.raises(ValueError):
                mine.calculate_qparams()
            return
        actual = mine.calculate_qparams()
    assert [str(w.message) for w in w_mine] == [str(w.message) for w in w_theirs], where
    assert_bitwise_equal(expected[0], actual[0], f"{where}: scale")
    assert_bitwise_equal(expected[1], actual[1], f"{where}: zero_point")


def _run_case(seed: int):
    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    cls_name, dtype, qscheme, reduce_range, qrange = pyrng.choice(VALID_CONFIGS)
    per_channel = cls_name in PER_CHANNEL
    ndim = pyrng.randint(2, 4) if per_channel else pyrng.randint(0, 4)
    shape = tuple(pyrng.randint(1, 5) for _ in range(ndim))
    ch_axis = pyrng.randint(-ndim, ndim - 1) if per_channel else 0
    kwargs = _kwargs(cls_name, dtype, qscheme, reduce_range, qrange, ch_axis=ch_axis,
                     averaging_constant=pyrng.choice([0.01, 0.25, 1.0]))
    theirs, mine = _build(tobs, cls_name, kwargs), _build(ours, cls_name, kwargs)
    for step in range(3):
        kind = pyrng.choice(INPUT_KINDS)
        # per tensor the shape may change from batch to batch; per channel only the other axes
        if not per_channel and pyrng.random() < 0.3:
            shape = tuple(pyrng.randint(1, 5) for _ in range(pyrng.randint(0, 4)))
        elif per_channel and pyrng.random() < 0.3:
            axis = ch_axis % ndim
            shape = tuple(n if i == axis else pyrng.randint(1, 5) for i, n in enumerate(shape))
        x = make_batch(kind, shape, rng)
        where = f"seed={seed} {cls_name}({kwargs}) step {step} {kind}{tuple(x.shape)}"
        if per_channel and x.numel() == 0 and x.ndim < 2:
            continue
        out = mine(x)
        theirs(x)
        assert out is x, where
        assert_bitwise_equal(theirs.min_val, mine.min_val, f"{where}: min_val")
        assert_bitwise_equal(theirs.max_val, mine.max_val, f"{where}: max_val")
        _compare_qparams(theirs, mine, where)


@pytest.mark.parametrize("block", range(8))
def test_random_batches_match_torch(block):
    """400 seeded cases: random valid config, shapes 0-d to 4-d, every channel axis (also negative),
    three batches of random kinds (constant, signed, subnormal, near float32 max, float16, bfloat16,
    integers, NaN, Inf, empty); buffers and qparams compared after every batch."""
    for seed in range(block * 50, block * 50 + 50):
        _run_case(seed)


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_every_input_kind_and_axis(cls_name, kind):
    """Each input kind through each class, for every channel axis of a 4-d input, three batches."""
    rng = np.random.default_rng(zlib.crc32(f"{cls_name}-{kind}".encode()))
    axes = range(-4, 4) if cls_name in PER_CHANNEL else [0]
    dtype, qscheme = (torch.qint8, torch.per_channel_symmetric) if cls_name in PER_CHANNEL else \
        (torch.quint8, torch.per_tensor_affine)
    for ch_axis in axes:
        kwargs = _kwargs(cls_name, dtype, qscheme, False, (None, None), ch_axis=ch_axis)
        theirs, mine = _build(tobs, cls_name, kwargs), _build(ours, cls_name, kwargs)
        for step, shape in enumerate([(2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5)]):
            x = make_batch(kind, shape, rng)
            if cls_name in PER_CHANNEL and x.numel() == 0:
                x = torch.empty(0, 3, 4, 5)
            where = f"{cls_name} ch_axis={ch_axis} {kind} step {step}"
            theirs(x)
            mine(x)
            assert_bitwise_equal(theirs.min_val, mine.min_val, f"{where}: min_val")
            assert_bitwise_equal(theirs.max_val, mine.max_val, f"{where}: max_val")
            _compare_qparams(theirs, mine, where)


finite_or_not = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 1e-41, -1e-41, 3.4e38, -3.4e38]),
)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=3, max_side=4), elements=finite_or_not),
                  min_size=1, max_size=3),
    cls_name=st.sampled_from(CLASSES),
    symmetric=st.booleans(),
)
def test_hypothesis_float32_batches(data, cls_name, symmetric):
    """Arbitrary float32 batches (NaN, Inf, signed zeros, subnormals) in the default mode."""
    per_channel = cls_name in PER_CHANNEL
    scheme = (torch.per_channel_symmetric if symmetric else torch.per_channel_affine) if per_channel else \
        (torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine)
    kwargs = _kwargs(cls_name, torch.qint8, scheme, False, (None, None), ch_axis=-1)
    theirs, mine = _build(tobs, cls_name, kwargs), _build(ours, cls_name, kwargs)
    channels = data[0].shape[-1]
    for array in data:
        if per_channel and array.shape[-1] != channels:
            continue
        x = torch.from_numpy(array)
        theirs(x)
        mine(x)
        assert_bitwise_equal(theirs.min_val, mine.min_val, "min_val")
        assert_bitwise_equal(theirs.max_val, mine.max_val, "max_val")
        _compare_qparams(theirs, mine, f"{cls_name} {array!r}")


# -- inputs that torch refuses -------------------------------------------------------------------

@pytest.mark.parametrize("cls_name", sorted(PER_CHANNEL))
@pytest.mark.parametrize("shape,ch_axis", [((), 0), ((3, 4), 2), ((3, 4), -3), ((2, 3, 4), 5)])
def test_bad_channel_axis_fails_in_both(cls_name, shape, ch_axis):
    theirs = getattr(tobs, cls_name)(ch_axis=ch_axis)
    mine = getattr(ours, cls_name)(ch_axis=ch_axis)
    x = torch.randn(shape)
    with pytest.raises((IndexError, RuntimeError)):
        theirs(x)
    with pytest.raises(ValueError, match="ch_axis"):
        mine(x)
    assert mine.min_val.numel() == 0 and mine.max_val.numel() == 0


@pytest.mark.parametrize("cls_name", sorted(PER_CHANNEL))
def test_changed_channel_count_fails_in_both(cls_name):
    theirs, mine = getattr(tobs, cls_name)(), getattr(ours, cls_name)()
    x = torch.randn(3, 4)
    theirs(x)
    mine(x)
    before = mine.min_val.clone(), mine.max_val.clone()
    with pytest.raises(RuntimeError):
        theirs(torch.randn(5, 4))
    with pytest.raises(ValueError, match="channels"):
        mine(torch.randn(5, 4))
    assert torch.equal(mine.min_val, before[0]) and torch.equal(mine.max_val, before[1])


@pytest.mark.parametrize("cls_name", sorted(PER_CHANNEL))
def test_one_dimensional_per_channel_input(cls_name):
    """torch raises IndexError on a 1-d input; ours treats each element as a channel (plain reference:
    the first batch is the range itself, later batches follow the documented update formula)."""
    with pytest.raises(IndexError):
        getattr(tobs, cls_name)()(torch.randn(4))
    mine = getattr(ours, cls_name)(averaging_constant=0.5) if "MovingAverage" in cls_name else \
        getattr(ours, cls_name)()
    a = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    b = np.array([2.0, -4.0, 1.0, 0.5], dtype=np.float32)
    mine(torch.from_numpy(a))
    mine(torch.from_numpy(b))
    if "MovingAverage" in cls_name:
        expected_min = expected_max = a + np.float32(0.5) * (b - a)
    else:
        expected_min, expected_max = np.minimum(a, b), np.maximum(a, b)
    np.testing.assert_array_equal(mine.min_val.numpy(), expected_min)
    np.testing.assert_array_equal(mine.max_val.numpy(), expected_max)


def test_double_precision_module_matches_torch():
    """``.double()`` moves the buffers to float64 in both; updates and qparams stay identical."""
    rng = np.random.default_rng(5)
    for cls_name in CLASSES:
        theirs = getattr(tobs, cls_name)().double()
        mine = getattr(ours, cls_name)().double()
        assert mine.min_val.dtype == mine.eps.dtype == torch.float64
        for kind in ("normal", "float16", "int32", "nan"):
            x = make_batch(kind, (3, 4), rng)
            theirs(x)
            mine(x)
            assert_bitwise_equal(theirs.min_val, mine.min_val, f"{cls_name} {kind}")
            assert_bitwise_equal(theirs.max_val, mine.max_val, f"{cls_name} {kind}")
            _compare_qparams(theirs, mine, f"{cls_name} {kind}")
