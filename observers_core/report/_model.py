"""The embedded default: a 64-64-32-10 ReLU MLP in NumPy on scikit-learn's bundled digits (no download).

Trained in-process each run (Adam, full batch, 300 steps, seed-deterministic: about a second), then
for each method of :data:`~observers_core.report.METHODS`: weights calibrated per channel as ``int8``
(qint8 symmetric; ``histogram`` is per tensor, as torch's HistogramObserver), the input of each layer
per tensor as ``uint8`` (quint8 affine) over 4 calibration batches of 128 training images, through the
same :func:`~observers_core.report._methods.calibrate` as the tensor report. The quantized model
fake-quantizes every weight and every layer input; ``sqnr_db[layer]`` compares each layer's output on
the test set with the float model's: ``10 log10(sum y**2 / sum (y_q - y)**2)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import observers_core as oc

from ._io import ReportError
from ._methods import LLM_METHODS, METHODS, Case, calibrate, quant_spec_of

LAYERS = ("fc1", "fc2", "fc3")
FLOAT_ACCURACY_FLOOR = 0.9


@dataclasses.dataclass
class AccuracyRow:
    """The int8 model calibrated by one method: test accuracy and each layer's output SQNR (dB)."""

    method: str
    float_accuracy: float
    accuracy: float
    sqnr_db: dict[str, float]
    note: str = ""


@dataclasses.dataclass
class ModelReport:
    float_accuracy: float
    train_seconds: float
    rows: list[AccuracyRow]
    test_size: int
    #: the reported tensors (weights, calibration layer inputs), for plots; not in the JSON
    tensors: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)


def load_digits_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], shuffled by ``seed``: 1297 train, 500 test."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ReportError("the embedded default needs scikit-learn: pip install 'observers-core[report]'") from None
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return x[:-500], y[:-500], x[-500:], y[-500:]


def train(x: np.ndarray, y: np.ndarray, seed: int, steps: int = 300, lr: float = 0.01) -> list[tuple[np.ndarray, np.ndarray]]:
    """Adam on the softmax cross-entropy, full batch; ``[(W (out, in), b), ...]`` float32."""
    rng = np.random.default_rng(seed)
    sizes = (64, 64, 32, 10)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params += [rng.normal(0, np.sqrt(2.0 / fan_in), (fan_out, fan_in)), np.zeros(fan_out)]
    onehot = np.eye(10, dtype=np.float32)[y]
    params = [p.astype(np.float32) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        acts, a = [x], x
        for i in range(3):
            h = a @ params[2 * i].T + params[2 * i + 1]
            a = np.maximum(h, 0) if i < 2 else h
            acts.append(a)
        p = np.exp(a - a.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(y)
        grads = [None] * 6
        for i in (2, 1, 0):
            grads[2 * i] = grad.T @ acts[i]
            grads[2 * i + 1] = grad.sum(axis=0)
            if i:
                grad = (grad @ params[2 * i]) * (acts[i] > 0)
        for k, g in enumerate(grads):
            m[k] = 0.9 * m[k] + 0.1 * g
            v[k] = 0.999 * v[k] + 0.001 * g * g
            params[k] = params[k] - lr * (m[k] / (1 - 0.9**t)) / (np.sqrt(v[k] / (1 - 0.999**t)) + 1e-8)
    return [(params[2 * i].astype(np.float32), params[2 * i + 1].astype(np.float32)) for i in range(3)]


def forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray, act_fq: Any = None) -> list[np.ndarray]:
    """Each layer's output (pre-ReLU); ``act_fq(i, a)`` fake-quantizes the input of layer ``i``."""
    outs, a = [], x
    for i, (w, b) in enumerate(layers):
        if act_fq is not None:
            a = act_fq(i, a)
        h = a @ w.T + b
        outs.append(h)
        a = np.maximum(h, 0)
    return outs


def _sqnr(ref: np.ndarray, q: np.ndarray) -> float:
    noise = float(np.sum((q.astype(np.float64) - ref) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / noise))


def model_report(*, seed: int = 0, formats: Any = None, granularities: Any = None, methods: Any = METHODS,
                 progress: Any = None, backend: str = "numpy", device: Any = None, group_size: int = 32
                 ) -> tuple[list[Any], ModelReport]:
    """Train, then the tensor report of the weights and layer inputs and the int8 accuracy per method."""
    import time

    from . import DEFAULT_FORMATS, GRANULARITIES, report_tensors

    xtr, ytr, xte, yte = load_digits_split(seed)
    from threadpoolctl import threadpool_limits

    start = time.perf_counter()
    with threadpool_limits(1):  # small matrices: BLAS threads only contend
        layers = train(xtr, ytr, seed)
    train_seconds = time.perf_counter() - start
    float_outs = forward(layers, xte)
    float_acc = float(np.mean(np.argmax(float_outs[-1], axis=1) == yte))
    calib = [xtr[i * 128:(i + 1) * 128] for i in range(4)]
    calib_inputs = [forward(layers, c) for c in calib]
    # the input of layer i for each calibration batch: x for fc1, relu(previous output) after
    act_batches = {f"{LAYERS[i]}.input": [c if i == 0 else np.maximum(o[i - 1], 0) for c, o in zip(calib, calib_inputs)]
                   for i in range(3)}
    weights = {f"{n}.weight": w for n, (w, _) in zip(LAYERS, layers)}
    kw = dict(methods=methods, backend=backend, device=device, group_size=group_size, progress=progress,
              formats=formats or DEFAULT_FORMATS)
    inputs = {k: np.concatenate(v) for k, v in act_batches.items()}
    layer_inputs = {f"{n}.weight": act_batches[f"{n}.input"] for n in LAYERS}  # imatrix_mse's importance
    rows = report_tensors(weights, granularities=granularities or GRANULARITIES, inputs=layer_inputs, **kw)
    rows += report_tensors(inputs, batches=act_batches,
                           granularities=("per_tensor",), **kw)
    acc_rows = []
    for method in [m for m in methods if m not in LLM_METHODS]:  # the accuracy table: torch's int8 formats
        if progress is not None:
            progress(f"model int8 {method}")
        wgran = "per_tensor" if method == "histogram" else "per_channel"
        qlayers = [(np.asarray(calibrate(Case("int8", wgran, method), [w], w, np, group_size).fq), b) for w, b in layers]
        spec = quant_spec_of("uint8", "per_tensor")
        qp = [calibrate(Case("uint8", "per_tensor", method), act_batches[f"{n}.input"],
                        np.concatenate(act_batches[f"{n}.input"]), np, group_size) for n in LAYERS]

        def act_fq(i: int, a: np.ndarray) -> np.ndarray:
            return oc.fake_quantize(a, qp[i].scale, qp[i].zero_point, quant_min=spec.quant_min,
                                    quant_max=spec.quant_max)

        outs = forward(qlayers, xte, act_fq)
        acc = float(np.mean(np.argmax(outs[-1], axis=1) == yte))
        acc_rows.append(AccuracyRow(method, float_acc, acc, {n: _sqnr(f, q) for n, f, q in zip(LAYERS, float_outs, outs)},
                                    "weights per tensor" if wgran == "per_tensor" else ""))
    return rows, ModelReport(float_acc, train_seconds, acc_rows, len(yte), {**weights, **inputs})
