"""Distributed calibration on torch.distributed (issue 13): 2 and 4 local gloo processes on 127.0.0.1.

Each spawn runs every check in one process group (a process start costs seconds: torch's import); every
rank compares its own observers with single-process observers it computes itself on the concatenated
data (every rank generates every rank's batches from one seed) and writes ``{check: "ok" | error}``;
the test functions below assert on those results. Bounded: 60 s collective timeout (10 s where a rank
dies), a join deadline, leftover processes killed.

Run as a script, this file is one rank: ``python test_distributed_torch.py SCENARIO RANK WORLD PORT OUT``.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import pickle
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - torch builds without distributed
    pytest.skip("torch.distributed is not available", allow_module_level=True)

JOIN_TIMEOUT_S = 240

# -- the rank side ----------------------------------------------------------------------------------


def _same(a, b) -> bool:
    """Bit for bit (NaN positions equal, and the sign of zeros) for tensors; recursively for tuples."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(a)
    return (torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])
            and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan])))  # fmt: skip


def _states_equal(obs, ref) -> None:
    """``AssertionError`` naming the first state_dict entry (and the accumulator for KL) that differs."""
    mine, theirs = obs.state_dict(), ref.state_dict()
    assert mine.keys() == theirs.keys(), (list(mine), list(theirs))
    for key in mine:
        assert _same(mine[key], theirs[key]), f"{key}: {mine[key]} != {theirs[key]}"
    if hasattr(obs, "accumulator"):
        assert _same(tuple(obs.accumulator or ()), tuple(ref.accumulator or ())), "KL accumulator differs"


def _qparams_equal(obs, ref) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _same(tuple(obs.calculate_qparams()), tuple(ref.calculate_qparams())), "qparams differ"


def _families(ot, hz):
    """name -> (constructor taking sync=..., how the single-process reference sees a step: "cat" (one
    batch, the ranks' batches concatenated) or "each" (the ranks' batches one after another: the
    positional low-bit statistics)."""
    per_channel = dict(ch_axis=1, qscheme=torch.per_channel_symmetric)
    return {
        "MinMax": (lambda **kw: ot.MinMaxObserver(**kw), "cat"),
        "MovingAverage": (lambda **kw: ot.MovingAverageMinMaxObserver(averaging_constant=0.3, **kw), "cat"),
        "PerChannel": (lambda **kw: ot.PerChannelMinMaxObserver(ch_axis=1, **kw), "cat"),
        "MovingAveragePerChannel": (
            lambda **kw: ot.MovingAveragePerChannelMinMaxObserver(averaging_constant=0.3, ch_axis=1, **kw), "cat"),
        "Histogram": (lambda **kw: ot.HistogramObserver(bins=128, **kw), "cat"),
        "KL": (lambda **kw: ot.KLObserver(bins=512, update_interval=2, **kw), "cat"),
        "KLPerChannel": (lambda **kw: ot.KLObserver(bins=512, **per_channel, **kw), "cat"),
        "Percentile": (lambda **kw: ot.PercentileObserver(percentile=99.0, **kw), "cat"),
        "MSEPerChannel": (lambda **kw: ot.MSEObserver(**per_channel, **kw), "cat"),
        "Mix": (lambda **kw: ot.MixObserver(**kw), "cat"),
        "HorizonMinMax": (lambda sync=False: hz.MinMaxObserver(averaging_constant=0.3, is_sync_quantize=sync), "cat"),
        "HorizonPerChannel": (lambda sync=False: hz.MinMaxObserver(ch_axis=1, qscheme=torch.per_channel_symmetric,
                                                                   is_sync_quantize=sync), "cat"),
        "PerGroup": (lambda **kw: ot.PerGroupMinMaxObserver("int4", axis=-1, group_size=4, **kw), "each"),
        "FP8": (lambda **kw: ot.FP8Observer(**kw), "each"),
        "MX": (lambda **kw: ot.PerBlockMXObserver(block_size=32, **kw), "each"),
    }


def _batch(seed: int, n: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, 3, 32, generator=g) * scale


def _steps(world: int):
    """Per step, every rank's batch: uneven sizes, an empty batch on rank 1, a batch whose range is
    wider on the last rank only."""
    sizes = [[2 + r for r in range(world)], [0 if r == 1 else 3 for r in range(world)],
             [1 + (r % 2) for r in range(world)]]  # fmt: skip
    return [[_batch(100 * s + r, n, scale=1 + 3 * (s == 2 and r == world - 1)) for r, n in enumerate(row)]
            for s, row in enumerate(sizes)]  # fmt: skip


