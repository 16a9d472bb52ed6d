"""``observers-core report``: inputs, outputs against the core functions, the observer classes, bad inputs,
the embedded default (float accuracy floor) through the installed console script."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import observers_core as oc
from observers_core.adapters import _array_calibration as cal
from observers_core.adapters import _array_histogram as ahist
from observers_core.adapters import _array_lowbit as alow
from observers_core.adapters import _array_observers as aobs
from observers_core.report import METHODS, report_tensors
from observers_core.report._cli import main
from observers_core.report._model import FLOAT_ACCURACY_FLOOR

FORMATS = "int8,uint8,int4,float8_e4m3fn,mxfp8_e4m3,mxfp4,bfp16"
GRANS = ("per_tensor", "per_channel", "per_group")


def _weights(seed: int, shape=(8, 64), outliers: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, size=shape).astype(np.float32) * 0.05
    if outliers:
        x.reshape(-1)[3] = 2.0
    return x


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("tensors")
    np.save(d / "w.npy", _weights(0))
    np.savez(d / "two.npz", a=_weights(1), b=_weights(2, (4, 32)))
    save_file({"layer.weight": _weights(3), "layer.bias": _weights(4, (16,))}, str(d / "m.safetensors"))
    torch.save({"fc.weight": torch.from_numpy(_weights(5)), "fc.bias": torch.from_numpy(_weights(6, (8,))),
                "steps": torch.tensor(3)}, d / "sd.pt")
    return d


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """rich sizes the table to the terminal (80 columns without one, e.g. under pytest-xdist): a fixed
    width keeps every column in the text the tests read."""
    monkeypatch.setenv("COLUMNS", "200")


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _json(path):
    return json.loads(Path(path).read_text())["rows"]


# ------------------------------------------------------------------------------------------ inputs


@pytest.mark.parametrize("name, tensors", [
    ("w.npy", {"w.npy"}),
    ("two.npz", {"two.npz:a", "two.npz:b"}),
    ("m.safetensors", {"m.safetensors:layer.weight", "m.safetensors:layer.bias"}),
    ("sd.pt", {"sd.pt:fc.weight", "sd.pt:fc.bias"}),  # the int tensor "steps" is a tensor too: not float
])
def test_each_input_format(files, tmp_path, capsys, name, tensors):
    out = tmp_path / "r.json"
    rc, stdout, err = _run([ "report", str(files / name), "--json", str(out), "--methods", "minmax,kl",
                             "--formats", "int8,mxfp4"], capsys)
    assert rc == 0, err
    rows = _json(out)
    got = {r["tensor"] for r in rows}
    assert got == tensors or (name == "sd.pt" and got == tensors | {"sd.pt:steps"}), got
    assert "SQNR dB" in stdout and "best" in stdout
    for t in got:
        best = [r for r in rows if r["tensor"] == t and r["format"] == "int8" and r["best"]]
        assert len(best) == 1
        assert best[0]["sqnr_db"] == max(r["sqnr_db"] for r in rows if r["tensor"] == t and r["format"] == "int8")


def test_select_glob_and_regex(files, tmp_path, capsys):
    out = tmp_path / "r.json"
    for pattern in ("*.weight", r"weight$"):
        rc, _, err = _run(["report", str(files / "m.safetensors"), str(files / "sd.pt"), "--select", pattern,
                           "--methods", "minmax", "--formats", "int8", "--json", str(out), "--quiet"], capsys)
        assert rc == 0, err
        assert {r["tensor"] for r in _json(out)} == {"m.safetensors:layer.weight", "sd.pt:fc.weight"}


# ------------------------------------------------------------------ numbers against the core functions


def _fq_row(x: np.ndarray, r: dict) -> np.ndarray:
    """Fake-quantize ``x`` with the row's own qparams through the core functions."""
    axis = {"per_tensor": None, "per_channel": 0}.get(r["granularity"])
    if r["format"] in ("int8", "uint8") and r["granularity"] != "per_group":
        spec = oc.quant_spec({"int8": "qint8", "uint8": "quint8"}[r["format"]],
                             f"{r['granularity']}_{'symmetric' if r['format'] == 'int8' else 'affine'}")
        s = np.asarray(r["scale"], np.float32).reshape(() if axis is None else (-1,))
        z = np.asarray(r["zero_point"], np.int32).reshape(s.shape)
        return oc.fake_quantize(x, s, z, quant_min=spec.quant_min, quant_max=spec.quant_max, axis=axis)
    if r["format"] in oc.MX_DTYPES:
        e = np.asarray(r["exponent"], np.uint8).reshape(x.shape[0], -1)
        return oc.mx_fake_quantize(x, e, element=oc.MX_DTYPES[r["format"]], axis=-1, block_size=32)
    if r["format"] == "bfp16":
        e = np.asarray(r["exponent"], np.uint8).reshape(x.shape[0], -1)
        return oc.bfp_fake_quantize(x, e, axis=-1, block_size=8)
    group = 32 if r["granularity"] == "per_group" else None
    ax = -1 if group else axis
    s = np.asarray(r["scale"], np.float32)
    s = s.reshape(() if ax is None else ((-1,) if group is None else (x.shape[0], -1)))
    if r["format"].startswith("float8"):
        return oc.fp8_fake_quantize(x, s, dtype=r["format"], axis=ax, group_size=group)
    z = np.asarray(r["zero_point"], np.int32).reshape(s.shape)
    return oc.group_fake_quantize(x, s, z, dtype=r["format"], axis=ax, group_size=group)


