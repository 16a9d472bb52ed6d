"""Histogram observer core vs torch.ao's HistogramObserver, on the same data in the same process.

    python benchmarks/bench_histogram.py [--part search|update|jax|all] [--threads N] [--repeat K]

- search: ``non_linear_param_search`` (what ``calculate_qparams`` spends its time in) on 2048-bin
  histograms of several shapes vs torch's ``_non_linear_param_search`` loop on the same histogram, on
  NumPy and torch CPU (compiled kernels on, the default) and on torch with the kernels off (the array-API
  code, as torch runs on CUDA);
- update: 10 batches of 1M float32 values with a growing range, ``histogram_update`` vs
  ``HistogramObserver.forward``;
- jax: the same update and search under ``jax.jit``, in a subprocess of its own (torch's and XLA's
  thread pools fight when they share a process).

Every comparison checks that both give the same result, then prints the times (best of ``--repeat``)
and the ratio torch / ours. The machine is printed first; absolute times mean little on a shared CPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line  # noqa: E402

BINS = 2048


def machine() -> str:
    """The shared machine line, plus the load and torch's threads and CPU capability."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{machine_line('numpy', 'torch', 'numba')}; load {load:.1f}; torch {torch.get_num_threads()} threads, "
            f"{torch.backends.cpu.get_cpu_capability()}")


