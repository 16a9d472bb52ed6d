"""Names from the seed systems: Horizon's ``observer_v2`` (``observers_core.adapters.horizon``) and AMD
Quark's observers (``observers_core.adapters.quark``), each constructed with every argument of its
seed signature, against our equivalent class (state and qparams bit for bit) and, for Quark, against
installed amd-quark 0.13 (skipped without it)."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")

from observers_core import quant_spec  # noqa: E402
from observers_core._dtypes import DTYPE_ALIASES, parse_dtype  # noqa: E402
from observers_core.adapters import horizon as H  # noqa: E402
from observers_core.adapters import torch as T  # noqa: E402


def _batches(seed, shape=(4, 6, 8), n=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * (1 + i) + 0.3 * i for i in range(n)]


def _same(a, b):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a[~a.isnan()], b[~b.isnan()]), (a, b)


def _run_both(ours, theirs, batches):
    for x in batches:
        ours(x)
        theirs(x)
    sd_a, sd_b = ours.state_dict(), theirs.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        _same(sd_a[k], sd_b[k])
    _same(ours.calculate_qparams(), theirs.calculate_qparams())


# ----------------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("alias,canonical", sorted(DTYPE_ALIASES.items()))
def test_horizon_dtype_aliases(alias, canonical):
    assert parse_dtype(alias) == canonical
    assert parse_dtype("torch." + alias) == canonical
    a = quant_spec(alias, "per_tensor_symmetric")
    b = quant_spec(canonical, "per_tensor_symmetric")
    assert a == b


def test_qint16_range_and_unknown_name():
    spec = quant_spec("qint16", "per_tensor_symmetric")
    assert (spec.dtype, spec.quant_min, spec.quant_max) == ("int16", -(2**15), 2**15 - 1)
    with pytest.raises(ValueError, match="dtype='qint4'.*qint16"):
        parse_dtype("qint4")


# ---------------------------------------------------------------------------------------- Horizon

_HORIZON_ARGS = {  # every argument of the seed signature, in order, non-default values
    "MinMaxObserver": dict(averaging_constant=0.25, ch_axis=-1, dtype="qint16", qscheme=torch.per_tensor_affine,
                           quant_min=-1000, quant_max=1000, is_sync_quantize=False,
                           factory_kwargs={"dtype": torch.float64}),
    "KLObserver": dict(bins=1024, update_interval=2, averaging_constant=0.25, ch_axis=-1, dtype="qint8",
                       qscheme=torch.per_tensor_symmetric, quant_min=-100, quant_max=100, is_sync_quantize=False,
                       factory_kwargs=None),
    "MSEObserver": dict(stride=3, averaging_constant=0.25, ch_axis=1, dtype="qint8",
                        qscheme=torch.per_channel_symmetric, quant_min=None, quant_max=None,
                        is_sync_quantize=False, factory_kwargs=None),
    "MixObserver": dict(averaging_constant=0.25, ch_axis=-1, dtype="quint8", qscheme=torch.per_tensor_affine,
                        quant_min=None, quant_max=None, is_sync_quantize=False, factory_kwargs=None),
    "PercentileObserver": dict(percentile=99.5, bins=512, averaging_constant=0.25, ch_axis=-1, dtype="qint8",
                               qscheme=torch.per_tensor_symmetric, quant_min=None, quant_max=None,
                               is_sync_quantize=False, factory_kwargs=None),
}


def _horizon_equivalent(name, kw):
    """Our class for a Horizon class and its arguments."""
    if name != "MinMaxObserver":
        return getattr(T, name)(**kw)
    common = dict(averaging_constant=kw["averaging_constant"], dtype=kw["dtype"], qscheme=kw["qscheme"],
                  quant_min=kw["quant_min"], quant_max=kw["quant_max"], factory_kwargs=kw["factory_kwargs"])
    if kw["ch_axis"] >= 0:
        return T.MovingAveragePerChannelMinMaxObserver(ch_axis=kw["ch_axis"], **common)
    return T.MovingAverageMinMaxObserver(**common)


@pytest.mark.parametrize("name", sorted(_HORIZON_ARGS))
@pytest.mark.parametrize("positional", [False, True])
def test_horizon_signature_matches_ours(name, positional):
    kw = _HORIZON_ARGS[name]
    cls = getattr(H, name)
    obs = cls(*kw.values()) if positional else cls(**kw)
    _run_both(obs, _horizon_equivalent(name, kw), _batches(1))


def test_horizon_reexports_are_ours():
    for name in ("KLObserver", "MSEObserver", "MixObserver", "PercentileObserver"):
        assert getattr(H, name) is getattr(T, name)
    assert set(H.__all__) >= {"KLObserver", "MSEObserver", "MinMaxObserver", "MixObserver", "PercentileObserver"}


def test_horizon_minmax_defaults_are_horizons():
    obs = H.MinMaxObserver()
    assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max) == (torch.qint8, torch.per_tensor_symmetric, -128, 127)
    assert obs.averaging_constant == 0.01 and obs.ch_axis == -1
    assert isinstance(obs, T.MovingAverageMinMaxObserver)
    _run_both(obs, T.MovingAverageMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric), _batches(2))


@pytest.mark.parametrize("ch_axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["qint8", "quint8", "qint16", "quint16", torch.qint8])
def test_horizon_minmax_per_channel(ch_axis, dtype):
    kw = dict(averaging_constant=0.5, ch_axis=ch_axis, dtype=dtype, qscheme=torch.per_channel_symmetric,
              quant_min=None, quant_max=None, is_sync_quantize=False, factory_kwargs=None)
    obs = H.MinMaxObserver(*kw.values())
    assert type(obs) is H.PerChannelMinMaxObserver and obs.ch_axis == ch_axis
    _run_both(obs, _horizon_equivalent("MinMaxObserver", kw), _batches(3))


def test_horizon_minmax_copy_pickle_with_args():
    obs = H.MinMaxObserver(dtype="qint16")
    for x in _batches(4):
        obs(x)
    for clone in (copy.deepcopy(obs), pickle.loads(pickle.dumps(obs))):
        assert type(clone) is H.MinMaxObserver
        _same(clone.calculate_qparams(), obs.calculate_qparams())
    made = H.MinMaxObserver.with_args(ch_axis=0, qscheme=torch.per_channel_affine, dtype="quint8")()
    assert type(made) is H.PerChannelMinMaxObserver and made.qscheme == torch.per_channel_affine


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(is_sync_quantize="yes"), TypeError, "is_sync_quantize must be a bool"),
        (dict(ch_axis=-2), ValueError, "ch_axis=-2"),
        (dict(ch_axis=1.0), TypeError, "ch_axis"),
        (dict(ch_axis=0), ValueError, "qscheme"),
        (dict(qscheme=torch.per_channel_symmetric), ValueError, "qscheme"),
        (dict(dtype="qint4"), ValueError, "dtype"),
        (dict(averaging_constant=2.0), ValueError, "averaging_constant"),
    ],
)
def test_horizon_minmax_errors_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        H.MinMaxObserver(**kwargs)
    with pytest.raises(error):  # the calibration observers agree (KL: same rules)
        H.KLObserver(**kwargs)


# ------------------------------------------------------------------------------------------ Quark


@pytest.fixture(scope="module")
def quark():
    pytest.importorskip("quark")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from quark.torch.quantization.config import config as C
        from quark.torch.quantization.config import type as Ty
        from quark.torch.quantization.observer import observer as O
    return C, Ty, O


def _int_spec(quark, dtype, qscheme, observer, *, symmetric=True, ch_axis=None, group_size=None, is_dynamic=False,
              **extra):
    C, Ty, O = quark
    return C.QTensorConfig(
        dtype=getattr(Ty.Dtype, dtype), qscheme=getattr(Ty.QSchemeType, qscheme), observer_cls=getattr(O, observer),
        symmetric=symmetric, scale_type=Ty.ScaleType.float, round_method=Ty.RoundType.half_even,
        is_dynamic=is_dynamic, ch_axis=ch_axis, group_size=group_size, **extra,
    )


def _quark_pair(quark, name, qspec, *args):
    _, _, O = quark
    from observers_core.adapters import quark as Q

    return getattr(Q, name)(qspec, None, *args), getattr(O, name)(qspec, None, *args)


def _feed(obs_list, batches):
    for x in batches:
        for o in obs_list:
            o(x)


def _quark_qparams(theirs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return theirs._calculate_qparams()


def _same_values(a, b):
    """Equal values (bit for bit), shapes equal; dtypes may differ (Quark's float zero points)."""
    assert tuple(a.shape) == tuple(b.shape), (a.shape, b.shape)
    assert torch.equal(a.to(torch.float64), b.to(torch.float64)), (a, b)


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4", "int3", "int2", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("is_dynamic", [False, True])
def test_quark_per_tensor_minmax(quark, dtype, symmetric, is_dynamic):
    if dtype.startswith("fp8") and not symmetric:
        pytest.skip("fp8 is symmetric")
    qspec = _int_spec(quark, dtype, "per_tensor", "PerTensorMinMaxObserver", symmetric=symmetric, is_dynamic=is_dynamic)
    ours, theirs = _quark_pair(quark, "PerTensorMinMaxObserver", qspec)
    _feed([ours, theirs], _batches(10))
    _same(ours.min_val, theirs.min_val)
    _same(ours.max_val, theirs.max_val)
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale.reshape(scale.shape))
    if symmetric and dtype.startswith("uint"):  # documented: Quark's zero point is 0, ours mid-range
        assert (q_zp == 0).all() and (zp == {"uint8": 128, "uint4": 8}[dtype]).all()
    else:
        _same_values(zp, q_zp.reshape(zp.shape))
    # our equivalent class, built directly
    family = T.FP8Observer if dtype.startswith("fp8") else T.LowBitObserver
    kw = {} if dtype.startswith("fp8") else {"symmetric": symmetric}
    direct = family({"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(dtype, dtype),
                    granularity="per_tensor", is_dynamic=is_dynamic, **kw)
    _feed([direct], _batches(10))
    _same(direct.calculate_qparams(), ours.calculate_qparams())


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "fp8_e4m3"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("ch_axis", [0, 1, -1])
@pytest.mark.parametrize("is_dynamic", [False, True])
def test_quark_per_channel_minmax(quark, dtype, symmetric, ch_axis, is_dynamic):
    if dtype.startswith("fp8") and not symmetric:
        pytest.skip("fp8 is symmetric")
    qspec = _int_spec(quark, dtype, "per_channel", "PerChannelMinMaxObserver", symmetric=symmetric, ch_axis=ch_axis,
                      is_dynamic=is_dynamic)
    ours, theirs = _quark_pair(quark, "PerChannelMinMaxObserver", qspec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], _batches(11))
    _same(ours.min_val, theirs.min_val)
    _same(ours.max_val, theirs.max_val)
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale)
    if not (symmetric and dtype.startswith("uint")):
        _same_values(zp, q_zp)


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("dtype", ["int4", "uint4", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("ch_axis,group_size,shape", [(1, 4, (6, 16)), (-1, 8, (6, 16)), (0, 2, (6, 16)),
                                                       (1, 3, (2, 6, 4))])
def test_quark_per_group_minmax(quark, dtype, symmetric, ch_axis, group_size, shape):
    if dtype.startswith("fp8") and not symmetric:
        pytest.skip("fp8 is symmetric")
    qspec = _int_spec(quark, dtype, "per_group", "PerGroupMinMaxObserver", symmetric=symmetric, ch_axis=ch_axis,
                      group_size=group_size)
    ours, theirs = _quark_pair(quark, "PerGroupMinMaxObserver", qspec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], _batches(12, shape))
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale)
    if not (symmetric and dtype.startswith("uint")):
        _same_values(zp, q_zp)