def _metrics(x, fq):
    d = fq.astype(np.float64) - x
    return np.mean(d * d), 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(d * d))


def test_json_and_csv_match_the_core_functions(files, tmp_path, capsys):
    x = np.load(files / "w.npy")
    jpath, cpath = tmp_path / "r.json", tmp_path / "r.csv"
    rc, _, err = _run(["report", str(files / "w.npy"), "--formats", FORMATS, "--json", str(jpath),
                       "--csv", str(cpath), "--quiet"], capsys)
    assert rc == 0, err
    rows = _json(jpath)
    # every method on int8/uint8 per tensor (7) and per channel (6, histogram is per tensor), per group
    # minmax; int4 x3, fp8 x3, 3 block formats
    assert len(rows) == 2 * 7 + 2 * 6 + 2 + 3 + 3 + 3
    for r in rows:
        mse, sqnr = _metrics(x, _fq_row(x, r))  # the row's error is its own qparams' error
        assert r["mse"] == pytest.approx(mse, rel=1e-9), r
        assert r["sqnr_db"] == pytest.approx(sqnr, rel=1e-9), r
        assert 0.0 <= r["clipped"] <= 1.0 and r["seconds"] >= 0
    by = {(r["format"], r["granularity"], r["method"]): r for r in rows}
    # min/max ranges clip nothing on integer formats; a range clipped below the outlier 2.0 clips it
    assert all(r["clipped"] == 0 for r in rows if r["method"] == "minmax" and r["format"] in ("int8", "uint8", "int4"))
    assert by["int8", "per_tensor", "histogram"]["clipped"] == pytest.approx(1 / x.size)
    # the ranges and qparams of the core functions called directly
    spec = oc.quant_spec("qint8", "per_tensor_symmetric")
    st = oc.minmax_update(oc.minmax_init(xp=np), x)
    q = oc.minmax_qparams(st, spec)
    assert by["int8", "per_tensor", "minmax"]["scale"] == np.reshape(q.scale, -1).tolist()
    assert by["int8", "per_tensor", "minmax"]["range_max"] == [float(st.max_val)] == [2.0]
    hs = oc.histogram_update(oc.histogram_init(bins=2048, xp=np), x)
    qh = oc.histogram_qparams(hs, spec)
    assert by["int8", "per_tensor", "histogram"]["scale"] == np.reshape(qh.scale, -1).tolist()
    assert by["int8", "per_tensor", "histogram"]["scale"][0] < q.scale  # the outlier is clipped
    ch = oc.calib_histogram_update(oc.calib_histogram_init(bins=2048, xp=np), x, absolute=True)
    amax = oc.percentile_range(ch.counts, oc.calib_histogram_edges(ch), percentile=99.99)[1]
    lo, hi = np.clip(x.min(), -amax, amax), np.clip(x.max(), -amax, amax)
    qp = oc.calculate_qparams(np.float32(lo), np.float32(hi), spec)
    assert by["int8", "per_tensor", "percentile"]["scale"] == pytest.approx(np.reshape(qp.scale, -1).tolist(), rel=1e-7)
    ch = oc.calib_histogram_update(oc.calib_histogram_init(bins=512, xp=np), x, absolute=True)  # KLObserver's bins
    amax = oc.kl_threshold(ch.counts, oc.calib_histogram_edges(ch), num_levels=128)
    assert by["int8", "per_tensor", "kl"]["range_max"] == [pytest.approx(min(float(amax), 2.0), rel=1e-7)]
    lspec = oc.lowbit_spec("int4", axis=-1, group_size=32)
    ql = oc.lowbit_qparams(oc.lowbit_stats(x, lspec), lspec)
    assert by["int4", "per_group", "minmax"]["scale"] == np.asarray(ql.scale).reshape(-1).tolist()
    mspec = oc.lowbit_spec("mxfp4")
    qm = oc.lowbit_qparams(oc.lowbit_stats(x, mspec), mspec)
    assert by["mxfp4", "per_block", "minmax"]["exponent"] == np.asarray(qm.exponent).reshape(-1).tolist()
    # the CSV holds the same rows
    with open(cpath, newline="") as f:
        crow = list(csv.DictReader(f))
    assert len(crow) == len(rows)
    for c, r in zip(crow, rows):
        assert (c["tensor"], c["format"], c["granularity"], c["method"]) == (r["tensor"], r["format"], r["granularity"], r["method"])
        assert json.loads(c["scale"]) == r["scale"] and float(c["sqnr_db"]) == r["sqnr_db"]
        assert c["best"] == str(r["best"])


