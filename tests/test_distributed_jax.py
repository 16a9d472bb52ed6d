"""JAX observers across devices (issue 13): ``obs.update(state, x, axis_name=...)`` inside ``jax.shard_map``
and ``jax.pmap`` over 4 forced host devices gives every device the state one device reaches on the
whole batch, bit for bit, and the same qparams.

The device count is fixed when JAX initialises and other tests of this process import JAX first, so
the multi-device checks run in a fresh interpreter (tests/_jax_distributed_checks.py, one process for
all of them: compiles are shared) that reports every check; a check that fails or did not report fails
the test. Argument errors, which need no devices, run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from observers_core.adapters import jax as jobs  # noqa: E402
from observers_core.adapters._array_histogram import HistogramObserver as NumpyHistogram  # noqa: E402
from observers_core.adapters._array_lowbit import PerGroupMinMaxObserver as NumpyPerGroup  # noqa: E402
from observers_core.adapters._array_observers import (  # noqa: E402
    MovingAveragePerChannelMinMaxObserver as NumpyMovingAveragePerChannel,
)

from _jax_distributed_checks import DEVICES, check_names  # noqa: E402
from _thread_collective import run_members  # noqa: E402

SCRIPT = Path(__file__).with_name("_jax_distributed_checks.py")


@pytest.mark.slow  # a 4-device JAX interpreter in a subprocess (minutes)
def test_four_devices_shard_map_and_pmap_equal_one_device():
    """Every check of :func:`check_names` ran in the 4-device interpreter and passed (one test, so that
    pytest-xdist runs the interpreter once)."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=SCRIPT.parent)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and len(lines) == 1, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    results = json.loads(lines[0][len("RESULTS "):])
    assert sorted(results) == sorted(check_names())
    failed = {name: detail for name, (ok, detail, _seconds) in results.items() if not ok}
    assert not failed, "\n\n".join(f"{name}: {detail}" for name, detail in failed.items())


# ------------------------------------------------------------------ argument errors (no devices needed)
def test_axis_name_must_be_a_name():
    obs = jobs.MinMaxObserver()
    for bad in (3, "", (), ("data", 1)):
        with pytest.raises(TypeError, match="axis_name must be"):
            obs.update(obs.init_state(), jnp.ones(4), axis_name=bad)
    with pytest.raises(TypeError, match="axis_name must be"):
        jobs.AxisCollective(["data"])


def test_axis_name_and_collective_exclude_each_other():
    obs = jobs.HistogramObserver(bins=16)
    with pytest.raises(ValueError, match="axis_name or collective, not both"):
        obs.update(obs.init_state(), jnp.ones(4), axis_name="data", collective=jobs.AxisCollective("data"))


def test_collective_must_be_a_hashable_collective():
    obs = jobs.PerGroupMinMaxObserver(group_size=4)
    with pytest.raises(TypeError, match="min\\(x\\), max\\(x\\) and sum\\(x\\)"):
        obs.update(None, jnp.ones((2, 4)), collective=object())

    class Unhashable:
        __hash__ = None

        def min(self, x):
            return x

        max = sum = min

    with pytest.raises(TypeError, match="collective must be hashable"):
        obs.update(None, jnp.ones((2, 4)), collective=Unhashable())


def test_kl_observer_pure_update_takes_a_kl_state_not_a_range():
    """KL's pure ``update`` carries its accumulator in a ``KLState``; the range ``init_state()`` gives (what
    ``kl_step`` takes) is refused, naming ``state``."""
    obs = jobs.KLObserver()
    with pytest.raises(TypeError, match="state must be a KLState"):
        obs.update(obs.init_state(), jnp.ones(4), axis_name="data")


# ------------------------------------------------ the same update(state, x, collective=) on NumPy observers
@pytest.mark.parametrize("make, state_of, positional", [
    (lambda: NumpyMovingAveragePerChannel(averaging_constant=0.3, ch_axis=1), lambda o: o.init_state(5), False),
    (lambda: NumpyHistogram(bins=32), lambda o: o.init_state(), False),
    (lambda: NumpyPerGroup(group_size=5), lambda o: None, True),
], ids=["MovingAveragePerChannel", "Histogram", "PerGroup"])
def test_numpy_observers_take_a_collective(make, state_of, positional):
    """Three members (threads) call ``update(state, x, collective=)`` in step; each ends with the state
    of one process on the concatenated batches (low-bit per-group statistics, one entry per row: of
    the members' batches observed one after another). An empty batch still takes part (not for the
    low-bit observers, whose members need one shape); NaN on one member reaches every state."""
    rng = np.random.default_rng(3)
    steps = [[rng.standard_normal((2, 5)).astype(np.float32) * (r + 1) for r in range(3)] for _ in range(3)]
    if not positional:
        steps[1][0] = steps[1][0][:0]
    steps[2][2][1, 3] = np.nan
    obs = make()

    def member(rank, coll):
        state = state_of(obs)
        for batches in steps:
            state = obs.update(state, batches[rank], collective=coll)
        return state

    want = state_of(obs)
    for batches in steps:
        for x in batches if positional else [np.concatenate(batches)]:
            want = obs.update(want, x)
    assert np.isnan(want[-1]).any()  # max_val
    for state in run_members(3, member):
        for a, b in zip(state, want):
            np.testing.assert_array_equal(a, b)
