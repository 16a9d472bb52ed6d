"""Observer updates on one NVIDIA GPU: torch.ao on CUDA vs ours on torch CUDA, CuPy and JAX (jitted).

    python benchmarks/bench_gpu.py [--repeats 20]

Same float32 data on the GPU for every candidate; each timed repeat runs ``number`` calls and then
synchronises the device (``torch.cuda.synchronize``, which waits for CuPy's and JAX's work on the same
GPU too; JAX results are also ``block_until_ready``); medians of interleaved repeats (``_timing``).

- MinMax family (per tensor on 64M elements, per channel on (64, 1M) with ``ch_axis=0``): GB/s of input
  read, and that as a fraction of the device-to-device copy bandwidth measured here (a ``clone`` of the
  same tensor, bytes read plus written), the practical HBM peak. Goal (issue 16): ours >= 50% of it.
- HistogramObserver forward and ``calculate_qparams`` on (8, 64, 56, 56): torch.ao vs ours (torch CUDA,
  CuPy). Goals (issue 16): forward >= 5x, ``calculate_qparams`` >= 100x torch.ao's.
- The JAX rows are the JAX adapter's observers (their core steps under ``jax.jit``) on the GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line, time_interleaved  # noqa: E402

LARGE, CHANNELS = 1 << 26, 64
MINMAX = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
          "MovingAveragePerChannelMinMaxObserver"]


def kwargs_of(cls_name: str) -> dict:
    return {"ch_axis": 0} if "PerChannel" in cls_name else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    import torch
    from torch.ao.quantization import observer as tao

    from observers_core.adapters import torch as ours

    print(machine_line("torch", "jax", "cupy-cuda13x", "cupy-cuda12x", "numpy", "array-api-compat"))
    if not torch.cuda.is_available():
        print("torch sees no CUDA device here: nothing to measure")
        return 1
    print(f"cuda device: {torch.cuda.get_device_name()}")
    sync = torch.cuda.synchronize
    candidates_of_backend = {}
    try:
        import cupy

        from observers_core.adapters import cupy as ours_cupy

        candidates_of_backend["CuPy"] = (ours_cupy, cupy.asarray)
    except ImportError as e:
        print(f"CuPy rows skipped: {e}")
    try:
        import jax

        from observers_core.adapters import jax as ours_jax

        gpu = jax.devices("gpu")[0]
        candidates_of_backend["JAX"] = (ours_jax, lambda t: jax.device_put(t.cpu().numpy(), gpu))
    except (ImportError, RuntimeError) as e:
        print(f"JAX rows skipped: {e}")

    def block(obs):  # JAX dispatches asynchronously: wait for the observer's new state itself
        if "JAX" in candidates_of_backend and type(obs).__module__.endswith(".jax"):
            jax.block_until_ready(obs.state)

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(LARGE, device="cuda", generator=g)
    t_copy = time_interleaved({"clone": x.clone}, repeats=args.repeats, sync=sync)["clone"].median
    copy_gbps = 2 * x.numel() * 4 / t_copy / 1e9
    print(f"\ndevice-to-device copy of 64M float32 (clone): {copy_gbps:.0f} GB/s read + written")

    print(f"\nMinMax family, float32, 64M elements: GB/s of input read (fraction of the copy's {copy_gbps:.0f} GB/s)")
    print(f"{'observer':40s} {'torch.ao':>16s} {'ours torch':>16s}" + "".join(f"{'ours ' + b:>16s}" for b in candidates_of_backend))
    met_all = True
    for cls_name in MINMAX:
        data = x.reshape(CHANNELS, -1) if "PerChannel" in cls_name else x
        kw = kwargs_of(cls_name)
        cands = {"torch.ao": partial(getattr(tao, cls_name)(**kw).cuda(), data),
                 "ours torch": partial(getattr(ours, cls_name)(**kw).cuda(), data)}
        for backend, (module, convert) in candidates_of_backend.items():
            obs, arr = getattr(module, cls_name)(**kw), convert(data)
            cands[f"ours {backend}"] = lambda obs=obs, arr=arr: (obs(arr), block(obs))
        t = time_interleaved(cands, number=5, repeats=args.repeats, sync=sync)
        cells = ""
        for name, timing in t.items():
            gbps = data.numel() * 4 / timing.median / 1e9
            cells += f"{gbps:8.0f} ({gbps / copy_gbps:4.0%})"
        frac = data.numel() * 4 / t["ours torch"].median / 1e9 / copy_gbps
        met_all &= frac >= 0.5
        print(f"{cls_name:40s} {cells}")
    print("  goal: ours torch >= 50% of the copy bandwidth: " + ("met" if met_all else "NOT met"))

    print("\nHistogramObserver, float32 (8, 64, 56, 56), default arguments: ms per call")
    xs = [torch.randn(8, 64, 56, 56, device="cuda", generator=g) * (1 + i % 3) for i in range(4)]
    theirs, mine = tao.HistogramObserver().cuda(), ours.HistogramObserver().cuda()
    for batch in xs:
        theirs(batch)
        mine(batch)
    fwd = {"torch.ao": lambda: theirs(xs[1]), "ours torch": lambda: mine(xs[1])}
    qp = {"torch.ao": theirs.calculate_qparams, "ours torch": mine.calculate_qparams}
    # the same forward recorded once as a CUDA graph and replayed (ignore_nonfinite=True: the default
    # reads two counts for torch's warnings, a synchronisation a graph cannot hold)
    graphed = ours.HistogramObserver(ignore_nonfinite=True).cuda()
    for batch in xs:
        graphed(batch)
    step = ours.cuda_graph_forward(graphed, xs[1])
    fwd["ours graph"] = lambda: step(xs[1])
    qp["ours graph"] = graphed.calculate_qparams
    for backend, (module, convert) in candidates_of_backend.items():
        obs = module.HistogramObserver()
        arrs = [convert(batch) for batch in xs]
        for arr in arrs:
            obs(arr)
        fwd[f"ours {backend}"] = lambda obs=obs, arr=arrs[1]: (obs(arr), block(obs))
        qp[f"ours {backend}"] = lambda obs=obs: jax.block_until_ready(obs.calculate_qparams()) if "JAX" in backend \
            else obs.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_fwd = time_interleaved(fwd, number=5, repeats=args.repeats, sync=sync)
        t_qp = time_interleaved(qp, number=1, repeats=max(3, args.repeats // 4), sync=sync)
    for name in fwd:
        print(f"  {name:12s} forward {t_fwd[name].median * 1e3:8.3f} ms ({t_fwd['torch.ao'].median / t_fwd[name].median:6.1f}x torch.ao)"
              f"   calculate_qparams {t_qp[name].median * 1e3:9.3f} ms ({t_qp['torch.ao'].median / t_qp[name].median:6.1f}x torch.ao)")
    print("  (ours graph: HistogramObserver(ignore_nonfinite=True)'s forward replayed as one CUDA graph by"
          " cuda_graph_forward; the copy of the batch into its input included)")
    r_fwd = t_fwd["torch.ao"].median / t_fwd["ours torch"].median
    r_qp = t_qp["torch.ao"].median / t_qp["ours torch"].median
    print(f"  goals (ours torch): forward >= 5x: {'met' if r_fwd >= 5 else 'NOT met'} ({r_fwd:.1f}x); "
          f"calculate_qparams >= 100x: {'met' if r_qp >= 100 else 'NOT met'} ({r_qp:.1f}x)")
    print("\nall goals met" if met_all and r_fwd >= 5 and r_qp >= 100 else "\nsome goals not met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