def _observer(fmt: str, gran: str, method: str):
    """The observer class that the report's (format, granularity, method) stands for (numpy)."""
    if fmt in ("int8", "uint8") and gran != "per_group":
        dtype = "qint8" if fmt == "int8" else "quint8"
        qs = f"{gran}_{'symmetric' if fmt == 'int8' else 'affine'}"
        ch = -1 if gran == "per_tensor" else 0
        if method in ("kl", "mse", "percentile", "mix"):
            cls = {"kl": cal.KLObserver, "mse": cal.MSEObserver, "percentile": cal.PercentileObserver, "mix": cal.MixObserver}
            return cls[method](ch_axis=ch, dtype=dtype, qscheme=qs, xp=np)
        if method == "histogram":
            return ahist.HistogramObserver(dtype=dtype, qscheme=qs, xp=np)
        if gran == "per_tensor":
            cls = aobs.MinMaxObserver if method == "minmax" else aobs.MovingAverageMinMaxObserver
            return cls(dtype=dtype, qscheme=qs, xp=np)
        cls = aobs.PerChannelMinMaxObserver if method == "minmax" else aobs.MovingAveragePerChannelMinMaxObserver
        return cls(ch_axis=0, dtype=dtype, qscheme=qs, xp=np)
    if fmt in oc.MX_DTYPES:
        return alow.PerBlockMXObserver(dtype=fmt, xp=np)
    if fmt == "bfp16":
        return alow.PerBlockBFPObserver(xp=np)
    if gran == "per_group":
        return alow.LowBitObserver(fmt, granularity="per_group", axis=-1, group_size=32, xp=np)
    return alow.LowBitObserver(fmt, axis=None if gran == "per_tensor" else 0, xp=np)


