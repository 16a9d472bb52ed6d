"""The ``observers-core`` command line (``observers-core report ...``, ``python -m observers_core``).

Built on argparse (standard library: no extra dependency, sub-commands and ``--help`` as every Python
user knows them, and ``main(argv)`` runs in-process for tests) with rich for the table and the
progress bar (already the de-facto terminal renderer; one small pure-Python dependency).

Exit status: 0 done; 1 bad input (missing or unreadable file, empty tensor, backend not installed);
2 usage (unknown option, method, format, granularity or backend: the valid names are listed);
3 the report was made but some tensor holds NaN/Inf (each method's row shows what its observer did).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from typing import Any

import numpy as np

from . import (ALL_METHODS, BACKENDS, DEFAULT_FORMATS, FORMATS, GRANULARITIES, METHODS, ReportError, Row,
               load_tensors, report_tensors, resolve_backend)
from ._methods import cases_for

EXIT_INPUT, EXIT_USAGE, EXIT_NONFINITE = 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage and exits 2: keep, as a ReportError
        raise ReportError(f"{message}\n{self.format_usage().strip()}", code=EXIT_USAGE)


def _names(kind: str, valid: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        given = tuple(t.strip() for t in text.split(",") if t.strip())
        if given == ("all",):
            return valid
        bad = [g for g in given if g not in valid]
        if bad or not given:
            raise ReportError(f"unknown {kind} {', '.join(map(repr, bad)) or repr(text)}; valid: {', '.join(valid)} (or all)",
                              code=EXIT_USAGE)
        return given
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="observers-core", description="Quantization observers: tools.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("report", help="compare every calibration method on tensors or the embedded model",
                       description="Calibrate each tensor with each method and format; without FILES, the "
                                   "embedded digits MLP (trained in-process, seconds) and its accuracy per method.")
    p.add_argument("files", nargs="*", metavar="FILE", help=".npy .npz .safetensors .pt .pth")
    p.add_argument("--select", help="tensor names: a glob (fc*.weight) or a regular expression")
    p.add_argument("--methods", type=_names("method", ALL_METHODS), default=METHODS,
                   help=f"comma list of {', '.join(ALL_METHODS)} (default {','.join(METHODS)}; the LLM family's "
                        "mse_grid, imatrix_mse on request or with all)")
    p.add_argument("--formats", type=_names("format", FORMATS), default=DEFAULT_FORMATS,
                   help=f"comma list of {', '.join(FORMATS)} (default {','.join(DEFAULT_FORMATS)})")
    p.add_argument("--granularity", type=_names("granularity", GRANULARITIES), default=GRANULARITIES,
                   help="comma list of per_tensor, per_channel (axis 0), per_group (last axis) (default all)")
    p.add_argument("--group-size", type=int, default=32, help="per_group size along the last axis (default 32)")
    p.add_argument("--backend", default="numpy", help=f"{'|'.join(BACKENDS)} (default numpy)")
    p.add_argument("--device", help="backend device: cpu, cuda, cuda:1, gpu, 0 ...")
    p.add_argument("--seed", type=int, default=0, help="embedded default's seed (default 0)")
    p.add_argument("--json", metavar="FILE", help="write every row as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every row as CSV")
    p.add_argument("--plot", metavar="DIR", help="one PNG per tensor: histogram (log axis) and each method's range")
    p.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    return parser


def _span(values: list[float] | list[int] | None, fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi or len(values) == 1 else f"{format(lo, fmt)}..{format(hi, fmt)}"


def _render_rows(console: Any, rows: list[Row], title: str) -> None:
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    wide = console.width >= 140  # narrow terminals: fewer columns
    cols = [("tensor", "left"), ("format", "left"), ("gran.", "left"), ("method", "left"), ("range", "right"),
            ("scale / exp", "right"), ("zp", "right"), ("MSE", "right"), ("SQNR dB", "right"), ("clip %", "right"),
            ("ms", "right"), ("", "left")]
    keep = [wide or c not in ("zp", "MSE", "ms", "range") for c, _ in cols]
    for (col, just), k in zip(cols, keep):
        if k:
            table.add_column(col, justify=just, no_wrap=col != "", min_width={"tensor": 10, "": 4}.get(col),
                             max_width=24 if col == "" else None, overflow="fold" if col == "tensor" else "ellipsis")
    for r in rows:
        gran = r.granularity.replace("per_", "")
        if r.error:
            cells = [r.tensor, r.format, gran, r.method, *["-"] * 7, f"[red]error: {r.error}[/red]"]
        else:
            rng = f"[{min(r.range_min, default=math.nan):.4g}, {max(r.range_max, default=math.nan):.4g}]"
            scale = f"2^{_span([e - 127 for e in r.exponent], 'd')}" if r.exponent is not None else _span(r.scale, ".3g")
            mark = "[bold green]best[/]" if r.best else ""
            if r.note:
                mark = (mark + " " if mark else "") + f"[dim]{r.note}[/]"
            cells = [r.tensor, r.format, gran, r.method, rng, scale, _span(r.zero_point, "d"), f"{r.mse:.3g}",
                     f"{r.sqnr_db:.2f}", f"{100 * r.clipped:.3f}", f"{1000 * r.seconds:.2f}", mark]
        table.add_row(*[c for c, k in zip(cells, keep) if k])
    console.print(table)


def _render_model(console: Any, model: Any) -> None:
    from rich.table import Table

    from ._model import LAYERS

    table = Table(title=f"digits MLP 64-64-32-10, int8 (weights per channel, layer inputs uint8 per tensor), "
                        f"{model.test_size} test images", header_style="bold")
    for col in ("method", "float acc", "int8 acc", *(f"SQNR {n} dB" for n in LAYERS), ""):
        table.add_column(col, justify="left" if col in ("method", "") else "right")
    best = max(r.accuracy for r in model.rows) if model.rows else None
    for r in model.rows:
        table.add_row(r.method, f"{r.float_accuracy:.3f}", ("[bold green]" if r.accuracy == best else "") + f"{r.accuracy:.3f}",
                      *(f"{r.sqnr_db[n]:.2f}" for n in LAYERS), r.note)
    console.print(table)


def write_json(path: str, rows: list[Row], model: Any = None) -> None:
    import dataclasses

    doc: dict[str, Any] = {"rows": [r.as_dict() for r in rows]}
    if model is not None:
        doc["model"] = {f.name: dataclasses.asdict(model)[f.name] for f in dataclasses.fields(model) if f.name != "tensors"}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=float)


CSV_FIELDS = ("tensor", "shape", "format", "granularity", "method", "range_min", "range_max", "scale", "zero_point",
              "exponent", "mse", "sqnr_db", "clipped", "seconds", "nonfinite", "best", "note", "error")


def write_csv(path: str, rows: list[Row]) -> None:
    """One line per row; list fields (per channel/group/block) as JSON lists."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            d = r.as_dict()
            w.writerow([json.dumps(d[k]) if isinstance(d[k], list) else d[k] for k in CSV_FIELDS])