def _even_steps(world: int):
    """For the low-bit observers, whose per-group statistics are positional: the same shape on every rank
    (rank 1's second batch empty)."""
    return [[_batch(300 * s + r, 0 if (s, r) == (1, 1) else 2) for r in range(world)] for s in range(3)]


def _feed_reference(ref, step, how) -> None:
    if how == "cat":
        ref(torch.cat(step))
    else:
        for x in step:
            if x.numel():
                ref(x)


def _check_per_batch(results, ot, hz, rank, world):
    for name, (make, how) in _families(ot, hz).items():
        with _record(results, f"per_batch:{name}"):
            synced, ref = make(sync=True), make()
            for step in _steps(world) if how == "cat" else _even_steps(world):
                synced(step[rank])
                _feed_reference(ref, step, how)
            _states_equal(synced, ref)
            _qparams_equal(synced, ref)


def _check_nan_on_one_rank(results, ot, rank, world):
    """NaN on the last rank only: NaN wins (every rank's state is the single-process state, NaN
    included), or is skipped with ignore_nonfinite=True."""
    makes = {
        "MinMax": lambda **kw: ot.MinMaxObserver(**kw),
        "PerChannel": lambda **kw: ot.PerChannelMinMaxObserver(ch_axis=1, **kw),
        "MovingAverage": lambda **kw: ot.MovingAverageMinMaxObserver(**kw),
        "MinMaxIgnoreNonfinite": lambda **kw: ot.MinMaxObserver(ignore_nonfinite=True, **kw),
        "Histogram": lambda **kw: ot.HistogramObserver(bins=64, **kw),
        "Percentile": lambda **kw: ot.PercentileObserver(**kw),
    }
    step = [_batch(7 + r, 2) for r in range(world)]
    step[-1][0, 1, 0, :5] = float("nan")
    for name, make in makes.items():
        with _record(results, f"nan_on_one_rank:{name}"):
            synced, ref = make(sync=True), make()
            synced(step[rank])
            ref(torch.cat(step))
            if name in ("MinMax", "PerChannel", "MovingAverage", "Histogram"):
                assert torch.isnan(synced.min_val).any(), "NaN did not win"
            _states_equal(synced, ref)


def _unsynced(make, batches):
    obs = make()
    for x in batches:
        obs(x)
    return obs


def _check_sync_observers(results, ot, hz, rank, world):
    """After unsynced calibration (rank r sees r batches: rank 0 sees none), ``sync_observers`` gives
    every rank the documented merge: the exact single-process state for min/max, per-channel, low-bit and
    KL's accumulator; the mean of replicas for moving averages and calibration ranges; the histogram
    family merge (exact here: every shard's first batch spans the global range)."""
    from observers_core import MinMaxState, moving_average_merge
    from observers_core.families import histogram as hist_family

    families = _families(ot, hz)
    shards = [[_batch(1000 + 10 * r + i, 2) for i in range(r)] for r in range(world)]
    for r in range(1, world):  # every shard's first batch holds the global extremes: equal histogram ranges
        shards[r][0][0, 0, 0, :2] = torch.tensor([-9.0, 9.0])
    everything = [x for shard in shards for x in shard]
    model = torch.nn.ModuleDict({name: _unsynced(make, shards[rank]) for name, (make, _) in families.items()})
    replicas = {name: [_unsynced(make, shard) for shard in shards] for name, (make, _) in families.items()}
    with _record(results, "sync_observers:count"):
        assert ot.sync_observers(model) == len(families)

    def check(name, expected_state, keys=("min_val", "max_val")):
        with _record(results, f"sync_observers:{name}"):
            for key, value in zip(keys, expected_state):
                assert _same(model[name].state_dict()[key], value), f"{key}: {model[name].state_dict()[key]} != {value}"

    def mean_tree(states):  # the documented mean: pairwise moving_average_merge, a balanced tree
        while len(states) > 1:
            states = [moving_average_merge(*states[i:i + 2]) if i + 1 < len(states) else states[i]
                      for i in range(0, len(states), 2)]  # fmt: skip
        return states[0]

    def seen(name):
        return [o for o in replicas[name] if o.min_val.numel() and not bool(torch.isinf(o.min_val).all())]

    for name in ("MinMax", "PerChannel", "PerGroup", "FP8", "MX"):  # exact: one observer on every batch
        single = _unsynced(families[name][0], everything)
        check(name, (single.min_val, single.max_val))
    for name in ("MovingAverage", "MovingAveragePerChannel", "HorizonMinMax", "HorizonPerChannel", "Percentile",
                 "MSEPerChannel", "Mix", "KLPerChannel"):
        check(name, mean_tree([MinMaxState(o.min_val, o.max_val) for o in seen(name)]))
    with _record(results, "sync_observers:KL accumulator equals one pass"):
        single = _unsynced(families["KL"][0], everything)
        assert _same(tuple(model["KL"].accumulator), tuple(single.accumulator))
    single = _unsynced(families["Histogram"][0], everything)
    check("Histogram", (single.histogram, single.min_val, single.max_val), keys=("histogram", "min_val", "max_val"))
    with _record(results, "sync_observers:synced observers are left alone"):
        synced = ot.HistogramObserver(bins=128, sync=True)
        synced(_batch(rank, 2))
        before = copy.deepcopy(synced.state_dict())
        assert ot.sync_observers(torch.nn.Sequential(synced, ot.MinMaxObserver())) == 1
        _states_equal(synced, _with_state(ot.HistogramObserver(bins=128), before))
    with _record(results, "sync_observers:Histogram other ranges: the family merge, counts kept"):
        wide = [[_batch(5000 + r, 3, scale=1 + r)] for r in range(world)]
        obs = torch.nn.Sequential(_unsynced(families["Histogram"][0], wide[rank]))
        ot.sync_observers(obs)
        config = hist_family.Config(bins=128)
        states = [hist_family.State(o.histogram, o.min_val, o.max_val)
                  for o in (_unsynced(families["Histogram"][0], w) for w in wide)]  # fmt: skip
        expected = states[0]
        for s in states[1:]:
            expected = hist_family.merge(config, expected, s)
        assert _same((obs[0].histogram, obs[0].min_val, obs[0].max_val), tuple(expected))
        assert int(obs[0].histogram.sum()) == sum(w[0].numel() for w in wide)


