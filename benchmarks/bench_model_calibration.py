"""Whole-model calibration: the time observers add to a ResNet-18-shaped network's calibration run.

The network is built here (no weight download): ResNet-18's layout (BasicBlocks 2-2-2-2, 64..512
channels, batch norm folded by ``fuse_modules``), random weights, batch 8 at 224x224, 8 calibration
batches. Each configuration runs the eager ``QConfig``/``prepare`` flow and feeds the batches; the time
it adds is its calibration time (forward passes and the final ``calculate_qparams`` of every observer)
minus the float model's forward time over the same batches, measured interleaved in one process
(the median over ``--repeats`` rounds of the difference to the float model's time in the same round;
ModelOpt's entropy calibration, minutes long, is timed once and compared with the float model's median). Peak memory is the process's peak RSS growth during one run of each
configuration (``ru_maxrss``; measured once, in order, so later configurations only show growth beyond
earlier peaks: read it as an upper bound on extra memory); with ``--device cuda``, the model, batches and
observers are on the GPU, every timed run ends with ``torch.cuda.synchronize()``, and the memory column
is torch's allocator peak over what was allocated before the run.

Configurations: torch.ao's HistogramObserver; ours; our KL, MSE, percentile and Mix observers (Horizon
defaults: qint8 symmetric per tensor, which is what ``QConfig`` gets for activations here); ModelOpt 0.47's
own INT8 calibration of the same network (``mtq.quantize`` with ``INT8_DEFAULT_CFG``: max calibration; and
the same with histogram calibrators and the entropy amax). Weights use the per-channel MinMax observer of
the same library (torch.ao's for torch.ao, ours for ours).

Goals (issue 12): our HistogramObserver's added time <= 0.3x torch.ao's; KL, MSE and percentile added
time <= 1.5x our HistogramObserver's; our KL added time <= 0.5x ModelOpt's entropy calibration.
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.ao import quantization as tq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine_line  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402
from torch.ao.quantization import observer as torch_ao  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.add = nn.quantized.FloatFunctional()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        skip = x if self.down is None else self.down(x)
        return self.relu2(self.add.add(out, skip))


class ResNet18Shaped(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(3, 2, 1)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
            blocks.append(BasicBlock(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(self.quant(x)))))
        return self.dequant(self.fc(self.avgpool(self.blocks(x)).flatten(1)))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = ResNet18Shaped().eval()
    for m in model.modules():  # non-trivial batch norm statistics, so folding changes the weights
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


def fused(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model)
    tq.fuse_modules(model, [["conv1", "bn1", "relu"]], inplace=True)
    for block in model.blocks:
        tq.fuse_modules(block, [["conv1", "bn1", "relu1"], ["conv2", "bn2"]], inplace=True)
        if block.down is not None:
            tq.fuse_modules(block.down, [["0", "1"]], inplace=True)
    return model


def make_batches(n: int, batch: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, 224, 224, generator=g) for _ in range(n)]


def eager_run(activation, weight, *, cuda_graph: bool = False):
    """prepare -> feed every batch -> every observer's calculate_qparams. ``cuda_graph``: the prepared
    model's forward recorded as one CUDA graph on the first batch (``cuda_graph_forward``: the recording
    observes it once) and replayed for the others."""

    def run(model, batches):
        model = fused(model)
        model.qconfig = tq.QConfig(activation=activation, weight=weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = tq.prepare(model)
            with torch.no_grad():
                forward, rest = (ours.cuda_graph_forward(prepared, batches[0]), batches[1:]) if cuda_graph \
                    else (prepared, batches)
                for x in rest:
                    forward(x)
            for m in prepared.modules():
                if isinstance(m, tq.ObserverBase) and m is not None and hasattr(m, "calculate_qparams"):
                    try:
                        m.calculate_qparams()
                    except (RuntimeError, ValueError):  # placeholder observers
                        pass
        return prepared

    return run


def modelopt_run(method: str):
    """ModelOpt's own INT8 calibration: ``max`` through ``mtq.quantize``; ``entropy`` with histogram
    calibrators on the inputs: collect, then ``finish_stats_collection(method="entropy")``."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.model_calib import enable_stats_collection, finish_stats_collection

    def run(model, batches):
        model = copy.deepcopy(model)

        def loop(m):
            with torch.no_grad():
                for x in batches:
                    m(x)

        cfg = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method == "max":
                return mtq.quantize(model, cfg, loop)
            for entry in cfg["quant_cfg"]:
                if entry.get("quantizer_name") == "*input_quantizer":
                    entry["cfg"] = {**entry["cfg"], "calibrator": "histogram"}
            cfg["algorithm"] = None
            model = mtq.quantize(model, cfg, None)  # quantizers inserted, nothing calibrated yet
            enable_stats_collection(model)
            loop(model)
            for name, module in model.named_modules():  # entropy amax from the inputs' histograms
                if name.endswith("input_quantizer"):
                    finish_stats_collection(module, method="entropy")
                elif name.endswith("_quantizer"):
                    finish_stats_collection(module)
            return model

    return run


