"""The JAX observers (``observers_core.adapters.jax``): parity with torch.ao, jit behaviour, state dicts.

Oracle: the installed ``torch.ao.quantization.observer``. Shapes are reused across cases (JAX compiles
once per shape, dtype and static configuration) to keep the file fast.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402
import torch.ao.quantization.observer as tao  # noqa: E402

from observers_core import MinMaxState  # noqa: E402
from observers_core.adapters import jax as jobs  # noqa: E402
from observers_core.families import minmax as minmax_family  # noqa: E402

from conftest import TraceDelta  # noqa: E402
from test_array_adapters import (  # noqa: E402
    KINDS,
    MINMAX_CLASSES,
    PER_CHANNEL,
    assert_parity,
    assert_same_bits,
    parity_cases,
    run_ours,
    run_torch,
    to_torch,
    torch_kwargs,
)


def jax_asarray(a: np.ndarray):
    return jnp.asarray(a)


def make(cls_name: str, **kwargs):
    return getattr(jobs, cls_name)(**kwargs)


# --------------------------------------------------------------------------- parity with torch.ao
# 36 cases: each compiles its own update and qparams (about 1 s on a busy 2-core CPU); the numpy grid in
# test_array_adapters.py covers the configuration space more densely with the same core functions.
JAX_CASES = parity_cases(seed=4321, n=36, averaging_constants=(0.01, 0.3))


@pytest.mark.parametrize("cls_name, kwargs, batches, kind", JAX_CASES)
def test_parity_with_torch(cls_name, kwargs, batches, kind):
    ours = run_ours(make(cls_name, **kwargs), batches, jax_asarray)
    # XLA:CPU runs with flush-to-zero / denormals-are-zero (jax-ml/jax#16200): subnormal inputs read as 0.
    flush = kind == "subnormal" and jax.default_backend() == "cpu"
    assert_parity(ours, run_torch(cls_name, kwargs, batches), flush_subnormals=flush)


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_subnormal_inputs_are_flushed_on_cpu_but_qparams_match(cls_name):
    """Precisely what XLA's FTZ/DAZ changes: the stored range reads subnormals as zero; torch keeps
    them. The qparams agree, since ``eps`` dominates such ranges."""
    if jax.default_backend() != "cpu":
        pytest.skip("flush-to-zero is an XLA:CPU setting")
    kwargs = {"ch_axis": 0} if cls_name in PER_CHANNEL else {}
    x = np.array([[1e-41, 3e-41, 2e-41], [-2e-41, 5e-42, -1e-41]], np.float32)
    (sd, (scale, zp)), (ref_sd, (ref_scale, ref_zp)) = (
        run_ours(make(cls_name, **kwargs), [x], jax_asarray),
        run_torch(cls_name, kwargs, [x]),
    )
    assert np.all(ref_sd["max_val"] > 0) and np.all(sd["max_val"] == 0)  # torch: subnormal; XLA:CPU: zero
    assert_same_bits(scale, ref_scale, "scale")
    np.testing.assert_array_equal(zp, ref_zp)


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
@pytest.mark.parametrize("size", [17, 5000])
def test_nan_poisons_by_default_like_torch(cls_name, size):
    """Also past 4096 elements, where XLA:CPU's min/max reductions drop NaN on their own."""
    kwargs = {"ch_axis": 1} if cls_name in PER_CHANNEL else {}
    rng = np.random.default_rng(size)
    batches = [rng.standard_normal((2, 3, size)).astype(np.float32) for _ in range(2)]
    batches[1][1, 2, -1] = np.nan
    batches[1][0, 0, size // 2] = np.nan
    ours = run_ours(make(cls_name, **kwargs), batches, jax_asarray)
    ref = run_torch(cls_name, kwargs, batches)
    for key in ("min_val", "max_val"):
        assert_same_bits(ours[0][key], ref[0][key], key)
    assert_same_bits(ours[1][0], ref[1][0], "scale")


@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_ignore_nonfinite_matches_torch_on_the_finite_values(cls_name):
    """With ``ignore_nonfinite=True`` the observer sees what torch sees once NaN/Inf are removed."""
    kwargs = {"ch_axis": 0} if cls_name in PER_CHANNEL else {}
    rng = np.random.default_rng(3)
    clean = [rng.standard_normal((3, 6000)).astype(np.float32) for _ in range(3)]
    dirty = [b.copy() for b in clean]
    # each NaN/Inf replaces a copy of a finite value of the same channel, so the finite range is unchanged
    for b, c in zip(dirty, clean):
        b[:, -1], b[:, 0], b[:, 7] = np.nan, np.inf, -np.inf
        c[:, -1], c[:, 0], c[:, 7] = c[:, 1], c[:, 1], c[:, 1]
    ours = run_ours(make(cls_name, ignore_nonfinite=True, **kwargs), dirty, jax_asarray)
    assert_parity(ours, run_torch(cls_name, kwargs, clean))


def test_moving_average_is_bit_exact_over_many_channels():
    """XLA:CPU contracts ``a + c * (b - a)`` into one FMA unless the core keeps the product apart:
    thousands of channels and several constants make a single fused rounding show up."""
    rng = np.random.default_rng(11)
    batches = [(rng.standard_normal((4096, 8)) * 10).astype(np.float32) for _ in range(4)]
    for c in (0.01, 0.3):
        kwargs = {"averaging_constant": c, "ch_axis": 0}
        ours = run_ours(make("MovingAveragePerChannelMinMaxObserver", **kwargs), batches, jax_asarray)
        assert_parity(ours, run_torch("MovingAveragePerChannelMinMaxObserver", kwargs, batches))


def test_qparams_are_bit_exact_over_many_channels():
    """XLA rewrites a division by a constant into a multiplication by its reciprocal unless the core
    prevents it: many channels and every scheme make one differently rounded scale show up."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((8192, 3)) * rng.uniform(0.01, 100, size=(8192, 1))).astype(np.float32)
    for qscheme in ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"):
        for dtype in ("quint8", "qint8", "int16"):
            kwargs = {"ch_axis": 0, "qscheme": qscheme, "dtype": dtype}
            if qscheme == "per_channel_symmetric" and dtype == "quint8":
                kwargs["reduce_range"] = False
            ours = run_ours(make("PerChannelMinMaxObserver", **kwargs), [x], jax_asarray)
            assert_parity(ours, run_torch("PerChannelMinMaxObserver", kwargs, [x]))


# --------------------------------------------------------------------------- jit: traces, host syncs


def test_update_is_traced_once_per_shape_and_dtype():
    counter = TraceDelta(jobs.TRACES, minmax_family.update)
    # a configuration (averaging constant) no other test uses, so that nothing is cached yet
    obs = jobs.MovingAveragePerChannelMinMaxObserver(averaging_constant=0.123456789, ch_axis=1)
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal((2, 3, 5)).astype(np.float32)) for _ in range(4)]
    obs(xs[0])
    assert counter.count == 1
    for x in xs[1:]:
        obs(x)
    assert counter.count == 1  # same shape and dtype: no retrace
    other = jobs.MovingAveragePerChannelMinMaxObserver(averaging_constant=0.123456789, ch_axis=1)
    other(xs[0])
    assert counter.count == 1  # another observer with the same configuration shares the compiled update
    obs(jnp.ones((4, 3, 5), jnp.float32))
    assert counter.count == 2  # a new shape traces once more
    obs(jnp.ones((2, 3, 5), jnp.bfloat16))
    assert counter.count == 3  # as does a new dtype
    obs(xs[1])
    assert counter.count == 3


def test_calculate_qparams_is_jitted_and_traced_once():
    counter = TraceDelta(jobs.TRACES, minmax_family.qparams)
    obs = jobs.MinMaxObserver(dtype="qint8", quant_min=-37, quant_max=41)  # an unused spec
    obs(jnp.arange(5.0))
    first = obs.calculate_qparams()
    assert counter.count == 1
    obs(jnp.arange(-3.0, 5.0))
    second = obs.calculate_qparams()
    assert counter.count == 1
    assert float(first[0][0]) != float(second[0][0])  # the values changed, the trace was reused


def test_call_does_not_sync_with_the_host():
    obs = jobs.MovingAveragePerChannelMinMaxObserver(averaging_constant=0.3, ch_axis=0)
    xs = [jnp.ones((3, 4)) * i for i in range(3)]
    obs(xs[0])  # compile outside the guard
    with jax.transfer_guard_device_to_host("disallow"):
        for x in xs:
            assert obs(x) is x
        obs.calculate_qparams()


def test_update_and_qparams_compose_with_scan_and_jit():
    obs = jobs.MovingAverageMinMaxObserver(averaging_constant=0.3)
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.standard_normal((5, 4, 6)).astype(np.float32))
    for x in xs:
        obs(x)
    expected = obs.state

    @jax.jit
    def calibrate(state, xs):
        state, _ = jax.lax.scan(lambda s, x: (obs.update(s, x), None), state, xs)
        return state, obs.qparams(state)

    state, (scale, zp) = calibrate(obs.init_state(), xs)
    assert isinstance(state, MinMaxState)
    assert_same_bits(np.asarray(state.min_val), np.asarray(expected.min_val), "min_val")
    assert_same_bits(np.asarray(state.max_val), np.asarray(expected.max_val), "max_val")
    assert_same_bits(np.asarray(scale), np.asarray(obs.calculate_qparams()[0]), "scale")
    fresh = jobs.MovingAverageMinMaxObserver(averaging_constant=0.3)
    fresh.state = state  # a state computed elsewhere goes back into an observer
    np.testing.assert_array_equal(np.asarray(fresh.calculate_qparams()[1]), np.asarray(zp))
    assert len(jax.tree_util.tree_leaves(obs.state)) == 2


def test_stateful_call_under_jit_raises():
    obs = jobs.MinMaxObserver()
    with pytest.raises(TypeError, match="obs.update"):
        jax.jit(obs)(jnp.ones(3))
    assert float(obs.state.min_val) == np.inf


def test_per_channel_learns_channel_count_on_first_call():
    obs = jobs.PerChannelMinMaxObserver(ch_axis=-1)
    assert obs.state is None and obs.state_dict()["min_val"].shape == (0,)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 7)).astype(np.float32))
    obs(x)
    assert obs.state.min_val.shape == (7,)
    assert isinstance(obs.state.min_val, jax.Array)
    np.testing.assert_array_equal(np.asarray(obs.state.min_val), np.asarray(x).min(axis=0))


def test_numpy_input_is_accepted_and_returned():
    obs = jobs.MinMaxObserver()
    x = np.array([1.0, -2.0], np.float32)
    assert obs(x) is x
    assert float(obs.state.min_val) == -2.0
    with pytest.raises(TypeError, match="x must be a jax.Array or numpy.ndarray"):
        obs([1.0, 2.0])


# --------------------------------------------------------------------------- state dict
@pytest.mark.parametrize("cls_name", MINMAX_CLASSES)
def test_state_dict_round_trip_and_torch_interop(cls_name):
    rng = np.random.default_rng(9)
    kwargs = {"ch_axis": 0, "dtype": "qint8", "qscheme": "per_channel_affine_float_qparams"} if cls_name in PER_CHANNEL else {}
    batches = [rng.standard_normal((4, 9)).astype(np.float32) for _ in range(3)]
    obs = make(cls_name, eps=2e-5, **kwargs)
    ours = run_ours(obs, batches, jax_asarray)
    sd = obs.state_dict()
    assert all(isinstance(v, jax.Array) for v in sd.values())

    for source in (sd, ours[0]):  # jax arrays, numpy arrays
        other = make(cls_name, **kwargs)
        other.load_state_dict(source)
        assert_parity(run_ours(other, [], jax_asarray), ours)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_obs = getattr(tao, cls_name)(eps=2e-5, **torch_kwargs(kwargs))
        for b in batches:
            t_obs(to_torch(b))
    other = make(cls_name, **kwargs)
    other.load_state_dict({k: v.numpy() for k, v in t_obs.state_dict().items()})
    assert_parity(run_ours(other, [], jax_asarray), ours)

    t_new = getattr(tao, cls_name)(**torch_kwargs(kwargs))
    t_new.load_state_dict({k: torch.from_numpy(np.asarray(v).copy()) for k, v in sd.items()})
    scale, zp = t_new.calculate_qparams()
    assert_same_bits(ours[1][0], scale.numpy(), "scale")
    assert_same_bits(ours[1][1], zp.numpy(), "zero_point") if zp.dtype.is_floating_point else (
        np.testing.assert_array_equal(ours[1][1], zp.numpy())
    )


def test_load_state_dict_error_leaves_state_untouched():
    obs = jobs.PerChannelMinMaxObserver()
    obs(jnp.asarray([[1.0, 2.0], [-1.0, 5.0]]))
    before = {k: np.asarray(v).copy() for k, v in obs.state_dict().items()}
    with pytest.raises(ValueError, match="min_val > max_val"):
        obs.load_state_dict({**before, "min_val": np.array([9.0, 0.0], np.float32)})
    with pytest.raises(ValueError, match="missing"):
        obs.load_state_dict({"eps": before["eps"]})
    after = {k: np.asarray(v) for k, v in obs.state_dict().items()}
    for k in before:
        assert_same_bits(after[k], before[k], k)


def test_zero_point_dtypes_are_documented_int32():
    """JAX without x64 has no int64: zero points are int32 where torch gives int64."""
    obs = jobs.MinMaxObserver(qscheme="per_tensor_symmetric")
    obs(jnp.ones(3))
    assert obs.calculate_qparams()[1].dtype == jnp.int32
    ref = tao.MinMaxObserver(qscheme=torch.per_tensor_symmetric)
    ref(torch.ones(3))
    assert ref.calculate_qparams()[1].dtype == torch.int64


def test_fixed_qparams_and_placeholders():
    obs = jobs.FixedQParamsObserver(scale=2.0 / 256.0, zero_point=128)
    x = jnp.ones(3)
    assert obs(x) is x
    scale, zp = obs.calculate_qparams()
    assert isinstance(scale, jax.Array)
    ref_scale, ref_zp = tao.FixedQParamsObserver(scale=2.0 / 256.0, zero_point=128).calculate_qparams()
    assert_same_bits(np.asarray(scale), ref_scale.numpy(), "scale")
    np.testing.assert_array_equal(np.asarray(zp), ref_zp.numpy())
    for cls in (jobs.PlaceholderObserver, jobs.NoopObserver):
        assert cls()(x) is x
        with pytest.raises(RuntimeError):
            cls().calculate_qparams()
    with pytest.raises(TypeError, match="xp must not be given"):
        jobs.MinMaxObserver(xp=np)


def test_the_grid_covers_every_kind_class_rank_and_axis():
    """The randomized grid above really holds every input kind, class, rank 0..4 and a negative axis."""
    assert {c.values[3] for c in JAX_CASES} == set(KINDS)
    assert {c.values[0] for c in JAX_CASES} == set(MINMAX_CLASSES)
    assert {c.values[2][-1].ndim for c in JAX_CASES} == {0, 1, 2, 3, 4}
    assert any(c.values[1].get("ch_axis", 0) < 0 for c in JAX_CASES)
    assert any(len(c.values[2]) > 1 for c in JAX_CASES)