def _check_prepared_models(results, ot, rank, world, pt2e):
    """Eager ``prepare``, FX ``prepare_fx`` (and PT2E ``prepare_pt2e``): rank r calibrates on its shard;
    after ``sync_observers`` every observer equals the single-process model's on all shards."""
    import torch.ao.quantization as tq
    from torch.ao.quantization.quantize_fx import prepare_fx

    qconfig = tq.QConfig(activation=ot.MinMaxObserver.with_args(reduce_range=True),
                         weight=ot.PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                                                      qscheme=torch.per_channel_symmetric))  # fmt: skip

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(tq.QuantStub(), torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 4, 3), tq.DeQuantStub()).eval()  # fmt: skip

    shards = [[torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(50 + 7 * r + i)) * (1 + r)
               for i in range(2)] for r in range(world)]  # fmt: skip
    flows = {"eager": lambda m: tq.prepare(_with_qconfig(m, qconfig)),
             "fx": lambda m: prepare_fx(m, tq.QConfigMapping().set_global(qconfig), example_inputs=(shards[0][0],))}
    if pt2e:
        flows["pt2e"] = lambda m: _prepare_pt2e(m, ot, shards[0][0])
    for flow, prepare in flows.items():
        with _record(results, f"prepared:{flow}"):
            mine, single = prepare(model()), prepare(model())
            with torch.no_grad():
                for x in shards[rank]:
                    mine(x)
                for x in (x for shard in shards for x in shard):
                    single(x)
            assert ot.sync_observers(mine) >= 2
            a, b = mine.state_dict(), single.state_dict()
            assert a.keys() == b.keys()
            for key in a:
                assert _same(a[key], b[key]), key


def _with_state(obs, state_dict):
    obs.load_state_dict(state_dict)
    return obs


def _with_qconfig(m, qconfig):
    m.qconfig = qconfig
    return m


def _prepare_pt2e(m, ot, example):
    import dataclasses

    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    config = get_default_x86_inductor_quantization_config()
    act = ot.MinMaxObserver.with_args(eps=2**-12)
    config = dataclasses.replace(
        config,
        input_activation=dataclasses.replace(config.input_activation, observer_or_fake_quant_ctr=act),
        output_activation=dataclasses.replace(config.output_activation, observer_or_fake_quant_ctr=act),
        weight=dataclasses.replace(config.weight, observer_or_fake_quant_ctr=ot.PerChannelMinMaxObserver.with_args(
            eps=2**-12)),
    )
    exported = torch.export.export(m, (example,)).module()
    return prepare_pt2e(exported, X86InductorQuantizer().set_global(config))


