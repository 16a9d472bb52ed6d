"""Two gloo processes on 127.0.0.1 calibrate with observers_core's llm-compressor observers and sync them
with llm-compressor's own ``sync_activation_stats`` (all-reduce MIN/MAX of static ranges, SUM of imatrix
sums and counts): every rank's qparams equal one process's on the same shards merged with the core's
``merge`` (static ranges: also the single pass over all batches). Slow: each rank imports llm-compressor.

Run as a script, this file is one rank: ``python test_llm_distributed.py RANK WORLD PORT OUT``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

WORLD = 2


def _batches(world: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 8, 128, generator=g) * (i + 1) for i in range(2 * world)]


def _weight():
    return torch.randn(16, 128, generator=torch.Generator().manual_seed(1))


def _static(batches):
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.observers import Observer

    import observers_core.adapters.llmcompressor  # noqa: F401

    args = preset_name_to_scheme("FP8", ["Linear"]).input_activations
    obs = Observer.load_from_registry("observers-core-static-minmax", base_name="input", args=args.model_copy(deep=True))
    for x in batches:
        obs(x)
    return obs


def _imatrix(batches):
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.observers import Observer

    import observers_core.adapters.llmcompressor  # noqa: F401

    lin = torch.nn.Linear(128, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(_weight())
    args = preset_name_to_scheme("W4A16", ["Linear"]).weights
    obs = Observer.load_from_registry("observers-core-imatrix-mse", base_name="weight", args=args.model_copy(deep=True))
    obs.attach(lin)
    with torch.no_grad():
        for x in batches:
            lin(x)
    return obs, lin


def _bits(t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _rank_main(rank: int, world: int, port: int, out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        mine = _batches(world)[rank::world]
        static = _static(mine)
        for work in static.sync_activation_stats():
            work.wait()
        imat, lin = _imatrix(mine)
        for work in imat.sync_activation_stats():
            work.wait()
        imat(lin.weight)
        got = {"static": static.get_qparams(), "imatrix": imat.get_qparams()}

        from observers_core.families import llm

        # one process: the single pass (static ranges), and the shards' importance merged in rank order
        single = _static(_batches(world)).get_qparams()
        shards = [_imatrix(_batches(world)[r::world]) for r in range(world)]
        merged = llm.Importance(shards[0][0]._imatrix_sum, shards[0][0]._imatrix_count)
        for obs, _ in shards[1:]:
            merged = llm.importance_merge(merged, llm.Importance(obs._imatrix_sum, obs._imatrix_count))
        ref, ref_lin = shards[0]
        ref._imatrix_sum, ref._imatrix_count = merged.sum, merged.count
        ref(ref_lin.weight)
        want = {"static": single, "imatrix": ref.get_qparams()}
        for name in got:
            same = all(torch.equal(_bits(got[name][k]), _bits(want[name][k]))
                       for k in ("scale", "zero_point") if got[name][k] is not None)
            results[name] = "ok" if same else f"differs: {got[name]} vs {want[name]}"
    except Exception as exc:  # reported to the test
        results["error"] = repr(exc)
    finally:
        out.write_text(json.dumps(results))
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path):
    pytest.importorskip("llmcompressor")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(WORLD), str(port), str(tmp_path / f"{r}.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in range(WORLD)]
    try:
        for p in procs:
            p.wait(timeout=400)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r in range(WORLD):
        results = json.loads((tmp_path / f"{r}.json").read_text())
        assert results == {"static": "ok", "imatrix": "ok"}, (r, results)


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