def float_run(model, batches):
    model = fused(model)
    with torch.no_grad():
        for x in batches:
            model(x)
    return model


#: Timed once, in the warm-up pass: ModelOpt's entropy amax is a Python loop per quantizer (minutes in all),
#: far beyond the machine's noise.
ONCE = {"ModelOpt INT8 histogram+entropy"}


def configurations(device: str) -> dict:
    per_channel_ao = torch_ao.default_per_channel_weight_observer
    per_channel_ours = ours.default_per_channel_weight_observer
    horizon = dict(dtype=torch.quint8, qscheme=torch.per_tensor_affine)  # what fbgemm's quantized ops take
    configs = {
        "float model (baseline)": float_run,
        "torch.ao HistogramObserver": eager_run(torch_ao.HistogramObserver.with_args(reduce_range=True), per_channel_ao),
        "ours HistogramObserver": eager_run(ours.HistogramObserver.with_args(reduce_range=True), per_channel_ours),
        "ours KLObserver": eager_run(ours.KLObserver.with_args(**horizon), per_channel_ours),
        "ours MSEObserver": eager_run(ours.MSEObserver.with_args(**horizon), per_channel_ours),
        "ours PercentileObserver": eager_run(ours.PercentileObserver.with_args(**horizon), per_channel_ours),
        "ours MixObserver": eager_run(ours.MixObserver.with_args(**horizon), per_channel_ours),
    }
    if device == "cuda":  # the observers a graph can replay (HistogramObserver: with ignore_nonfinite=True)
        configs["ours HistogramObserver, CUDA graph"] = eager_run(
            ours.HistogramObserver.with_args(reduce_range=True, ignore_nonfinite=True), per_channel_ours, cuda_graph=True)
        for name in ("MSEObserver", "PercentileObserver", "MixObserver"):
            configs[f"ours {name}, CUDA graph"] = eager_run(getattr(ours, name).with_args(**horizon), per_channel_ours,
                                                            cuda_graph=True)
    try:
        import modelopt.torch.quantization  # noqa: F401

        configs["ModelOpt INT8 max"] = modelopt_run("max")
        configs["ModelOpt INT8 histogram+entropy"] = modelopt_run("entropy")
    except ImportError:
        print("ModelOpt is not installed: its rows are skipped")
    return configs


