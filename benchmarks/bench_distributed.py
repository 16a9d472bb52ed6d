"""Distributed calibration cost on gloo (issue 13): per-batch ``sync=True`` and one ``sync_observers`` call
for a ResNet-18-shaped model's observers, on 2 and 4 local processes, against the same observers unsynced.

The model is :mod:`bench_model_calibration`'s (ResNet-18 layout, batch norm folded, eager ``prepare``).
Each rank runs one forward on its own batch (``--batch`` x 3 x 224 x 224) and records what every activation
observer saw; the timed step is "every activation observer observes its tensor" (the model's observer
work per batch; the forward itself is the same with and without sync), synced and unsynced, interleaved,
medians over ``--repeats``. ``sync_observers`` is timed on the unsynced observers plus the per-channel
weight observers (fed the weights), as in a prepared model. Bytes are the payloads each rank hands to
``all_reduce`` / ``all_gather`` (a ring all-reduce moves about twice that per rank); timings are rank 0's.
On this machine the ranks share few cores, so the synced time includes waiting for the slowest rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.ao import quantization as tq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine_line, time_interleaved  # noqa: E402
from bench_model_calibration import fused, make_model  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402

#: Activation observer constructors (weights: per-channel MinMax, qint8 symmetric).
CONFIGS = {
    "MinMaxObserver": lambda **kw: ours.MinMaxObserver(reduce_range=True, **kw),
    "MovingAverageMinMaxObserver": lambda **kw: ours.MovingAverageMinMaxObserver(reduce_range=True, **kw),
    "HistogramObserver": lambda **kw: ours.HistogramObserver(reduce_range=True, **kw),
    "KLObserver": lambda **kw: ours.KLObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine, **kw),
    "MixObserver": lambda **kw: ours.MixObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine, **kw),
}


class ByteCounter:
    """Counts the payload bytes handed to ``all_reduce``/``all_gather`` (patched module functions)."""

    def __init__(self) -> None:
        self.bytes, self.calls = 0, 0
        for name in ("all_reduce", "all_gather"):
            setattr(dist, name, self._counting(getattr(dist, name)))

    def _counting(self, fn):
        def counted(*args, **kwargs):
            tensor = args[1] if fn.__name__ == "all_gather" else args[0]
            self.bytes += tensor.numel() * tensor.element_size()
            self.calls += 1
            return fn(*args, **kwargs)

        counted.__name__ = fn.__name__
        return counted

    def take(self) -> tuple[int, int]:
        out = (self.bytes, self.calls)
        self.bytes, self.calls = 0, 0
        return out


def activations_and_weights(batch: int, rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What each activation observer of the prepared model sees for one batch of this rank, and the
    weights its per-channel weight observers would see."""
    model = fused(make_model())
    model.qconfig = tq.QConfig(activation=ours.MinMaxObserver, weight=ours.default_per_channel_weight_observer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = tq.prepare(model)
    seen: list[torch.Tensor] = []
    for m in prepared.modules():
        if isinstance(m, ours.MinMaxObserver):
            m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        prepared(x)
    weights = [m.weight.detach() for m in prepared.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    return seen, weights


def rank_main(rank: int, world: int, port: int, batch: int, repeats: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # torch's reduce_range deprecation, once per observer
    counter = ByteCounter()
    acts, weights = activations_and_weights(batch, rank)
    if rank == 0:
        n_elems = sum(a.numel() for a in acts)
        print(f"world {world}: {len(acts)} activation observers ({n_elems / 1e6:.1f} M values per batch per rank), "
              f"{len(weights)} weight observers", flush=True)
    for name, make in CONFIGS.items():
        synced = [make(sync=True) for _ in acts]
        plain = [make() for _ in acts]

        def step(observers):
            for obs, a in zip(observers, acts):
                obs(a)

        step(synced)
        counter.take()
        step(synced)  # one counted step (the first synced batch also ran the configuration check)
        batch_bytes, batch_calls = counter.take()
        times = time_interleaved({"synced": lambda: step(synced), "unsynced": lambda: step(plain)},
                                 repeats=repeats, warmup=1)  # fmt: skip
        model = torch.nn.ModuleList(plain + [ours.default_per_channel_weight_observer() for _ in weights])
        for obs, w in zip(model[len(plain):], weights):
            obs(w)
        counter.take()
        ours.sync_observers(model)
        merge_bytes, merge_calls = counter.take()
        merge_times = []
        for _ in range(max(3, repeats // 2)):
            dist.barrier()
            t0 = time.perf_counter()
            ours.sync_observers(model)
            merge_times.append(time.perf_counter() - t0)
        if rank == 0:
            s, u = times["synced"].median, times["unsynced"].median
            print(f"  {name:28s} per batch: unsynced {u * 1e3:8.1f} ms, synced {s * 1e3:8.1f} ms "
                  f"(+{(s - u) * 1e3:7.1f} ms, x{s / u:5.2f}), {batch_bytes:>9,d} B in {batch_calls} all_reduce; "
                  f"sync_observers {sorted(merge_times)[len(merge_times) // 2] * 1e3:7.1f} ms, "
                  f"{merge_bytes:>9,d} B in {merge_calls} all_gather (+ the fingerprint's all_gather_object)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args.batch, args.repeats)
        return
    print(machine_line("torch", "numpy", "numba"))
    print(f"gloo on 127.0.0.1, batch {args.batch}x3x224x224 per rank, medians of {args.repeats} (rank 0's clock)")
    for world in args.worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--batch", str(args.batch), "--repeats", str(args.repeats),
               "--world", str(world), "--port", str(port)]  # fmt: skip
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(world)]
        try:
            for p in procs:
                p.wait(timeout=900)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs):
            raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")


if __name__ == "__main__":
    main()