def _mx_spec(quark, dtype, mode, ch_axis=-1, group_size=32, is_dynamic=False):
    C, Ty, O = quark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return C.QTensorConfig(
            dtype=getattr(Ty.Dtype, dtype), observer_cls=O.PerBlockMXObserver, symmetric=None,
            scale_type=Ty.ScaleType.float, round_method=Ty.RoundType.half_even, scale_format="e8m0",
            scale_calculation_mode=mode, qscheme=Ty.QSchemeType.per_group, group_size=group_size, ch_axis=ch_axis,
            is_dynamic=is_dynamic,
        )


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4"])
@pytest.mark.parametrize("mode", ["even", "floor", "ceil"])
@pytest.mark.parametrize("ch_axis", [-1, 0])
def test_quark_mx(quark, dtype, mode, ch_axis):
    qspec = _mx_spec(quark, dtype, mode, ch_axis=ch_axis)
    ours, theirs = _quark_pair(quark, "PerBlockMXObserver", qspec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], _batches(13, (4, 64, 64), n=3))
    _same_values(ours.amax, theirs.amax)
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale)
    _same_values(zp, q_zp)
    direct = T.PerBlockMXObserver("mx" + dtype, axis=ch_axis, block_size=32, rounding=mode)
    _feed([direct], _batches(13, (4, 64, 64), n=3))
    _same(direct.calculate_qparams(), ours.calculate_qparams())


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("mode", ["even", "floor", "ceil"])
def test_quark_mx_special_blocks(quark, mode):
    """Blocks of zeros (Quark: 2**-127 in even mode, eps otherwise) and blocks with NaN (NaN scale)."""
    x = torch.randn(3, 64)
    x[0, :32] = 0
    x[1, 32:40] = float("nan")
    ours, theirs = _quark_pair(quark, "PerBlockMXObserver", _mx_spec(quark, "fp8_e4m3", mode), 1e-7)
    _feed([ours, theirs], [x])
    _same(ours._calculate_qparams()[0], _quark_qparams(theirs)[0])


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_bfp_special_blocks(quark):
    C, Ty, O = quark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qspec = C.QTensorConfig(dtype=Ty.Dtype.bfp16, observer_cls=O.PerBlockBFPObserver, ch_axis=-1, group_size=8,
                                is_dynamic=False)
    x = torch.randn(2, 32)
    x[0, :8] = 0
    x[0, 8:16] = float("nan")
    x[1, 0] = 127.7 / 64  # mantissa overflow: the exponent goes up by one
    x[1, 8] = -2.0
    ours, theirs = _quark_pair(quark, "PerBlockBFPObserver", qspec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], [x, torch.randn(2, 32) * 0.1])
    _same(ours._calculate_qparams()[0], _quark_qparams(theirs)[0])


