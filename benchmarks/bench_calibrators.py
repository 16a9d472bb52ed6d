"""Histogram calibration searches: observers_core vs NVIDIA ModelOpt, same histogram, same process.

    python benchmarks/bench_calibrators.py                    # numpy, torch, jax, jax-x64: a process each
    python benchmarks/bench_calibrators.py --backend torch    # one backend, this process
    OMP_NUM_THREADS=1 python benchmarks/bench_calibrators.py  # on a shared, loaded machine

Per backend, in one process: ModelOpt's ``_compute_amax_entropy`` / ``_compute_amax_mse`` /
``_compute_amax_percentile`` and ours (``kl_threshold`` / ``mse_threshold`` / ``percentile_range``) on
the same 2048-bin histogram of |x| (ModelOpt's defaults: int8, start_bin 128, stride 1, percentile
99.99), then per channel on 256 such histograms. Ours is timed after a warm-up (JAX: after ``jit``
compiled), median of repeats; ModelOpt once per histogram. For 256 channels ModelOpt's entropy and
MSE searches (a Python loop per channel) are not run: their time is 256 x the measured per-tensor time,
and printed as an estimate. ModelOpt 0.47's ``_compute_amax_mse`` passes ``num_bits`` into
``fake_tensor_quant``'s ``bias`` slot: it is timed as installed (the same amount of work); the
thresholds are compared with its loop called correctly (see tests/test_calibration_core.py).
Each backend runs in its own process: torch's and JAX's thread pools fight in one process.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

BINS, CHANNELS, SAMPLES = 2048, 256, 999_983  # a prime: no percentile lands exactly on a count


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return (f"machine: {cpu}, {os.cpu_count()} logical cores, load average {load:.1f}, "
            f"OMP_NUM_THREADS={threads}, {platform.system()} {platform.release()}, Python {platform.python_version()}")


def versions() -> str:
    import importlib.metadata as md

    parts = []
    for name in ("numpy", "torch", "jax", "nvidia-modelopt", "array-api-compat"):
        try:
            parts.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            parts.append(f"{name} -")
    return ", ".join(parts)


def histograms(seed: int = 0):
    """One 2048-bin histogram of |x| (x: Laplace-tailed activations) and 256 per-channel ones."""
    rng = np.random.default_rng(seed)
    x = np.abs(rng.laplace(size=SAMPLES) * rng.uniform(0.5, 2.0))
    h, e = np.histogram(x, bins=BINS, range=(0.0, float(x.max())))
    hs, es = [], []
    for c in range(CHANNELS):
        xc = np.abs(rng.standard_t(df=4, size=SAMPLES // 64) * rng.uniform(0.1, 10))
        hc, ec = np.histogram(xc, bins=BINS, range=(0.0, float(xc.max())))
        hs.append(hc)
        es.append(ec)
    return h, e, np.stack(hs), np.stack(es)


def timed(fn, *, repeat: int, sync=lambda r: r) -> tuple[float, object]:
    out = sync(fn())  # warm-up (and jit compile)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = sync(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def once(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:8.2f} s "
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds * 1e6:8.1f} us"


def run_backend(name: str) -> None:
    import observers_core as oc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.quantization.calib import histogram as mo

    h, e, hc, ec = histograms()
    spec = oc.quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)  # ModelOpt's int8

    if name == "numpy":
        import array_api_compat.numpy as xp

        put, sync = (lambda a: a), (lambda r: r)
        wrap = lambda f: f  # noqa: E731
    elif name == "torch":
        import array_api_compat.torch as xp
        import torch

        put, sync = torch.as_tensor, (lambda r: r)
        wrap = lambda f: f  # noqa: E731
    elif name in ("jax", "jax-x64"):
        import jax

        jax.config.update("jax_enable_x64", name == "jax-x64")
        import jax.numpy as xp

        put = jax.numpy.asarray
        sync = lambda r: jax.block_until_ready(r)  # noqa: E731
        wrap = jax.jit
    else:
        raise SystemExit(f"unknown backend {name}")
    with_x64 = name != "jax"  # JAX computes in float32 unless x64 is enabled

    kl = wrap(lambda a, b: oc.kl_threshold(a, b, xp=xp))
    mse = wrap(lambda a, b: oc.mse_threshold(a, b, spec=spec, start_bin=128, xp=xp))
    pct = wrap(lambda a, b: oc.percentile_range(a, b, percentile=99.99, xp=xp)[1])
    H, E, HC, EC = put(h), put(e), put(hc), put(ec)

    print(f"\n[{name}] ours runs in {'float64' if with_x64 else 'float32 (JAX without x64)'}"
          f"{', under jax.jit' if name.startswith('jax') else ''}")
    print(f"  {'search':<28}{'ModelOpt':>12}{'ours':>12}{'ratio':>10}  same threshold")

    def row(label, t_mo, t_us, same, estimate=False):
        mark = "~" if estimate else " "
        print(f"  {label:<28}{mark}{fmt(t_mo):>11}{fmt(t_us):>12}{t_mo / t_us:>9.0f}x  {same}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_mo_kl, r_mo = once(lambda: mo._compute_amax_entropy(h.copy(), e, 8, False, 1, 128))
    t_us, r_us = timed(lambda: kl(H, E), repeat=5, sync=sync)
    row("KL (entropy), 1 x 2048", t_mo_kl, t_us, np.float32(np.asarray(r_us)) == np.float32(float(r_mo)))

    t_mo_mse, _ = min(once(lambda: mo._compute_amax_mse(h.copy(), e, 8, False, 1, 128)) for _ in range(3))
    t_us, r_us = timed(lambda: mse(H, E), repeat=10, sync=sync)
    row("MSE, 1 x 2048", t_mo_mse, t_us, "(see note)")

    t_mo, r_mo = timed(lambda: mo._compute_amax_percentile(h, e, 99.99), repeat=200)
    t_us, r_us = timed(lambda: pct(H, E), repeat=200, sync=sync)
    row("percentile, 1 x 2048", t_mo, t_us, np.float32(np.asarray(r_us)) == np.float32(float(r_mo)))

    t_us, r_us = timed(lambda: kl(HC, EC), repeat=2, sync=sync)
    row(f"KL, {CHANNELS} x 2048", CHANNELS * t_mo_kl, t_us, "(256 x 1 estimated)", estimate=True)
    t_us, r_us = timed(lambda: mse(HC, EC), repeat=2, sync=sync)
    row(f"MSE, {CHANNELS} x 2048", CHANNELS * t_mo_mse, t_us, "(256 x 1 estimated)", estimate=True)
    t_mo, r_mo = timed(lambda: [mo._compute_amax_percentile(hc[c], ec[c], 99.99) for c in range(CHANNELS)], repeat=5)
    t_us, r_us = timed(lambda: pct(HC, EC), repeat=20, sync=sync)
    same = np.array_equal(np.float32(np.asarray(r_us)), np.float32([float(r) for r in r_mo]))
    row(f"percentile, {CHANNELS} x 2048", t_mo, t_us, same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["numpy", "torch", "jax", "jax-x64"])
    args = parser.parse_args()
    if args.backend:
        run_backend(args.backend)
        return
    print(machine())
    print(versions())
    print(f"histogram: {BINS} bins of |x|, {SAMPLES:,} samples; per channel: {CHANNELS} x {BINS} bins")
    for name in ("numpy", "torch", "jax", "jax-x64"):
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "--backend", name], check=True)


if __name__ == "__main__":
    main()
