"""Multi-device checks of the JAX observers' ``update(state, x, axis_name=...)``, run by
tests/test_distributed_jax.py in a fresh interpreter with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
(the device count is fixed when JAX initialises, and the test process has initialised it already).

Every observer sees sequences of global batches of shape ``(8, 16)``, rows sharded over 4 devices, under
``jax.shard_map`` and under ``jax.pmap``. After every step the state (replicated: every pmap row the same)
must equal, bit for bit, the single-device reference, and the final qparams must equal the reference's.
The reference is one update on the whole batch; for the low-bit observers with positional statistics
(per group, per block: one entry per row) it is observing the four shards one after another. (qparams
are compared where the state is finite: a NaN state's qparams are NaN.)

Prints one line ``RESULTS {json}``: check name -> ``[ok, detail, seconds]``. Names come from :func:`check_names`,
which the test imports (this module imports JAX only in :func:`main`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import traceback

DEVICES = 4
AXIS = "data"

#: name -> (class, constructor kwargs, reference: "whole" batch or "shards" one after another, state channels)
OBSERVERS = {
    "MinMax": ("MinMaxObserver", {}, "whole", None),
    "MovingAverage": ("MovingAverageMinMaxObserver", {"averaging_constant": 0.3}, "whole", None),
    "PerChannel": ("PerChannelMinMaxObserver", {"ch_axis": 1}, "whole", 16),
    "MovingAveragePerChannel": (
        "MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1, "averaging_constant": 0.3}, "whole", 16),
    "Histogram": ("HistogramObserver", {"bins": 64}, "whole", None),
    "Percentile": ("PercentileObserver", {"percentile": 99.0, "bins": 128, "averaging_constant": 0.3}, "whole", None),
    "Mix": ("MixObserver", {"bins": 128, "averaging_constant": 0.3}, "whole", None),
    "FP8": ("FP8Observer", {}, "whole", None),
    "PerGroup": ("PerGroupMinMaxObserver", {"group_size": 8}, "shards", None),
    "MX": ("PerBlockMXObserver", {"dtype": "mxfp4", "block_size": 8}, "shards", None),
}
#: the calibration observers always skip NaN/inf: they have no ignore_nonfinite and no "nan" scenario
ALWAYS_SKIPS_NONFINITE = {"Percentile", "Mix"}
MODES = ("shard_map", "pmap")
EXTRA_CHECKS = (
    "collective_nan_wins/shard_map", "collective_nan_wins/pmap", "explicit_mesh/shard_map", "explicit_mesh/sharded_input",
    "explicit_mesh/sharded_calibration", "explicit_mesh_2d/sharded_input", "explicit_mesh_2d/sharded_calibration",
    "wrong_axis_name/shard_map", "wrong_axis_name/pmap", "unbound_axis_name",
    "kl_accumulate/shard_map", "kl_accumulate/pmap",
)


def check_names() -> list[str]:
    """``uneven`` (ignore_nonfinite=True, shards with no finite value at all) under both modes; ``nan``
    (NaN on one shard propagates; the same AxisCollective under pmap) under shard_map."""
    uneven = [f"{obs}/uneven/{mode}" for obs in OBSERVERS for mode in MODES]
    nan = [f"{obs}/nan/shard_map" for obs in OBSERVERS if obs not in ALWAYS_SKIPS_NONFINITE]
    wrong_device = [f"wrong_device/{obs}" for obs in OBSERVERS]
    return uneven + nan + wrong_device + list(EXTRA_CHECKS)


def batches(scenario: str):
    """Global batches ``(8, 16)`` float32; rows ``2k, 2k+1`` go to device ``k``."""
    import numpy as np

    rng = np.random.default_rng(13)
    out = [rng.standard_normal((8, 16)).astype(np.float32) * s + o for s, o in ((1, 0), (3, 0.5), (0.5, 1), (2, -1))]
    if scenario == "uneven":
        out[1][2:4] = np.nan  # device 1 has no finite value
        out[2][[0, 1, 2, 3, 6, 7]] = np.nan  # only device 2 sees finite values
        out[2][0, :4] = np.inf
        out[2][7, 4:] = -np.inf
    else:
        out[1][7, 5] = np.nan  # NaN on device 3 only
    return out


def main() -> dict[str, list]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from observers_core.adapters import jax as jobs

    if jax.device_count() != DEVICES:
        raise RuntimeError(f"expected {DEVICES} devices (XLA_FLAGS), got {jax.devices()}")
    # Auto axes: the core's histogram search under jit fails on arrays of a mesh with Explicit axes
    # (jax.make_mesh's default since JAX 0.7); the updates are checked on one too ("explicit_mesh")
    auto_mesh = jax.make_mesh((DEVICES,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
    results: dict[str, list] = {}

    def same(a, b) -> bool:
        """Same dtype and shape, NaN at the same places, every other entry the same bits."""
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind != "f":
            return np.array_equal(a, b)
        nan = np.isnan(a)
        return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8)))

    def same_tree(a, b) -> bool:
        la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
        return len(la) == len(lb) and all(same(u, v) for u, v in zip(la, lb))

    def record(name: str, fn) -> None:
        start = time.perf_counter()
        try:
            detail = fn()
            results[name] = [detail is None, detail or "ok"]
        except Exception:  # noqa: BLE001  (reported to the test)
            results[name] = [False, traceback.format_exc(limit=4)]
        results[name].append(round(time.perf_counter() - start, 2))

    def distributed_step(obs, mode: str, axis_name: str = AXIS, mesh=auto_mesh, method: str = "update"):
        update = lambda s, x: getattr(obs, method)(s, x, axis_name=axis_name)  # noqa: E731
        if mode == "shard_map":
            step = jax.jit(jax.shard_map(update, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P()))
            return lambda s, x: step(s, jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(AXIS))))
        step = jax.pmap(update, axis_name=AXIS, in_axes=(None, 0))

        def run(s, x):
            rows = step(s, x.reshape(DEVICES, -1, *x.shape[1:]))
            first = jax.tree.map(lambda a: a[0], rows)
            if not all(same_tree(first, jax.tree.map(lambda a: a[k], rows)) for k in range(1, DEVICES)):
                raise AssertionError("pmap rows differ: the state is not replicated")
            return first

        return run

    def observe_check(obs_name: str, scenario: str, mode: str, mesh=auto_mesh, qparams: bool = True) -> str | None:
        cls_name, kwargs, reference, channels = OBSERVERS[obs_name]
        if scenario == "uneven" and obs_name not in ALWAYS_SKIPS_NONFINITE:
            kwargs = {**kwargs, "ignore_nonfinite": True}
        obs = getattr(jobs, cls_name)(**kwargs)
        state = obs.init_state(channels) if hasattr(obs, "init_state") else None  # low-bit: None
        ref = state
        step = distributed_step(obs, mode, mesh=mesh)
        for i, x in enumerate(batches(scenario)):
            state = step(state, x)
            if reference == "whole":
                ref = obs.update(ref, jnp.asarray(x))
            else:
                for shard in np.split(x, DEVICES):
                    ref = obs.update(ref, jnp.asarray(shard))
            if not same_tree(state, ref):
                return f"step {i}: state {jax.tree.map(np.asarray, state)} != single device {jax.tree.map(np.asarray, ref)}"
        if scenario == "nan" and not np.isnan(np.asarray(jax.tree.leaves(state)[-1])).any():
            return "the NaN on one device did not reach the state"
        if scenario == "uneven" and np.isnan(np.asarray(jax.tree.leaves(state)[-1])).any():
            return "NaN reached the state despite ignore_nonfinite"
        if qparams and scenario != "nan" and not same_tree(obs.qparams(state), obs.qparams(ref)):
            return f"qparams {obs.qparams(state)} != single device {obs.qparams(ref)}"
        return None

    for name in check_names():
        if name.count("/") == 2:
            record(name, lambda name=name: observe_check(*name.split("/")))

    def nan_wins(mode: str) -> str | None:
        """min/max/sum across the 4 rows (one per device): NaN wins over finite values and +-inf."""
        coll = jobs.AxisCollective(AXIS)
        x = np.array([[1, 2, np.nan, -np.inf], [5, np.nan, 0, 1], [-3, 4, 2, np.nan], [0, 1, np.inf, 2]], np.float32)
        ints = np.arange(16, dtype=np.int32).reshape(4, 4)
        reduce = lambda a, b: (coll.min(a), coll.max(a), coll.sum(a), coll.min(b), coll.sum(b))  # noqa: E731
        if mode == "shard_map":
            f = jax.jit(jax.shard_map(reduce, mesh=auto_mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=P()))
            got = [np.asarray(g)[0] for g in f(jnp.asarray(x), jnp.asarray(ints))]
        else:
            rows = jax.pmap(reduce, axis_name=AXIS)(x, ints)
            if not all(same(r[0], r[k]) for r in rows for k in range(DEVICES)):
                return "pmap rows differ"
            got = [np.asarray(r[0]) for r in rows]
        nan = np.float32(np.nan)
        want = (np.array([-3, nan, nan, nan], np.float32), np.array([5, nan, nan, nan], np.float32),
                np.array([3, nan, nan, nan], np.float32), ints.min(0), ints.sum(0, dtype=np.int32))
        bad = [k for k, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
        return f"results {bad} differ: {got} vs {want}" if bad else None

    def explicit_mesh() -> str | None:
        """Updates on a mesh with Explicit axes (jax.make_mesh's default since JAX 0.7)."""
        mesh = jax.make_mesh((DEVICES,), (AXIS,))
        return (observe_check("MinMax", "nan", "shard_map", mesh)
                or observe_check("Histogram", "uneven", "shard_map", mesh, qparams=False))  # fmt: skip

    # a 2-D mesh (2 x 2 devices): rows over AXIS, columns (the channels of ch_axis=1) over "model"
    mesh_1d = lambda: jax.make_mesh((DEVICES,), (AXIS,), axis_types=(jax.sharding.AxisType.Explicit,))  # noqa: E731
    mesh_2d = lambda: jax.make_mesh((2, DEVICES // 2), (AXIS, "model"),  # noqa: E731
                                    axis_types=(jax.sharding.AxisType.Explicit,) * 2)

    def explicit_sharded_input(mesh, spec) -> str | None:
        """HistogramObserver.update and __call__ (no shard_map: the jitted update sees the global array)
        on batches sharded over a mesh with Explicit axes, outside and inside ``jax.set_mesh``: the state
        equals the one-device state bit for bit (the binning's ``bincount`` is a scatter of sharded
        indices, which needs an ``out_sharding`` there), and so do the qparams (outside ``set_mesh`` the
        L2 search's ``dynamic_update_slice`` got zeros without the state's mesh). ``mesh``, ``spec``: how
        the batches are sharded."""
        for under_mesh in (False, True):
            obs = jobs.HistogramObserver(bins=64, ignore_nonfinite=True)
            state = ref_state = obs.init_state()
            with jax.set_mesh(mesh) if under_mesh else contextlib.nullcontext():
                for i, x in enumerate(batches("uneven")):
                    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
                    state = obs.update(state, xs)
                    obs(xs)
                    ref_state = obs.update(ref_state, jnp.asarray(x))
                    if not (same_tree(state, ref_state) and same_tree(obs.state, ref_state)):
                        return f"set_mesh={under_mesh}, step {i}: {jax.tree.map(np.asarray, state)} != {ref_state}"
                if not same_tree(obs.calculate_qparams(), obs.qparams(ref_state)):
                    got, want = obs.calculate_qparams(), obs.qparams(ref_state)
                    return f"set_mesh={under_mesh}: qparams {got} != single device {want}"
        return None

    def explicit_sharded_calibration(mesh, spec) -> str | None:
        """The calibration observers on batches sharded over a mesh with Explicit axes (no shard_map),
        outside and inside ``jax.set_mesh``, per tensor and per channel (``ch_axis=1``; ``ch_axis=0``, the
        sharded axis): Percentile, MSE and Mix ``update`` and ``__call__`` (Mix: ``last_choice`` too), KL
        ``accumulate``, ``kl_step`` and ``__call__``, equal one device's state bit for bit after every
        step, and so do ``calculate_qparams`` (the rows of ``x``, ``reshape(x, (1, -1))`` or
        ``moveaxis`` + ``reshape``, need an ``out_sharding`` there; the core replicates them, and a sharded
        channel axis's range, so no sum, Mix's float error sums included, is split across the devices).
        ``mesh``, ``spec``: how the batches are sharded."""
        kwargs = {"Percentile": {"percentile": 99.0}, "MSE": {}, "Mix": {}, "KL": {}}

        def run(obs, xs, channels):
            """Every step's (pure state, stateful state, last_choice, KL accumulator), then the qparams."""
            steps, state, acc = [], None, None
            kl = isinstance(obs, jobs.KLObserver)
            if kl:
                acc = obs.init_accumulator(channels)
            else:
                state = obs.init_state(channels)
            for x in xs:
                if kl:
                    acc = obs.accumulate(acc, x)
                    state = obs.kl_step(state, acc)
                else:
                    state = obs.update(state, x)
                obs(x)
                steps.append((state, obs.state, obs.last_choice, acc))
            return steps, obs.calculate_qparams()

        for name, extra in kwargs.items():
            for ch_axis in (-1, 1, 0):
                channels = None if ch_axis < 0 else batches("uneven")[0].shape[ch_axis]
                scheme = {} if ch_axis < 0 else {"qscheme": "per_channel_symmetric"}
                make = functools.partial(getattr(jobs, f"{name}Observer"), bins=128, averaging_constant=0.3,
                                         ch_axis=ch_axis, **scheme, **extra)
                ref_steps, ref_qparams = run(make(), [jnp.asarray(x) for x in batches("uneven")], channels)
                for under_mesh in (False, True):
                    where = f"{name}, ch_axis={ch_axis}, set_mesh={under_mesh}"
                    with jax.set_mesh(mesh) if under_mesh else contextlib.nullcontext():
                        xs = [jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec)) for x in batches("uneven")]
                        steps, qparams = run(make(), xs, channels)
                    for i, (got, want) in enumerate(zip(steps, ref_steps)):
                        if not same_tree(got, want):
                            got, want = jax.tree.map(np.asarray, (got, want))
                            return f"{where}, step {i}: (state, obs.state, last_choice, accumulator) {got} != {want}"
                    if not same_tree(qparams, ref_qparams):
                        return f"{where}: qparams {qparams} != single device {ref_qparams}"
        return None

    def wrong_axis(mode: str) -> str | None:
        obs = jobs.MinMaxObserver()
        step = distributed_step(obs, mode, axis_name="model")
        try:
            step(obs.init_state(), batches("uneven")[0])
        except ValueError as err:
            return None if "axis_name='model'" in str(err) else f"unclear message: {err}"
        return "no error for an axis_name the mesh does not have"

    def unbound() -> str | None:
        obs = jobs.HistogramObserver(bins=64)
        try:
            obs.update(obs.init_state(), jnp.ones((8, 16)), axis_name=AXIS)
        except ValueError as err:
            return None if f"axis_name='{AXIS}'" in str(err) else f"unclear message: {err}"
        return "no error outside shard_map/pmap"

    def kl_accumulate(mode: str) -> str | None:
        """KLObserver: accumulators synced over the devices, then KL steps, equal one device's."""
        obs = jobs.KLObserver(bins=128, averaging_constant=0.3)
        acc = ref = obs.init_accumulator()
        state = ref_state = None
        step = distributed_step(obs, mode, method="accumulate")
        for i, x in enumerate(batches("uneven")):
            acc, ref = step(acc, x), obs.accumulate(ref, jnp.asarray(x))
            state, ref_state = obs.kl_step(state, acc), obs.kl_step(ref_state, ref)
            if not (same_tree(acc, ref) and same_tree(state, ref_state)):
                return f"step {i}: {jax.tree.map(np.asarray, state)} != single device {jax.tree.map(np.asarray, ref_state)}"
        return None

    def wrong_device(obs_name: str) -> str | None:
        """A stateful call with ``x`` committed to another device than the state: ``ValueError`` naming ``x``
        (not jit's message about its arguments), the state unchanged; on the state's device, or
        uncommitted, the next batches run."""
        cls_name, kwargs, _, _ = OBSERVERS[obs_name]
        obs = getattr(jobs, cls_name)(**kwargs)
        devices, x = jax.devices(), batches("nan")[0]
        obs(jax.device_put(x, devices[1]))
        before = obs.state_dict()
        try:
            obs(jax.device_put(x, devices[0]))
            return "a batch committed to device 0 was taken by a state on device 1"
        except ValueError as exc:
            if not str(exc).startswith("x is on device"):
                return f"unclear error: {exc}"
        if not same_tree(before, obs.state_dict()):
            return "the refused batch changed the state"
        obs(jax.device_put(x, devices[1]))
        obs(x)  # numpy: uncommitted, goes to the state's device
        return None

    for obs_name in OBSERVERS:
        record(f"wrong_device/{obs_name}", functools.partial(wrong_device, obs_name))
    for mode in MODES:
        record(f"kl_accumulate/{mode}", lambda mode=mode: kl_accumulate(mode))
        record(f"collective_nan_wins/{mode}", lambda mode=mode: nan_wins(mode))
        record(f"wrong_axis_name/{mode}", lambda mode=mode: wrong_axis(mode))
    record("explicit_mesh/shard_map", explicit_mesh)
    record("explicit_mesh/sharded_input", lambda: explicit_sharded_input(mesh_1d(), P(AXIS)))
    record("explicit_mesh/sharded_calibration", lambda: explicit_sharded_calibration(mesh_1d(), P(AXIS)))
    record("explicit_mesh_2d/sharded_input", lambda: explicit_sharded_input(mesh_2d(), P(AXIS, "model")))
    record("explicit_mesh_2d/sharded_calibration", lambda: explicit_sharded_calibration(mesh_2d(), P(AXIS, "model")))
    record("unbound_axis_name", unbound)
    return results


if __name__ == "__main__":
    if f"--xla_force_host_platform_device_count={DEVICES}" not in os.environ.get("XLA_FLAGS", ""):
        sys.exit(f"run with XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES}")
    print("RESULTS " + json.dumps(main()), flush=True)
