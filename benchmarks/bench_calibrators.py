"""Histogram calibration searches: observers_core vs NVIDIA ModelOpt, same histogram, same process.

    python benchmarks/bench_calibrators.py                       # numpy, torch, jax, jax-x64
    python benchmarks/bench_calibrators.py --backends torch
    OMP_NUM_THREADS=1 python benchmarks/bench_calibrators.py     # on a shared, loaded machine

Each backend runs in a fresh process (``_timing.run_isolated``: torch's and JAX's thread pools fight in
one process), where ModelOpt's ``_compute_amax_entropy`` / ``_compute_amax_mse`` /
``_compute_amax_percentile`` and ours (``kl_threshold`` / ``mse_threshold`` / ``percentile_range``) run
on the same 2048-bin histogram of |x| with ModelOpt's defaults (int8, start_bin 128, stride 1,
percentile 99.99); ours after a warm-up (JAX: ``jit`` compiled), both timed interleaved
(``_timing.time_interleaved``, medians); the per-tensor percentile also against a bare NumPy
``np.cumsum`` + ``np.searchsorted`` on the same histogram, and per channel against one NumPy sum of
every row (the one read of the counts that any exact percentile needs); timed with them, ratios below.
Then 256 such histograms per channel: ModelOpt's percentile runs its per-channel loop; its entropy and
MSE searches (minutes per channel set) are not run, their time is 256 x the per-tensor median, marked ``~``.

ModelOpt 0.47's ``_compute_amax_mse`` passes ``num_bits`` into ``fake_tensor_quant``'s ``bias`` slot:
it is timed as installed (the same work); its thresholds are those of a broken quantizer, so ours are
compared with its loop called correctly in tests/test_calibration_core.py, not here.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line, run_isolated, time_interleaved  # noqa: E402

BINS, CHANNELS, SAMPLES = 2048, 256, 999_983  # a prime count: no percentile lands exactly on a count
BACKENDS = ("numpy", "torch", "jax", "jax-x64")


def histograms(seed: int = 0):
    """One 2048-bin histogram of |x| (Laplace) and 256 per-channel ones (Student-t, varied scales)."""
    rng = np.random.default_rng(seed)
    x = np.abs(rng.laplace(size=SAMPLES) * rng.uniform(0.5, 2.0))
    h, e = np.histogram(x, bins=BINS, range=(0.0, float(x.max())))
    hs, es = [], []
    for _ in range(CHANNELS):
        xc = np.abs(rng.standard_t(df=4, size=SAMPLES // 64) * rng.uniform(0.1, 10))
        hc, ec = np.histogram(xc, bins=BINS, range=(0.0, float(xc.max())))
        hs.append(hc)
        es.append(ec)
    return h, e, np.stack(hs), np.stack(es)


def bench_backend(backend: str) -> dict:
    """Rows ``(search, ModelOpt seconds, our seconds, estimated, same threshold)`` for one backend."""
    import observers_core as oc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.quantization.calib import histogram as mo

    if backend == "numpy":
        import array_api_compat.numpy as xp

        put, wrap, block = np.asarray, (lambda f: f), (lambda r: r)
    elif backend == "torch":
        import array_api_compat.torch as xp
        import torch

        put, wrap, block = torch.as_tensor, (lambda f: f), (lambda r: r)
    else:
        import jax

        jax.config.update("jax_enable_x64", backend == "jax-x64")
        import jax.numpy as xp

        put, wrap, block = jax.numpy.asarray, jax.jit, jax.block_until_ready

    h, e, hc, ec = histograms()
    spec = oc.quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)  # ModelOpt's int8
    kl = wrap(lambda a, b: oc.kl_threshold(a, b, xp=xp))
    mse = wrap(lambda a, b: oc.mse_threshold(a, b, spec=spec, start_bin=128, xp=xp))
    pct = wrap(lambda a, b: oc.percentile_range(a, b, percentile=99.99, xp=xp)[1])
    H, E, HC, EC = put(h), put(e), put(hc), put(ec)
    rows = []

    def same(ours, theirs) -> bool:
        return bool(np.array_equal(np.float32(np.asarray(ours)), np.float32(np.asarray(theirs, dtype=np.float64))))

    baselines = []  # (label, baseline, its seconds, our seconds)

    def measure(label, theirs, ours, *, number=1, repeats=5, estimate=None, check=True, bare=()):
        """One row; ``bare``: ``(description, function)`` baselines timed with it."""
        block(ours())  # warm-up, JAX: compile
        cands = {"ours": lambda: block(ours())} if estimate else {"theirs": theirs, "ours": lambda: block(ours())}
        cands.update({what: fn for what, fn in bare})
        t = time_interleaved(cands, number=number, repeats=repeats, warmup=0 if estimate else 1)
        t_theirs = estimate if estimate else t["theirs"].median
        equal = same(ours(), theirs()) if check else None
        rows.append((label, t_theirs, t["ours"].median, bool(estimate), equal))
        baselines.extend((label, what, t[what].median, t["ours"].median) for what, _ in bare)
        return t_theirs

    def read_counts():  # the least any percentile of every row costs: each row's total needs all its counts
        return hc.sum(axis=1)

    def bare_percentile():  # the least a percentile can cost: NumPy's cumulative sum and binary search
        cum = np.cumsum(h)
        return float(e[np.searchsorted(cum, 0.9999 * cum[-1])])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_kl = measure("KL (entropy), 1 x 2048", lambda: float(mo._compute_amax_entropy(h.copy(), e, 8, False, 1, 128)),
                       lambda: kl(H, E), repeats=1)
    t_mse = measure("MSE, 1 x 2048", lambda: mo._compute_amax_mse(h.copy(), e, 8, False, 1, 128),
                    lambda: mse(H, E), repeats=5, check=False)
    bare = [("bare NumPy cumsum + searchsorted", bare_percentile)]
    if backend.startswith("jax"):  # JAX's own floor: XLA's cumulative sum on the CPU is slower than NumPy's
        bare_jax = jax.jit(lambda a, b: b[xp.searchsorted(xp.cumsum(a), 0.9999 * xp.sum(a))])
        bare.append(("bare jnp cumsum + searchsorted under jit", lambda: block(bare_jax(H, E))))
    measure("percentile, 1 x 2048", lambda: float(mo._compute_amax_percentile(h, e, 99.99)),
            lambda: pct(H, E), number=50, repeats=9, bare=bare)
    if backend != "jax":  # the same bin (JAX in float32 rounds the target keep * N: it may pick the bin below)
        assert np.float32(bare_percentile()) == np.float32(np.asarray(pct(H, E)))
    measure(f"KL, {CHANNELS} x 2048", None, lambda: kl(HC, EC), repeats=2, estimate=CHANNELS * t_kl, check=False)
    measure(f"MSE, {CHANNELS} x 2048", None, lambda: mse(HC, EC), repeats=2, estimate=CHANNELS * t_mse, check=False)
    measure(f"percentile, {CHANNELS} x 2048",
            lambda: [float(mo._compute_amax_percentile(hc[c], ec[c], 99.99)) for c in range(CHANNELS)],
            lambda: pct(HC, EC), repeats=5, bare=[("reading the counts once (NumPy sum of each row)", read_counts)])
    dtype = "float64" if backend != "jax" else "float32 (JAX without x64)"
    return {"backend": backend, "arithmetic": dtype, "rows": rows, "baselines": baselines}


def fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    args = parser.parse_args()
    print(machine_line("numpy", "torch", "jax", "nvidia-modelopt", "array-api-compat"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"histogram: {BINS} bins of |x|, {SAMPLES:,} samples; per channel: {CHANNELS} x {BINS} bins")
    here = os.path.abspath(__file__)
    for backend in args.backends:
        res = run_isolated(here, "bench_backend", backend=backend, timeout=3600)
        jit = ", under jax.jit" if backend.startswith("jax") else ""
        print(f"\n[{backend}] ours in {res['arithmetic']}{jit}")
        print(f"  {'search':<28}{'ModelOpt':>12}{'ours':>12}{'ratio':>9}  same threshold")
        for label, t_theirs, t_ours, estimated, equal in res["rows"]:
            mark = "~" if estimated else " "
            note = "-" if equal is None else str(equal)
            ratio = t_theirs / t_ours
            shown = f"{ratio:>8.0f}x" if ratio >= 10 else f"{ratio:>8.2f}x"
            print(f"  {label:<28}{mark}{fmt(t_theirs):>11}{fmt(t_ours):>12}{shown}  {note}")
        for label, what, t_bare, t_ours in res.get("baselines", []):
            print(f"  {label}: {what} {fmt(t_bare)}, ours {fmt(t_ours)} = {t_ours / t_bare:.2f}x that time")


if __name__ == "__main__":
    main()