def _bfp_spec(quark):
    C, Ty, O = quark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return C.QTensorConfig(dtype=Ty.Dtype.bfp16, observer_cls=O.PerBlockBFPObserver, ch_axis=-1, group_size=8,
                               is_dynamic=False)


def _one_value_block(value: float, size: int) -> torch.Tensor:
    x = torch.zeros(1, size)
    x[0, 0] = value
    return x


# (observer, Quark mode, block size, value, our _calculate_qparams() scale, Quark 0.13's): the edge cases docs/lowbit.md
# lists under "Where Quark differs", each where Quark's float32 log2 is off by one or it does not clamp to E8M0.
BLOCK_EDGES = [
    ("PerBlockMXObserver", "floor", 32, 1e-37, 2.0**-127, 2.0**-131),  # tiny non-zero block (ours was eps)
    ("PerBlockBFPObserver", None, 8, 1e-40, 2.0**-133, 2.0**-139),  # the same, BFP's mantissa LSB 2**(e - 6)
    ("PerBlockMXObserver", "floor", 32, 16 * (1 - 2**-24), 2.0**-5, 2.0**-4),  # one ulp below 2**4
    ("PerBlockMXObserver", "ceil", 32, 2**20 * (1 + 2**-23), 2.0**13, 2.0**12),  # one ulp above 2**20
    ("PerBlockBFPObserver", None, 8, -16 * (1 - 2**-24), 2.0**-3, 2.0**-2),  # |x| one ulp below 2**4
    ("PerBlockMXObserver", "floor", 32, float("inf"), 2.0**127, float("inf")),  # ours clamped to code 254
    ("PerBlockMXObserver", "even", 32, 3.4e38, 2.0**120, 2.0**127),
    ("PerBlockBFPObserver", None, 8, 3.4e38, 2.0**121, float("inf")),
]


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("name, mode, size, value, expected, quarks", BLOCK_EDGES)
def test_quark_block_edge_cases(quark, name, mode, size, value, expected, quarks):
    """Ours gives the exact (OCP/E8M0-clamped) scale where Quark 0.13's differs; both enumerated here on the
    installed Quark, so docs/lowbit.md's list (values included) stays true."""
    spec = _mx_spec(quark, "fp8_e4m3", mode) if mode else _bfp_spec(quark)
    ours, theirs = _quark_pair(quark, name, spec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], [_one_value_block(value, size)])
    assert ours._calculate_qparams()[0].reshape(-1)[0].item() == expected
    assert _quark_qparams(theirs)[0].reshape(-1)[0].item() == quarks


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_block_observers_before_data_and_modes(quark):
    """``amax`` before any input and after ``reset_state()`` is Quark's ``tensor(0.)`` (it raised), and a
    ``scale_calculation_mode`` Quark does not compute with (``rceil``) is refused at construction with a
    ``ValueError`` naming it (Quark raises ``ValueError`` at its first qparams)."""
    for name, spec in (("PerBlockMXObserver", _mx_spec(quark, "fp8_e4m3", "even")), ("PerBlockBFPObserver", _bfp_spec(quark))):
        ours, theirs = _quark_pair(quark, name, spec, torch.finfo(torch.float32).eps)
        _same(ours.amax, theirs.amax)
        ours(torch.randn(2, 32))
        ours.reset_state()
        _same(ours.amax, theirs.amax)
    rceil = _mx_spec(quark, "fp8_e4m3", "rceil")
    _, _, O = quark
    quark_obs = O.PerBlockMXObserver(rceil, None)
    quark_obs(torch.randn(2, 32))
    with pytest.raises(ValueError):
        _quark_qparams(quark_obs)
    from observers_core.adapters import quark as Q

    with pytest.raises(ValueError, match="scale_calculation_mode='rceil'.*allowed: even, floor, ceil"):
        Q.PerBlockMXObserver(rceil)


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_bfp(quark):
    C, Ty, O = quark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qspec = C.QTensorConfig(dtype=Ty.Dtype.bfp16, observer_cls=O.PerBlockBFPObserver, ch_axis=-1, group_size=8,
                                is_dynamic=False)
    ours, theirs = _quark_pair(quark, "PerBlockBFPObserver", qspec, torch.finfo(torch.float32).eps)
    _feed([ours, theirs], _batches(14, (4, 16, 64), n=3))
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale)
    _same_values(zp, q_zp)


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quark_histogram_pro(quark, dtype, symmetric):
    qspec = _int_spec(quark, dtype, "per_tensor", "PerTensorHistogramObserverPro", symmetric=symmetric)
    ours, theirs = _quark_pair(quark, "PerTensorHistogramObserverPro", qspec, 256, False, 384)
    _feed([ours, theirs], _batches(15))
    _same(ours.histogram, theirs.histogram.histogram)
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    _same_values(scale, q_scale)
    _same_values(zp, q_zp)


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_histogram_observer_defaults_in_quark(quark):
    """Quark's PerTensorHistogramObserver records a histogram and returns default qparams; ours searches."""
    qspec = _int_spec(quark, "int8", "per_tensor", "PerTensorHistogramObserver")
    ours, theirs = _quark_pair(quark, "PerTensorHistogramObserver", qspec)
    _feed([ours, theirs], _batches(16))
    q_scale, q_zp = _quark_qparams(theirs)
    assert q_scale.tolist() == [1.0] and q_zp.tolist() == [0]
    direct = T.HistogramObserver(bins=2048, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric,
                                 quant_min=-128, quant_max=127)
    _feed([direct], _batches(16))
    _same(direct.calculate_qparams(), ours._calculate_qparams())


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
@pytest.mark.parametrize("name", ["PerTensorPercentileObserver", "PerTensorMSEObserver"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4"])
def test_quark_percentile_mse(quark, name, dtype):
    qspec = _int_spec(quark, dtype, "per_tensor", name)
    ours, theirs = _quark_pair(quark, name, qspec)
    batches = _batches(17)
    _feed([ours, theirs], batches)
    scale, zp = ours._calculate_qparams()
    q_scale, q_zp = _quark_qparams(theirs)
    # documented: different histograms (and MSE candidates), so close, not equal. Symmetric uint8: Quark's
    # zero point 0 puts [0, 2 amax] on the grid of |x|, so its MSE search picks about half our amax
    if dtype != "uint8":
        assert torch.allclose(scale.double(), q_scale.double().reshape(scale.shape), rtol=0.05), (scale, q_scale)
        _same_values(zp, q_zp.reshape(zp.shape))
    elif "Percentile" in name:
        assert torch.allclose(scale.double(), q_scale.double().reshape(scale.shape), rtol=0.05), (scale, q_scale)
    # one batch: our per-batch observer with averaging_constant=1 searches the same histogram
    one = _quark_pair(quark, name, qspec)[0]
    one(batches[0])
    ours_cls = T.PercentileObserver if "Percentile" in name else T.MSEObserver
    extra = {"percentile": 99.99999999} if "Percentile" in name else {}
    qmin, qmax = (-8, 7) if dtype == "int4" else (None, None)
    direct = ours_cls(averaging_constant=1.0, ch_axis=-1, dtype={"int4": "qint8", "int8": "qint8"}.get(dtype, "quint8"),
                      qscheme=torch.per_tensor_symmetric, quant_min=qmin, quant_max=qmax, **extra)
    direct(batches[0])
    _same(direct.calculate_qparams(), one.calculate_qparams())



@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_nan_and_integer_batches(quark):
    """Where Quark 0.13 raises, ours follow torch.ao's rules (the adapter's docstring): a NaN poisons the
    min/max and histogram observers' state (NaN scale, as torch.ao's) where Quark's raise, the percentile
    and MSE observers skip NaN and inf where Quark's histc raises, and an int64 batch is binned as its float32 cast
    where Quark's histogram observer raises NotImplementedError."""
    second = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    nan = second.clone()
    nan[0, :3] = float("nan")
    inf = second.clone()
    inf[0, :3] = float("inf")
    integers = torch.arange(-16, 16).reshape(4, 8)
    cases = [("PerTensorMinMaxObserver", nan, "nan"), ("PerChannelMinMaxObserver", nan, "nan"),
             ("PerTensorHistogramObserverPro", nan, "nan"), ("PerTensorPercentileObserver", nan, "finite"),
             ("PerTensorPercentileObserver", inf, "finite"), ("PerTensorMSEObserver", nan, "finite"),
             ("PerTensorMSEObserver", inf, "finite"), ("PerTensorHistogramObserverPro", integers, "float")]
    for name, x, rule in cases:
        per_channel = "Channel" in name
        qspec = _int_spec(quark, "int8", "per_channel" if per_channel else "per_tensor", name,
                          ch_axis=0 if per_channel else None)
        ours, theirs = _quark_pair(quark, name, qspec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises((AssertionError, RuntimeError, NotImplementedError, OverflowError)):
                theirs(x)
                theirs(second)
                theirs._calculate_qparams()
            ours(x)
            ours(second)
            scale = ours._calculate_qparams()[0]
        if rule == "nan":
            assert bool(scale.isnan().any())
            continue
        twin = _quark_pair(quark, name, qspec)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            twin(x[torch.isfinite(x)] if rule == "finite" else x.float())
            twin(second)
            _same(twin._calculate_qparams(), ours._calculate_qparams())


def test_quark_search_observers_before_data():
    from types import SimpleNamespace

    from observers_core.adapters import quark as Q

    spec = SimpleNamespace(dtype="int8", qscheme="per_tensor", symmetric=True, is_dynamic=False)
    for cls in (Q.PerTensorPercentileObserver, Q.PerTensorMSEObserver):
        obs = cls(spec)
        with pytest.warns(UserWarning, match="observed no finite value"):
            scale, zp = obs._calculate_qparams()
        assert scale.tolist() == [1.0] and zp.tolist() == [0]


@pytest.mark.parametrize("name", ["PerTensorPercentileObserver", "PerTensorMSEObserver"])
def test_quark_search_observers_loaded_range_and_nonfinite_batches(name):
    """A loaded range is the qparams' range (the accumulated histogram is not saved), and a batch without a
    finite value gives the observer's own 'no finite value' warning and the defaults (not the KL observer's
    'no KL update' message it is built on)."""
    from types import SimpleNamespace

    from observers_core.adapters import quark as Q

    spec = SimpleNamespace(dtype="int8", qscheme="per_tensor", symmetric=True, is_dynamic=False)
    seen = getattr(Q, name)(spec)
    _feed([seen], _batches(19))
    loaded = getattr(Q, name)(spec)
    loaded.load_state_dict(seen.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(loaded._calculate_qparams(), seen._calculate_qparams())
    for bad in (torch.full((4, 8), float("nan")), torch.full((4, 8), float("inf"))):
        obs = getattr(Q, name)(spec)
        obs(bad)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scale, zp = obs._calculate_qparams()
        assert [str(w.message).split(";")[0] for w in caught] == [f"{name} has observed no finite value yet"]
        assert scale.tolist() == [1.0] and zp.tolist() == [0]


@pytest.mark.parametrize("name", ["PerTensorPercentileObserver", "PerTensorMSEObserver"])
def test_quark_search_observers_merge_replicas_by_their_accumulator(name):
    """sync_observers' merge (run here without processes: the ranks' states merged and loaded) of two
    replicas that saw different shards equals one observer that saw both: the accumulated histogram
    merges exactly and the range is searched again, not averaged."""
    from types import SimpleNamespace

    from observers_core.adapters import quark as Q

    spec = SimpleNamespace(dtype="int8", qscheme="per_tensor", symmetric=True, is_dynamic=False)
    replicas, single = [getattr(Q, name)(spec) for _ in range(3)], getattr(Q, name)(spec)
    batches = _batches(18)
    for i, batch in enumerate(batches):
        replicas[i % 2](batch)
        single(batch)
    merged = replicas[2]._merge_replicas([r._sync_state() for r in replicas])  # replica 2 saw nothing
    replicas[2]._load_synced(merged)
    _same(replicas[2].calculate_qparams(), single.calculate_qparams())
    for key in ("min_val", "max_val"):
        assert torch.equal(getattr(replicas[2], key), getattr(single, key)), key


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_per_channel_bias(quark):
    """1-D inputs (biases): one channel per element, as Quark."""
    qspec = _int_spec(quark, "int8", "per_channel", "PerChannelMinMaxObserver", ch_axis=0)
    ours, theirs = _quark_pair(quark, "PerChannelMinMaxObserver", qspec)
    _feed([ours, theirs], [torch.randn(7), torch.randn(7)])
    _same_values(ours._calculate_qparams()[0], _quark_qparams(theirs)[0])
    clone = pickle.loads(pickle.dumps(ours))
    _same(clone._calculate_qparams(), ours._calculate_qparams())


@pytest.mark.slow  # against installed amd-quark (its import takes a minute)
def test_quark_placeholder(quark):
    C, Ty, O = quark
    qspec = C.QTensorConfig(dtype=Ty.Dtype.bfloat16, observer_cls=O.PlaceholderObserver)
    ours, theirs = _quark_pair(quark, "PlaceholderObserver", qspec)
    x = torch.randn(3)
    assert ours(x) is x and theirs(x) is x
    assert ours._calculate_qparams() is None and theirs._calculate_qparams() is None


def test_quark_module_needs_no_quark():
    """The spec is duck-typed: a plain object with Quark's field names works without quark installed."""
    from types import SimpleNamespace

    from observers_core.adapters import quark as Q

    spec = SimpleNamespace(dtype="int8", qscheme="per_channel", ch_axis=0, group_size=None, symmetric=True,
                           is_dynamic=False, scale_type="float", zero_point_type="int32")
    obs = Q.PerChannelMinMaxObserver(spec)
    x = torch.randn(3, 5)
    obs(x)
    direct = T.LowBitObserver("int8", granularity="per_channel", axis=0, symmetric=True)
    direct(x)
    _same(obs.calculate_qparams(), direct.calculate_qparams())
    with pytest.raises(ValueError, match="qspec.dtype='int16'"):
        Q.PerTensorMinMaxObserver(SimpleNamespace(dtype="int16", symmetric=True))
    with pytest.raises(TypeError, match="qspec"):
        Q.PerTensorMinMaxObserver(object())
    with pytest.raises(ValueError, match="qspec.symmetric"):
        Q.PerTensorPercentileObserver(SimpleNamespace(dtype="int8", symmetric=False, qscheme="per_tensor"))


@pytest.mark.parametrize("facade", ["horizon", "quark"])
def test_seed_facades_name_their_classes(facade):
    """Classes defined by a seed facade name it; re-exported ones keep the facade they come from."""
    import importlib

    module = importlib.import_module(f"observers_core.adapters.{facade}")
    for name in module.__all__:
        cls = getattr(module, name)
        assert cls.__module__ in (module.__name__, "observers_core.adapters.torch"), (name, cls.__module__)
    assert H.MinMaxObserver.__module__ == "observers_core.adapters.horizon"


def test_quark_module_imports_without_quark():
    import subprocess
    import sys

    code = ("import sys; sys.modules['quark'] = None; import observers_core.adapters.quark as q; "
            "assert 'quark.torch' not in sys.modules; print(len(q.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