def write_plots(directory: str, tensors: dict[str, np.ndarray], rows: list[Row]) -> list[str]:
    """One PNG per tensor: histogram of the finite values (log count axis), each per-tensor row's range
    as a pair of vertical lines. Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'observers-core[report]'") from None
    os.makedirs(directory, exist_ok=True)
    paths = []
    colors = plt.get_cmap("tab10")
    for name, x in tensors.items():
        v = np.asarray(x, dtype=np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        fig, ax = plt.subplots(figsize=(7.5, 3.4), dpi=90)
        if v.size:
            ax.hist(v, bins=200, color="0.6", log=True)
        mine = [r for r in rows if r.tensor == name and r.granularity == "per_tensor" and not r.error and r.range_min]
        for i, r in enumerate(mine):
            c = colors(i % 10)
            label = f"{r.format} {r.method} ({r.sqnr_db:.1f} dB)"
            for k, edge in enumerate((min(r.range_min), max(r.range_max))):
                ax.axvline(edge, color=c, lw=1.2, ls=("-", "--", ":", "-.")[(i // 10) % 4], label=label if k == 0 else None)
        ax.set_title(f"{name}  {list(np.shape(x))}", fontsize=9)
        ax.set_xlabel("value")
        ax.set_ylabel("count (log)")
        if mine:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.tight_layout()
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
        path = os.path.join(directory, f"{safe}.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def _report(args: argparse.Namespace, console: Any) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    resolve_backend(args.backend, args.device)  # a backend not installed fails before any work
    if args.group_size < 1:
        raise ReportError(f"--group-size {args.group_size}: must be >= 1", code=EXIT_USAGE)
    tensors = load_tensors(args.files, select=args.select) if args.files else None
    for name, x in (tensors or {}).items():
        if np.asarray(x).size == 0:
            raise ReportError(f"tensor {name!r} is empty (shape {tuple(np.shape(x))}): nothing to calibrate")
    total = None
    if tensors is not None:
        total = sum(len(cases_for(np.shape(x) or (1,), args.formats, args.granularity, args.methods, args.group_size)[0])
                    for x in tensors.values())
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=args.quiet)
    kw = dict(formats=args.formats, granularities=args.granularity, methods=args.methods, group_size=args.group_size,
              backend=args.backend, device=args.device)
    model = None
    with progress:
        task = progress.add_task("calibrating", total=total)

        def step(text: str) -> None:
            if ": skipped" not in text:
                progress.update(task, advance=1, description=text[:60])

        if tensors is None:
            from ._model import model_report

            progress.update(task, description="training the digits MLP")
            rows, model = model_report(seed=args.seed, progress=step, **kw)
            plot_tensors = model.tensors
        else:
            rows = report_tensors(tensors, progress=step, **kw)
            plot_tensors = tensors
    if not args.quiet:
        _render_rows(console, rows, "observers-core report" + (" (embedded digits MLP)" if model else ""))
        if model is not None:
            _render_model(console, model)
            console.print(f"float accuracy {model.float_accuracy:.3f} (trained in {model.train_seconds:.1f} s, seed {args.seed})")
    if args.json:
        write_json(args.json, rows, model)
    if args.csv:
        write_csv(args.csv, rows)
    if args.plot:
        paths = write_plots(args.plot, plot_tensors, rows)
        if not args.quiet:
            console.print(f"wrote {len(paths)} PNG to {args.plot}")
    bad = sorted({r.tensor for r in rows if r.nonfinite})
    if bad:
        counts = {r.tensor: r.nonfinite for r in rows}
        print("observers-core: NaN/Inf in " + ", ".join(f"{t} ({counts[t]} values)" for t in bad)
              + ": each method's row shows what its observer does with them", file=sys.stderr)
        return EXIT_NONFINITE
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (messages on stderr, never a traceback)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # a file or a pipe: the full table
    try:
        args = build_parser().parse_args(argv)
        if args.command == "report":
            return _report(args, console)
        return EXIT_USAGE
    except ReportError as err:
        print(f"observers-core: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print("observers-core: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # writing --json/--csv/--plot
        print(f"observers-core: error: {err}", file=sys.stderr)
        return EXIT_INPUT


def entry_point() -> None:
    sys.exit(main())