def best_of(fn, repeat: int) -> float:
    """Best wall time of ``repeat`` calls after one warm-up call, in milliseconds."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def histograms(seed: int = 0) -> dict[str, tuple[np.ndarray, np.float32, np.float32]]:
    """2048-bin histograms (torch.histc of 1M values) of a few typical tensors."""
    import torch

    rng = np.random.default_rng(seed)
    n = 1_000_000
    data = {
        "normal": rng.normal(size=n),
        "normal+outliers": np.concatenate([rng.normal(size=n - 100), rng.normal(size=100) * 40]),
        "laplace": rng.laplace(size=n),
        "relu": np.maximum(rng.normal(size=n), 0),
        "bimodal": np.concatenate([rng.normal(-4, 0.5, n // 2), rng.normal(3, 1.5, n // 2)]),
    }
    out = {}
    for name, x in data.items():
        x = torch.from_numpy(x.astype(np.float32))
        lo, hi = float(x.min()), float(x.max())
        out[name] = (torch.histc(x, BINS, lo, hi).numpy(), np.float32(lo), np.float32(hi))
    return out


def bench_search(repeat: int) -> None:
    import torch
    from torch.ao.quantization.observer import HistogramObserver

    import observers_core as oc
    from observers_core import _compiled

    def search(args, kernels: bool):
        saved, _compiled.ENABLED = _compiled.ENABLED, kernels and _compiled.AVAILABLE
        try:
            return oc.non_linear_param_search(*args, dst_nbins=256)
        finally:
            _compiled.ENABLED = saved

    print(f"\n## search: non_linear_param_search on {BINS}-bin histograms (dst_nbins=256), "
          f"compiled kernels {'available' if _compiled.AVAILABLE else 'NOT INSTALLED'}")
    print(f"{'histogram':<16} {'torch.ao ms':>12} {'numpy ms':>9} {'ratio':>6} {'torch ms':>9} {'ratio':>6} "
          f"{'torch, no kernels':>18} {'ratio':>6}")
    for name, (hist, lo, hi) in histograms().items():
        obs = HistogramObserver(bins=BINS)
        obs.histogram, obs.min_val, obs.max_val = torch.tensor(hist), torch.tensor(lo), torch.tensor(hi)
        expected = tuple(float(v) for v in obs._non_linear_param_search())
        args_np = (hist, np.asarray(lo), np.asarray(hi))
        args_t = (torch.tensor(hist), torch.tensor(lo), torch.tensor(hi))
        runs = [(args_np, True), (args_t, True), (args_t, False)]
        for args, kernels in runs:
            got = tuple(float(v) for v in search(args, kernels))
            assert got == expected, (name, kernels, got, expected)
        t_ref = best_of(obs._non_linear_param_search, max(1, repeat // 3))
        times = [best_of(lambda a=args, k=kernels: search(a, k), repeat) for args, kernels in runs]
        print(f"{name:<16} {t_ref:12.2f}" + "".join(f" {t:9.2f} {t_ref / t:6.1f}" for t in times[:2])
              + f" {times[2]:18.2f} {t_ref / times[2]:6.1f}")


def growing_batches(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=1_000_000) * (1 + 0.5 * i)).astype(np.float32) for i in range(10)]


def bench_update(repeat: int) -> None:
    import array_api_compat.numpy as xnp
    import array_api_compat.torch as xt
    import torch
    from torch.ao.quantization.observer import HistogramObserver

    import observers_core as oc

    batches = growing_batches()
    tensors = [torch.from_numpy(b) for b in batches]

    def torch_ao():
        obs = HistogramObserver(bins=BINS)
        for t in tensors:
            obs(t)
        return obs

    def ours(xp, data):
        state = oc.histogram_init(bins=BINS, xp=xp)
        for x in data:
            state = oc.histogram_update(state, x)
        return state

    obs = torch_ao()
    for xp, data in ((xnp, batches), (xt, tensors)):
        state = ours(xp, data)
        assert np.array_equal(np.asarray(state.histogram), obs.histogram.numpy())
        assert float(state.min_val) == obs.min_val.item() and float(state.max_val) == obs.max_val.item()
    t_ref = best_of(torch_ao, repeat)
    t_np = best_of(lambda: ours(xnp, batches), repeat)
    t_t = best_of(lambda: ours(xt, tensors), repeat)
    print(f"\n## update: 10 batches of 1M float32 values, growing range, {BINS} bins (same final state)")
    print(f"torch.ao forward   {t_ref:8.1f} ms")
    print(f"ours, numpy        {t_np:8.1f} ms   ratio {t_ref / t_np:.2f}")
    print(f"ours, torch        {t_t:8.1f} ms   ratio {t_ref / t_t:.2f}")


def bench_jax(repeat: int) -> None:
    """Jitted update and search (run in its own process by ``--part all``)."""
    import jax
    import jax.numpy as jnp

    import observers_core as oc

    print(f"\n## jax {jax.__version__} ({jax.devices()[0].platform}), jitted")
    batches = [jnp.asarray(b) for b in growing_batches()]
    update = jax.jit(oc.histogram_update)
    state = oc.histogram_init(bins=BINS, xp=jnp)
    start = time.perf_counter()
    jax.block_until_ready(update(state, batches[0]))
    print(f"update compile+first run  {time.perf_counter() - start:8.2f} s")

    def run():
        s = oc.histogram_init(bins=BINS, xp=jnp)
        for b in batches:
            s = update(s, b)
        return jax.block_until_ready(s)

    t = best_of(run, repeat)
    print(f"update, 10 x 1M values    {t:8.1f} ms   ({10e6 / t / 1e3:.0f} M values/s)")
    search = jax.jit(oc.non_linear_param_search, static_argnames="dst_nbins")
    final = run()
    start = time.perf_counter()
    jax.block_until_ready(search(*final, dst_nbins=256))
    print(f"search compile+first run  {time.perf_counter() - start:8.2f} s")
    t = best_of(lambda: jax.block_until_ready(search(*final, dst_nbins=256)), repeat)
    print(f"search ({BINS} bins, candidates up to the first rise)  {t:8.1f} ms")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["search", "update", "jax", "all"], default="all")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.part == "jax":
        bench_jax(args.repeat)
        return
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine())
    if args.part in ("search", "all"):
        bench_search(args.repeat)
    if args.part in ("update", "all"):
        bench_update(args.repeat)
    if args.part == "all":
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "--part", "jax", "--repeat", str(args.repeat)], check=True)


if __name__ == "__main__":
    main()