def observer_forward_table(repeats: int, device: str) -> None:
    """Part 1: one observer's forward on float32 batches of shape (8, 64, 56, 56), default arguments, one
    warm-up batch, medians over ``repeats`` rounds of 5 batches (interleaved across observers). On CUDA
    each call ends with ``torch.cuda.synchronize()`` (the time the GPU took, not the launch), and our
    CuPy observers, where CuPy is installed, see the same batches as ``cupy`` arrays (no copy)."""
    g = torch.Generator().manual_seed(2)
    xs = [(torch.randn(8, 64, 56, 56, generator=g) * (1 + i % 3)).to(device) for i in range(6)]
    inputs = {"torch": xs}
    makers = {
        "ours HistogramObserver": ours.HistogramObserver,
        "torch.ao HistogramObserver": torch_ao.HistogramObserver,
        "ours KLObserver": ours.KLObserver,
        "ours MSEObserver": ours.MSEObserver,
        "ours PercentileObserver": ours.PercentileObserver,
        "ours MixObserver": ours.MixObserver,
    }
    try:
        from modelopt.torch.quantization.calib import HistogramCalibrator, MaxCalibrator

        makers["ModelOpt HistogramCalibrator.collect"] = lambda: HistogramCalibrator(8, None, True).collect
        makers["ModelOpt MaxCalibrator.collect"] = lambda: MaxCalibrator(8, None, True).collect
    except ImportError:
        pass
    observers = {name: make() for name, make in makers.items()}
    observers = {name: obs.to(device) if isinstance(obs, nn.Module) else obs for name, obs in observers.items()}
    backend_of = dict.fromkeys(observers, "torch")
    if device == "cuda":
        try:
            import cupy

            from observers_core.adapters import cupy as ours_cupy
        except ImportError:
            print("CuPy is not installed: its rows are skipped")
        else:
            inputs["cupy"] = [cupy.asarray(x) for x in xs]
            for cls in ("HistogramObserver", "KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"):
                observers[f"ours CuPy {cls}"] = getattr(ours_cupy, cls)()
                backend_of[f"ours CuPy {cls}"] = "cupy"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = {name: [] for name in observers}
    with torch.no_grad():
        for name, fwd in observers.items():
            fwd(inputs[backend_of[name]][0])
        for _ in range(repeats):
            for name, fwd in observers.items():
                for x in inputs[backend_of[name]][1:]:
                    sync()
                    start = time.perf_counter()
                    fwd(x)
                    sync()
                    times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    modelopt = med.get("ModelOpt HistogramCalibrator.collect")

    def histogram_of(name: str) -> float:  # the same backend's HistogramObserver
        return med["ours CuPy HistogramObserver" if backend_of[name] == "cupy" else "ours HistogramObserver"]

    print(f"\npart 1: forward of one observer, float32 (8, 64, 56, 56) on {device}, median ms per batch")
    print(f"{'observer':40s} {'ms':>8s} {'/ ours Histogram':>17s} {'ModelOpt collect /':>19s}")
    for name, ms in med.items():
        vs_modelopt = f"{modelopt / ms:8.3g}x" if modelopt and name.startswith("ours") else ""
        print(f"{name:40s} {ms:8.3f} {ms / histogram_of(name):16.2f}x {vs_modelopt:>19s}")
    for name, goal in (("KLObserver", 1.5), ("MSEObserver", 1.5), ("PercentileObserver", 1.5), ("MixObserver", 2.0)):
        for full in (f"ours {name}", f"ours CuPy {name}"):
            if full not in med:
                continue
            r = med[full] / histogram_of(full)
            if modelopt:
                f = modelopt / med[full]
                faster = f"; ModelOpt's collect takes {f:.3g}x its time (goal >= 5x: {'met' if f >= 5 else 'NOT met'})"
            else:
                faster = ""
            print(f"  {full}: {r:.2f}x the same backend's HistogramObserver "
                  f"(goal <= {goal}x: {'met' if r <= goal else 'NOT met'}){faster}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="run only configurations whose name contains one of these")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the model, the batches and the observers run (cuda: CuPy rows in part 1 too)")
    args = parser.parse_args()
    print(machine_line("torch", "numpy", "numba", "nvidia-modelopt", "array-api-compat"))
    gpu = f"; cuda device: {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"torch threads: {torch.get_num_threads()}; ResNet-18-shaped, batch {args.batch_size} at 224x224, "
          f"{args.batches} calibration batches, {args.repeats} interleaved repeats{gpu}")
    observer_forward_table(args.repeats, args.device)
    print(f"\npart 2: whole-model calibration on {args.device}")
    model = make_model().to(args.device)
    batches = [x.to(args.device) for x in make_batches(args.batches, args.batch_size)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    configs = configurations(args.device)
    if args.only:
        configs = {k: v for k, v in configs.items() if k.startswith("float") or any(o in k for o in args.only)}

    peak, times = {}, {name: [] for name in configs}
    for name, run in configs.items():  # warm-up (numba compiles, caches) and peak memory, once each
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            gpu_before = torch.cuda.memory_allocated()
        sync()
        start = time.perf_counter()
        try:
            run(model, batches)
        except Exception as e:  # noqa: BLE001 - reported and left out of the timings, not hidden
            print(f"{name}: failed, left out ({type(e).__name__}: {e})")
            continue
        sync()
        if name in ONCE:
            times[name].append(time.perf_counter() - start)
        peak[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        if args.device == "cuda":  # the GPU's: torch's allocator peak over what was allocated before
            peak[name] = (torch.cuda.max_memory_allocated() - gpu_before) / 2**20
    configs = {name: run for name, run in configs.items() if name in peak}
    times = {name: times[name] for name in configs}
    for _ in range(args.repeats):
        for name, run in configs.items():
            if name in ONCE:
                continue
            sync()
            start = time.perf_counter()
            run(model, batches)
            sync()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    base = "float model (baseline)"
    # added time: the median over rounds of (this configuration's time - the float model's time in the same
    # round), so that the machine's drift between rounds cancels; a configuration timed once: minus the median
    added = {name: statistics.median(t - b for t, b in zip(times[name], times[base])) if name not in ONCE
             else median[name] - median[base] for name in configs}

    memory = "peak GPU memory" if args.device == "cuda" else "peak RSS growth"
    print(f"\n{'configuration':40s} {'total':>9s} {'added':>9s} {memory:>16s}")
    for name in configs:
        print(f"{name:40s} {median[name]:8.2f}s {added[name]:8.2f}s {peak[name]:13.0f} MiB")

    def ratio(a: str, b: str) -> float | None:
        return added[a] / added[b] if a in added and b in added and added[b] > 0 else None

    goals = [
        ("ours HistogramObserver", "torch.ao HistogramObserver", 0.3),
        ("ours KLObserver", "ours HistogramObserver", 1.5),
        ("ours MSEObserver", "ours HistogramObserver", 1.5),
        ("ours PercentileObserver", "ours HistogramObserver", 1.5),
        ("ours MixObserver", "ours HistogramObserver", 2.0),
        ("ours KLObserver", "ModelOpt INT8 histogram+entropy", 0.5),
    ]
    graphed = [n for n in configs if n.endswith(", CUDA graph") and ratio(n, "torch.ao HistogramObserver")]
    if graphed:
        print("\nCUDA graph rows: added time / torch.ao HistogramObserver's (the same observer eager)")
    for name in graphed:
        eager_name = name.removesuffix(", CUDA graph")
        eager = ratio(eager_name, "torch.ao HistogramObserver")
        print(f"  {name:40s} {ratio(name, 'torch.ao HistogramObserver'):6.2f}x"
              + (f"  ({eager:.2f}x)" if eager is not None else ""))
    print("\nadded-time ratios (goal: at most)")
    met_all = True
    for a, b, goal in goals:
        r = ratio(a, b)
        if r is None:
            print(f"  {a} / {b}: not measured")
            met_all = False
            continue
        met = r <= goal
        met_all &= met
        print(f"  {a:28s} / {b:32s} {r:6.2f}x  (goal <= {goal}x: {'met' if met else 'NOT met'})")
    print("\nall goals met" if met_all else "\nsome goals not met or not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