def _check_errors(results, ot, rank, world):
    """Mismatched configuration or shapes across ranks: a ValueError on every rank (no hang); bad
    arguments; a process group kept by deepcopy and dropped by pickling."""
    with _record(results, "mismatch:sync_observers config"):
        obs = torch.nn.Sequential(ot.HistogramObserver(bins=64 if rank == 0 else 128))
        _raises(ValueError, "differs between rank 0 and rank", ot.sync_observers, obs)
    with _record(results, "mismatch:sync_observers observer count"):
        obs = torch.nn.Sequential(*[ot.MinMaxObserver() for _ in range(1 + (rank == world - 1))])
        _raises(ValueError, "every rank must hold the same observers", ot.sync_observers, obs)
    with _record(results, "mismatch:sync_observers shapes"):
        obs = ot.PerChannelMinMaxObserver(ch_axis=1)
        obs(torch.randn(2, 3 + (rank == 0), 5))
        _raises(ValueError, "every rank must observe tensors of the same shape", ot.sync_observers,
                torch.nn.Sequential(obs))
    with _record(results, "mismatch:per-batch sync config"):
        obs = ot.MinMaxObserver(quant_max=127 if rank == 0 else 255, quant_min=0, sync=True)
        _raises(ValueError, "differs between rank 0 and rank", obs, torch.randn(3))
        assert bool(torch.isinf(obs.min_val)), "a failed check changed the state"
    with _record(results, "bad arguments"):
        _raises(TypeError, "process_group must be None", ot.MinMaxObserver, process_group="world")
        _raises(TypeError, "sync must be a bool", ot.HistogramObserver, sync="yes")
        _raises(TypeError, "model must be a torch.nn.Module", ot.sync_observers, [ot.MinMaxObserver()])
        _raises(TypeError, "x must be a torch.Tensor or a NumPy array", ot.TorchCollective().min, [1.0])
    with _record(results, "deepcopy keeps the process group, pickling drops it"):
        group = torch.distributed.new_group(list(range(world)))
        obs = ot.MinMaxObserver(sync=True, process_group=group)
        obs(torch.randn(4))
        twin = copy.deepcopy(obs)
        assert twin.process_group is group and twin.sync
        loaded = pickle.loads(pickle.dumps(obs))
        assert loaded.process_group is None and loaded.sync
        _states_equal(loaded, obs)
        twin(torch.randn(4))
        loaded(torch.randn(4))  # over the default group
    with _record(results, "TorchCollective on NumPy and integer arrays"):
        import numpy as np

        c = ot.TorchCollective()
        x = np.array([rank, np.nan if rank == world - 1 else 1.0], dtype=np.float32)
        lo, hi, total = c.min(x), c.max(x), c.sum(np.array([rank + 1], dtype=np.int64))
        assert isinstance(lo, np.ndarray) and lo.dtype == np.float32 and lo[0] == 0 and np.isnan(lo[1])
        assert hi[0] == world - 1 and np.isnan(hi[1])
        assert np.isnan(x[1]) == (rank == world - 1), "the input was modified"
        assert total.dtype == np.int64 and total.tolist() == [world * (world + 1) // 2]
        t = torch.randn(3, 5, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
        t[rank % 3, 1] = float("nan")
        lo2, hi2 = c.min_max(t, t * 2)  # one all_reduce for both
        assert _same(lo2, c.min(t)) and _same(hi2, c.max(t * 2)) and torch.isnan(lo2[:, 1]).sum() == min(world, 3)
        assert c.min_max(np.array([rank]), np.array([-rank])) == (0, 0)  # integers: two calls


def _raises(error, match, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except error as e:
        assert match in str(e), f"{type(e).__name__}: {e}"
        return
    raise AssertionError(f"{fn} did not raise {error.__name__}")


class _record:
    """Context manager: ``results[name] = "ok"``, or the error's last lines."""

    def __init__(self, results, name):
        self.results, self.name = results, name

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.results[self.name] = "ok" if kind is None else "".join(traceback.format_exception(kind, value, tb))[-1500:]
        return kind is not None and issubclass(kind, Exception)


def _rank_main(scenario: str, rank: int, world: int, port: int, out: Path) -> None:
    dist = torch.distributed
    timeout = datetime.timedelta(seconds=10 if scenario == "dies" else 60)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timeout)  # fmt: skip
    import observers_core.adapters.horizon as hz
    import observers_core.adapters.torch as ot

    results: dict = {}
    if scenario == "dies":
        if rank == world - 1:
            os._exit(3)
        start = time.monotonic()
        with _record(results, "peer died"):
            ot.HistogramObserver(sync=True)(torch.randn(8))
        results["elapsed_s"] = time.monotonic() - start
    else:
        _check_per_batch(results, ot, hz, rank, world)
        _check_nan_on_one_rank(results, ot, rank, world)
        _check_sync_observers(results, ot, hz, rank, world)
        _check_prepared_models(results, ot, rank, world, pt2e=scenario == "all+pt2e")
        _check_errors(results, ot, rank, world)
        dist.barrier()
        dist.destroy_process_group()
    out.joinpath(f"{rank}.json").write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)  # no teardown: a dead peer must not hold this rank in gloo's destructor


# -- the test side ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(scenario: str, world: int, out: Path) -> list:
    """Runs ``world`` ranks; ``[(returncode, results or None, output)]`` per rank. Leftovers are killed."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, __file__, scenario, str(r), str(world), str(port), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
             for r in range(world)]  # fmt: skip
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    files = [out / f"{r}.json" for r in range(world)]
    return [(p.returncode, json.loads(f.read_text()) if f.exists() else None, o)
            for p, f, o in zip(procs, files, outputs)]  # fmt: skip


#: Every group of checks and how many each rank must have run (a typo in a name cannot pass silently).
EXPECTED_CHECKS = {
    "per_batch:": 15,  # per-batch sync equals one process on the concatenated batch, state and qparams
    "nan_on_one_rank:": 6,
    "sync_observers:": 18,  # after unsynced calibration: the documented merge
    "prepared:": 2,  # eager and FX prepared models (and PT2E on 2 ranks)
    "mismatch:": 4,  # mismatched configuration or shapes: ValueError on every rank
    "bad arguments": 1,
    "deepcopy keeps the process group": 1,
    "TorchCollective on NumPy": 1,
}


@pytest.mark.slow  # 2 and 4 gloo processes
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_passes_every_check(world, tmp_path):
    """One spawn per world size (one test each, so pytest-xdist never spawns a world twice)."""
    ranks = _spawn("all+pt2e" if world == 2 else "all", world, tmp_path)
    problems = []
    for rank, (code, results, output) in enumerate(ranks):
        if code != 0 or results is None:
            problems.append(f"rank {rank} exited with {code}:\n{output[-3000:]}")
            continue
        for prefix, expected in {**EXPECTED_CHECKS, "prepared:": 3 if world == 2 else 2}.items():
            checks = {k: v for k, v in results.items() if k.startswith(prefix)}
            if len(checks) < expected:
                problems.append(f"rank {rank}: {len(checks)} {prefix!r} checks ran, expected {expected}")
            problems += [f"rank {rank}, {k}:\n{v}" for k, v in checks.items() if v != "ok"]
    assert not problems, f"world {world}:\n" + "\n".join(problems)


@pytest.mark.slow  # gloo processes
def test_a_dead_rank_gives_the_others_an_error_within_the_timeout(tmp_path):
    start = time.monotonic()
    ranks = _spawn("dies", 2, tmp_path)
    assert time.monotonic() - start < 120  # two process starts (torch imports) on a loaded machine, then the error
    assert ranks[1][0] == 3
    code, results, output = ranks[0]
    assert code == 0 and results is not None, output[-3000:]
    assert results["peer died"] != "ok", "the collective with a dead peer did not raise"
    assert results["elapsed_s"] < 15, results


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))


def test_sync_without_a_process_group_names_both_spellings():
    """``sync=True`` (Horizon's ``is_sync_quantize=True``) outside ``torch.distributed``: a RuntimeError that
    names both spellings and what to call, before anything is observed."""
    import torch.distributed as dist

    from observers_core.adapters import horizon
    from observers_core.adapters import torch as tobs

    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    for obs in (tobs.MinMaxObserver(sync=True), horizon.MinMaxObserver(is_sync_quantize=True)):
        before = {k: v.clone() for k, v in obs.state_dict().items()}
        with pytest.raises(RuntimeError, match=r"sync=True, alias is_sync_quantize=True\) needs torch.distributed "
                                               r"initialised: call torch.distributed.init_process_group"):
            obs(torch.randn(3, 4))
        assert all(torch.equal(before[k], v) for k, v in obs.state_dict().items())