@pytest.mark.parametrize("seed", [0, 7])
def test_qparams_equal_the_observer_classes(seed):
    """Each row's scale/zero point (or exponents) equals the matching observer class's on the same tensor,
    observed in the same batches (one batch, and three for the activations' path)."""
    x = _weights(seed, (6, 64), outliers=seed == 0)
    batches = [x[:2], x[2:4], x[4:]]
    for seen, grans in (([x], GRANS), (batches, ("per_tensor",))):  # batches split axis 0: per tensor only
        rows = report_tensors({"t": x}, formats=FORMATS.split(","), granularities=grans, batches={"t": seen})
        assert {r.method for r in rows} == set(METHODS)
        for r in rows:
            obs = _observer(r.format, r.granularity, r.method)
            for b in (seen if r.granularity not in ("per_group", "per_block") else [x]):
                obs(b)
            q = obs.calculate_qparams()
            assert r.scale == np.asarray(q.scale, np.float32).reshape(-1).tolist(), (r.format, r.granularity, r.method)
            if isinstance(q, oc.BlockScale):
                assert r.exponent == np.asarray(q.exponent).reshape(-1).tolist()
            else:
                assert r.zero_point == np.asarray(q.zero_point).reshape(-1).tolist(), (r.format, r.method)


def test_qparams_equal_torch_ao_observers():
    """The per-tensor min/max, moving-average and histogram rows against torch.ao itself."""
    torch = pytest.importorskip("torch")
    from torch.ao.quantization import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver

    x = _weights(3, (16, 64))
    rows = {r.method: r for r in report_tensors({"t": x}, formats=["uint8"], granularities=["per_tensor"],
                                                 methods=["minmax", "moving_average", "histogram"])}
    for method, cls in (("minmax", MinMaxObserver), ("moving_average", MovingAverageMinMaxObserver),
                        ("histogram", HistogramObserver)):
        obs = cls(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        obs(torch.from_numpy(x))
        s, z = obs.calculate_qparams()
        assert rows[method].scale == pytest.approx(s.reshape(-1).tolist(), rel=1e-6), method
        assert rows[method].zero_point == z.reshape(-1).tolist(), method


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_other_backends_give_the_numpy_rows(backend):
    pytest.importorskip(backend)
    x = _weights(1, (8, 64))
    kw = dict(formats=["int8"], granularities=["per_tensor"], methods=["minmax", "percentile"])  # jax: eager compiles
    if backend == "torch":
        kw.update(formats=["int8", "mxfp4"], methods=["minmax", "percentile", "mix"], granularities=["per_tensor", "per_channel"])
    a, b = report_tensors({"t": x}, **kw), report_tensors({"t": x}, backend=backend, **kw)
    assert not any(r.error for r in a + b)
    assert [(r.format, r.granularity, r.method) for r in a] == [(r.format, r.granularity, r.method) for r in b]
    for ra, rb in zip(a, b):
        assert ra.scale == pytest.approx(rb.scale, rel=1e-6) and ra.sqnr_db == pytest.approx(rb.sqnr_db, rel=1e-5)


# ------------------------------------------------------------------------------------------- plots


def test_plot_files_are_valid_pngs(files, tmp_path, capsys):
    import matplotlib.image

    rc, out, err = _run(["report", str(files / "two.npz"), "--plot", str(tmp_path / "plots"),
                         "--methods", "minmax,mse,histogram", "--formats", "int8,mxfp4"], capsys)
    assert rc == 0, err
    pngs = sorted((tmp_path / "plots").iterdir())
    assert [p.name for p in pngs] == ["two.npz_a.png", "two.npz_b.png"]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 300
        assert float(np.std(img)) > 0.01  # not blank


# --------------------------------------------------------------------------------------- bad input


def test_bad_inputs_give_a_message_and_an_exit_code(files, tmp_path, capsys):
    garbage = tmp_path / "bad.npy"
    garbage.write_bytes(b"not a numpy file")
    bad_pt = tmp_path / "bad.pt"
    bad_pt.write_bytes(b"\x00\x01garbage")
    txt = tmp_path / "x.txt"
    txt.write_text("1 2 3")
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros((0, 4), np.float32))
    w = str(files / "w.npy")
    cases = [
        (["report", str(tmp_path / "missing.npy")], 1, "missing.npy: no such file"),
        (["report", str(garbage)], 1, "bad.npy: cannot read it as .npy"),
        (["report", str(bad_pt)], 1, "bad.pt: cannot read it as .pt"),
        (["report", str(txt)], 1, "x.txt: unknown format; valid: .npy, .npz, .safetensors, .pt, .pth"),
        (["report", str(empty)], 1, "is empty (shape (0, 4))"),
        (["report", w, "--methods", "minmax,best"], 2, "unknown method 'best'; valid: minmax, moving_average, histogram"),
        (["report", w, "--formats", "int7"], 2, "unknown format 'int7'; valid: int8, uint8, int4"),
        (["report", w, "--granularity", "per_row"], 2, "unknown granularity 'per_row'; valid: per_tensor, per_channel"),
        (["report", w, "--backend", "tensorflow"], 2, "unknown backend 'tensorflow'; valid: numpy, torch, jax, cupy"),
        (["report", w, "--select", "nothing_matches"], 1, "no numeric tensor matching --select 'nothing_matches'"),
        (["report", w, "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ]
    try:
        import cupy  # noqa: F401
    except ImportError:
        cases.append((["report", w, "--backend", "cupy"], 1, "--backend cupy: cupy is not installed"))
    for argv, code, message in cases:
        rc, out, err = _run(argv, capsys)
        assert rc == code, (argv, rc, err)
        assert message in err, (argv, err)
        assert "Traceback" not in err + out


def test_nan_and_inf_are_reported_per_method(tmp_path, capsys):
    x = _weights(2, (8, 64))
    x[1, 5], x[2, 7] = np.nan, np.inf
    np.save(tmp_path / "nan.npy", x)
    rc, out, err = _run(["report", str(tmp_path / "nan.npy"), "--formats", "int8,mxfp4", "--granularity",
                         "per_tensor", "--json", str(tmp_path / "r.json")], capsys)
    assert rc == 3
    assert "NaN/Inf in nan.npy (2 values)" in err and "Traceback" not in err
    rows = {(r["format"], r["method"]): r for r in _json(tmp_path / "r.json")}
    assert all(r["nonfinite"] == 2 for r in rows.values())
    # min/max observers do not skip NaN (torch's behaviour): NaN qparams, said in the note
    assert math.isnan(rows["int8", "minmax"]["scale"][0]) and "does not skip NaN" in rows["int8", "minmax"]["note"]
    # torch's HistogramObserver raises on NaN: an error row
    assert "NaN in the input" in rows["int8", "histogram"]["error"]
    # the calibration observers skip non-finite values: finite qparams and error over the finite values
    for m in ("kl", "mse", "percentile", "mix"):
        r = rows["int8", m]
        assert np.isfinite(r["scale"][0]) and np.isfinite(r["sqnr_db"]) and not r["error"], m
        finite = np.where(np.isfinite(x), x, 0)
        obs = _observer("int8", "per_tensor", m)
        obs(x)
        assert r["scale"] == np.reshape(obs.calculate_qparams().scale, -1).tolist()
        assert r["mse"] == pytest.approx(_metrics(x[np.isfinite(x)], _fq_row(finite, r)[np.isfinite(x)])[0], rel=1e-9)
    assert [r for r in rows.values() if r["best"]]


def test_import_observers_core_does_not_load_the_report():
    code = ("import sys, observers_core; "
            "print(sorted(m for m in ('observers_core.report', 'rich', 'torch', 'sklearn', 'matplotlib', 'safetensors') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = "import sys, observers_core.report; print(sorted(m for m in ('torch', 'jax', 'cupy', 'sklearn', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- the embedded default


def _console_script() -> str:
    script = Path(sys.executable).parent / "observers-core"
    if not script.exists():
        script = shutil.which("observers-core")
    assert script, "the observers-core console script is not installed (pip install -e '.[report]')"
    return str(script)


@pytest.mark.slow  # the console script in a subprocess, on the default model
def test_console_script_default_model(tmp_path):
    """The README's command: the embedded digits MLP, its accuracies per method and the float floor."""
    jpath, plots = tmp_path / "r.json", tmp_path / "plots"
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.run([_console_script(), "report", "--json", str(jpath), "--plot", str(plots)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    doc = json.loads(jpath.read_text())
    model = doc["model"]
    assert model["float_accuracy"] >= FLOAT_ACCURACY_FLOOR
    assert f"float accuracy {model['float_accuracy']:.3f}" in proc.stdout
    assert [r["method"] for r in model["rows"]] == list(METHODS)
    for r in model["rows"]:
        assert f"{r['accuracy']:.3f}" in proc.stdout
        assert r["accuracy"] >= model["float_accuracy"] - 0.05, r  # int8 costs little on this model
        assert all(15 < v < 80 for v in r["sqnr_db"].values()), r
    names = {r["tensor"] for r in doc["rows"]}
    assert names == {f"fc{i}.{k}" for i in (1, 2, 3) for k in ("weight", "input")}
    assert len(list(plots.glob("*.png"))) == 6
    # a bad input through the console script too
    bad = subprocess.run([_console_script(), "report", str(tmp_path / "nope.npz")], capture_output=True, text=True)
    assert bad.returncode == 1 and "nope.npz: no such file" in bad.stderr and "Traceback" not in bad.stderr
    mod = subprocess.run([sys.executable, "-m", "observers_core", "report", "--methods", "x"], capture_output=True, text=True)
    assert mod.returncode == 2 and "unknown method 'x'" in mod.stderr


# ------------------------------------------------------------------------------------------ the LLM family


def _llm_reference(x, cfg, weights=None):
    """The LLM family's functions called directly: state, qparams, fake-quantized x (2-D ``x``)."""
    from observers_core.families import llm

    o = llm.flatten(x, cfg)
    state = llm.update(cfg, llm.init(cfg, qparam_shape=o.shape[1:-1]), o, weights=weights)
    qp = llm.qparams(cfg, state)
    shape = (1, *o.shape[1:-1], 1)
    zp = None if cfg.symmetric else qp.zero_point.astype(np.float32).reshape(shape)
    fq = llm.fake_quantize(o, qp.scale.reshape(shape), zp, cfg, global_scale=qp.global_scale).reshape(x.shape)
    return state, qp, fq


def test_llm_formats_and_methods_equal_the_family():
    """nvfp4, ``mse_grid`` and ``imatrix_mse`` rows: the ranges, scales and errors of the LLM family's own
    functions; imatrix with the layer inputs weights the error by their E[x^2], without them falls back to
    the uniform search (llm-compressor's fallback, named in the note)."""
    from observers_core.families import llm

    x = _weights(3, (8, 64))
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((5, 64)).astype(np.float32) * np.linspace(0.1, 4, 64, dtype=np.float32)
              for _ in range(2)]
    rows = report_tensors({"w": x}, formats=["nvfp4", "int4", "uint4"], granularities=("per_group",),
                          methods=["minmax", "mse_grid", "imatrix_mse"], group_size=32, inputs={"w": inputs})
    by = {(r.format, r.method): r for r in rows}
    assert set(by) == {("nvfp4", m) for m in ("minmax", "mse_grid", "imatrix_mse")} | {
        (f, m) for f in ("int4", "uint4") for m in ("minmax", "mse_grid", "imatrix_mse")}
    nv = dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, scale_dtype="float8_e4m3fn",
              mode="static")
    imp = llm.importance_init(64)
    for b in inputs:
        imp = llm.importance_update(imp, b)
    cases = {("nvfp4", "minmax"): (llm.Config(**nv), False), ("nvfp4", "mse_grid"): (llm.Config(**nv, search="mse"), False),
             ("nvfp4", "imatrix_mse"): (llm.Config(**nv, search="imatrix"), True),
             ("uint4", "mse_grid"): (llm.Config(num_bits=4, symmetric=False, strategy="group", group_size=32,
                                                mode="static", search="mse"), False),
             ("int4", "imatrix_mse"): (llm.Config(num_bits=4, strategy="group", group_size=32, mode="static",
                                                  search="imatrix"), True)}
    for key, (cfg, weighted) in cases.items():
        w = llm.importance_weights(imp, cfg, x.shape)[0] if weighted else None
        state, qp, fq = _llm_reference(x, cfg, w)
        r = by[key]
        assert not r.error, r.error
        assert r.scale == qp.scale.reshape(-1).tolist() and r.range_max == state.max_vals.reshape(-1).tolist(), key
        assert r.mse == pytest.approx(_metrics(x, fq)[0], rel=1e-12), key
        assert ("E[x^2]" in r.note) == weighted, r.note
    assert "global scale" in by["nvfp4", "minmax"].note
    assert by["uint4", "mse_grid"].zero_point is not None and by["nvfp4", "minmax"].zero_point is None
    # the grid search never does worse, on the error it minimises (sum |fq(x) - x| ** 2.4), than the plain
    # range of the same quantizer (its first candidate)
    plain = llm.Config(num_bits=4, strategy="group", group_size=32, mode="static")
    searched = _llm_reference(x, replace(plain, search="mse"))[2]
    assert np.sum(np.abs(searched - x) ** 2.4) <= np.sum(np.abs(_llm_reference(x, plain)[2] - x) ** 2.4)
    alone = report_tensors({"w": x}, formats=["int4"], granularities=("per_group",), methods=["imatrix_mse"],
                           group_size=32)
    assert alone[0].note == "uniform MSE: no importance data"
    assert alone[0].scale == by["int4", "mse_grid"].scale


def test_llm_cli_names_and_skips(files, tmp_path, capsys):
    jpath = tmp_path / "r.json"
    rc, _, err = _run(["report", str(files / "w.npy"), "--formats", "nvfp4,float8_e4m3fn,float8_e5m2",
                       "--methods", "minmax,mse_grid,imatrix_mse", "--granularity", "per_channel", "--json", str(jpath),
                       "--quiet"], capsys)
    assert rc == 0, err
    got = {(r["format"], r["granularity"], r["method"]) for r in _json(jpath)}
    assert got == {("nvfp4", "per_block", m) for m in ("minmax", "mse_grid", "imatrix_mse")} | {
        ("float8_e4m3fn", "per_channel", m) for m in ("minmax", "mse_grid", "imatrix_mse")} | {
        ("float8_e5m2", "per_channel", "minmax")}  # fp8 E5M2 is not an LLM-family format
    rc, _, err = _run(["report", str(files / "w.npy"), "--methods", "mse-grid"], capsys)
    assert rc == 2 and "mse_grid" in err and "imatrix_mse" in err
    x = np.ones((4, 24), np.float32)  # 24 is not a multiple of nvfp4's blocks of 16: skipped, with a note
    rows = report_tensors({"x": x}, formats=["nvfp4"], methods=["minmax"])
    assert rows == []


@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=pytest.mark.slow)])  # jax: ~40 s of compiling
def test_llm_rows_are_the_same_on_other_backends(backend):
    pytest.importorskip(backend)
    x = _weights(5, (8, 64))
    x[3] = 0.0  # an all-zero row: MX code 0 (a subnormal scale XLA reads as 0)
    inputs = {"w": [np.random.default_rng(6).standard_normal((5, 64)).astype(np.float32)]}
    kw = dict(formats=["int4", "uint8", "nvfp4", "mxfp4"], methods=["minmax", "mse_grid", "imatrix_mse"], inputs=inputs)
    ref = report_tensors({"w": x}, **kw)
    rows = report_tensors({"w": x}, backend=backend, **kw)
    assert len(rows) == len(ref) > 20
    for r, q in zip(rows, ref):
        assert (r.scale, r.range_min, r.range_max, r.zero_point, r.mse, r.note) == (
            q.scale, q.range_min, q.range_max, q.zero_point, q.mse, q.note), (r.format, r.granularity, r.method)
