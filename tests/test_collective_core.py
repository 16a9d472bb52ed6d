"""Core updates with a collective (issue 13): ``n`` members (threads meeting at a barrier, NaN wins in
min/max) each update with their own shard; every member must end with exactly the state of one update
on the concatenated shards, and every member must make the same collective calls (an empty shard
included), or a real process group would hang."""

from __future__ import annotations

import numpy as np
import pytest

import observers_core as oc
from observers_core._histogram import histogram_init, histogram_update
from observers_core.families import calibration as calib
from observers_core.families import lowbit

from _thread_collective import run_members

torch = pytest.importorskip("torch")

BACKENDS = ["numpy", "torch"]


def _to(backend: str, a: np.ndarray):
    return torch.from_numpy(a.copy()) if backend == "torch" else a


def _xp(backend: str):
    import array_api_compat.numpy as xnp
    import array_api_compat.torch as xt

    return xt if backend == "torch" else xnp


def _shards(rng: np.random.Generator, members: int, channels: int = 3) -> list[np.ndarray]:
    """``members`` float32 shards of shape (n_i, channels): random sizes (an empty one often), scales from
    1e-30 to 3e38, NaN/inf on one member sometimes."""
    out = []
    for _ in range(members):
        n = int(rng.choice([0, 1, 2, 7, 40]))
        scale = float(10.0 ** rng.uniform(-30, 38.4)) if rng.random() < 0.3 else float(10.0 ** rng.uniform(-2, 3))
        out.append((rng.standard_normal((n, channels)) * min(scale, 3e38)).astype(np.float32))
    k = int(rng.integers(members))
    if out[k].size and rng.random() < 0.3:
        out[k][0, 0] = rng.choice([np.nan, np.inf, -np.inf])
    return out


def _equal(got, want) -> None:
    """Equal arrays (NaN equal to NaN) in equal (nested) NamedTuples."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for a, b in zip(got, want):
            _equal(a, b)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _check(members: int, backend: str, shards_per_step: list[list[np.ndarray]], init, step) -> None:
    """``step(state, x, collective)`` over the steps on each member equals ``step(state, concat, None)``."""
    xp = _xp(backend)

    def member(rank, collective):
        state = init(xp)
        for shards in shards_per_step:
            state = step(state, _to(backend, shards[rank]), collective)
        return state, collective.calls

    results = run_members(members, member)
    want = init(xp)
    for shards in shards_per_step:
        x = np.concatenate(shards)
        if x.size or step.__name__ == "lowbit_step":
            want = step(want, _to(backend, x), None)
    for state, calls in results:
        _equal(state, want)
        assert calls == results[0][1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_minmax_moving_average_histogram(backend, seed):
    rng = np.random.default_rng(seed)
    members = int(rng.integers(2, 5))
    steps = [_shards(rng, members) for _ in range(3)]
    ignore = bool(seed % 2)

    def minmax_step(s, x, c):
        return oc.minmax_update(s, x, axis=1, ignore_nonfinite=ignore, collective=c)

    def moving_step(s, x, c):
        return oc.moving_average_update(s, x, averaging_constant=0.25, ignore_nonfinite=ignore, collective=c)

    def hist_step(s, x, c):
        return histogram_update(s, x, upsample_rate=4, ignore_nonfinite=ignore, collective=c)

    _check(members, backend, steps, lambda xp: oc.minmax_init(num_channels=3, xp=xp), minmax_step)
    _check(members, backend, steps, lambda xp: oc.moving_average_init(xp=xp), moving_step)
    _check(members, backend, steps, lambda xp: histogram_init(bins=32, xp=xp), hist_step)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_calibration_histogram_and_kl_accumulator(backend, seed):
    rng = np.random.default_rng(100 + seed)
    members = int(rng.integers(2, 5))
    steps = [_shards(rng, members) for _ in range(3)]

    def hist_step(s, x, c):
        return oc.calib_histogram_update(s, x, axis=1, absolute=bool(seed % 2), collective=c)

    def kl_step(acc, x, c):
        return calib.kl_accumulate(acc, x, axis=None, xp=_xp(backend), collective=c)

    _check(members, backend, steps, lambda xp: oc.calib_histogram_init(bins=16, num_channels=3, xp=xp), hist_step)
    _check(members, backend, steps, lambda xp: calib.kl_init(None, bins=64, device=None, xp=xp), kl_step)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["percentile", "mse", "mix"])
@pytest.mark.parametrize("seed", range(6))
def test_calibration_batch_update(backend, method, seed):
    """Percentile and MSE search the same histogram: exact. Mix adds every member's error sums (float64,
    in another order), so equal choices are required, and the random data here has no near ties."""
    rng = np.random.default_rng(200 + seed)
    members = int(rng.integers(2, 4))
    steps = [_shards(rng, members, channels=4) for _ in range(2)]
    for shards in steps:  # the per-batch methods need a non-empty batch somewhere
        shards[0] = np.concatenate([shards[0], rng.standard_normal((3, 4)).astype(np.float32)])
    config, _ = calib.make_config("Observer", method, dtype="qint8", qscheme="per_channel_symmetric",
                                  quant_min=None, quant_max=None, ch_axis=1, averaging_constant=0.5, bins=256)  # fmt: skip
    xp = _xp(backend)

    def step(s, x, c):
        state, _ = calib.batch_update(s, x, axis=1, config=config, xp=xp, collective=c)
        return state

    _check(members, backend, steps, lambda xp: oc.minmax_init(num_channels=4, xp=xp), step)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec_args", [("int4", "per_channel", 1, None), ("mxfp8_e4m3", "per_block", 1, 32)])
def test_lowbit_statistics(backend, spec_args):
    """Static low-bit statistics with a collective equal observing every member's batch in turn."""
    dtype, granularity, axis, group = spec_args
    spec = oc.lowbit_spec(dtype, granularity=granularity, axis=axis, **({} if group is None else {"group_size": group}))
    config = lowbit.Config(spec)
    rng = np.random.default_rng(7)
    members = 3
    steps = [[(rng.standard_normal((4, 64)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32) for _ in range(members)]
             for _ in range(2)]  # fmt: skip
    xp = _xp(backend)

    def member(rank, collective):
        state = None
        for shards in steps:
            state = lowbit.update(config, state, _to(backend, shards[rank]), collective=collective)
        return state

    want = None
    for shards in steps:
        for shard in shards:
            want = lowbit.update(config, want, _to(backend, shard))
    for state in run_members(members, member):
        _equal(state, want)
    assert xp is not None


def test_a_collective_must_have_min_max_sum():
    with pytest.raises(TypeError, match="collective must be None or have min"):
        oc.minmax_update(oc.minmax_init(xp=np), np.ones(3, np.float32), collective=object())
