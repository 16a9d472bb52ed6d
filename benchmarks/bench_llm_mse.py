"""llm-compressor's MSE grid search, observers_core vs llm-compressor 0.14, same data, same process, on
the CPU (torch's threads), interleaved repeats, medians; ratio = llm-compressor / ours (above 1: ours is
faster). Each case also checks that both give the same scales bit for bit.

Cases:
- ``memoryless_mse`` on a ``rows x 4096`` float32 weight (default 4096 x 4096), int4 symmetric groups of
  128 (W4A16), default grid (maxshrink 0.2, grid 100: 20 candidates, patience 5, norm 2.4), through
  llm-compressor's interface (``Observer.load_from_registry``, ``obs(w)``, ``obs.get_qparams()``);
- the whole W4A16 ``oneshot`` (QuantizationModifier, weights observed by ``memoryless_mse`` and by
  ``memoryless_minmax``) of a tiny Llama built from a LlamaConfig (no download);
- with ``--device cuda`` (a GPU), the grid case on the card: llm-compressor's eager search (its
  ``_grid_search_mse`` fallback, forced through ``ImplBackend.call``), its default (its Triton kernel, a
  per-group patience) and ours (the Triton screen), synchronised; ours is checked against the eager
  search bit for bit.

Usage: ``python benchmarks/bench_llm_mse.py [--rows 4096] [--repeat 3] [--skip-oneshot] [--device cuda]``
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line, time_interleaved  # noqa: E402


def grid_search_case(rows: int, repeat: int) -> None:
    import torch
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.observers import Observer

    import observers_core.adapters.llmcompressor as oc

    args = preset_name_to_scheme("W4A16", ["Linear"]).weights
    w = torch.randn(rows, 4096, generator=torch.Generator().manual_seed(0))
    out = {}

    def run(name):
        obs = Observer.load_from_registry(name, base_name="weight", args=args.model_copy(deep=True))
        obs(w)
        out[name] = obs.get_qparams()

    names = {"llm-compressor": "memoryless_mse", "observers_core": oc.PREFIX + "memoryless-mse"}
    t = time_interleaved({k: (lambda n=n: run(n)) for k, n in names.items()}, repeats=repeat, warmup=0)
    a, b = out[names["llm-compressor"]], out[names["observers_core"]]
    same = torch.equal(a["scale"], b["scale"]) and torch.equal(a["zero_point"], b["zero_point"])
    print(f"memoryless_mse {rows}x4096 int4 g128, 20 candidates: llm-compressor {t['llm-compressor'].median:.2f} s, "
          f"observers_core {t['observers_core'].median:.2f} s, ratio {t['llm-compressor'].median / t['observers_core'].median:.2f}x; "
          f"scales bit for bit equal: {same}")


def gpu_grid_case(rows: int, repeat: int) -> None:
    import torch
    from compressed_tensors.quantization import QuantizationStrategy, preset_name_to_scheme
    from compressed_tensors.utils.impl_backend import ImplBackend
    from llmcompressor.observers import Observer

    import observers_core.adapters.llmcompressor as oc

    args = preset_name_to_scheme("W4A16", ["Linear"]).weights
    token_args = args.model_copy(update={"strategy": QuantizationStrategy.TOKEN})
    w = torch.randn(rows, 4096, generator=torch.Generator().manual_seed(0)).cuda()
    observed = w.reshape(1, rows, 4096 // 128, 128)
    out = {}

    def eager():
        out["eager"] = ImplBackend.call("_grid_search_mse", observed, args, token_args, 0.2, 5, 100.0, 2.4, 0.3, 1.0)

    def registry(name):
        obs = Observer.load_from_registry(name, base_name="weight", args=args.model_copy(deep=True))
        obs(w)
        out[name] = (obs.min_vals.clone(), obs.max_vals.clone()) if hasattr(obs, "min_vals") else None

    def ours():
        from observers_core.families import llm

        cfg = oc.config_from_args(args, search="mse")
        out["ours"] = llm.grid_search(llm.flatten(w, cfg), cfg)

    cands = {"llm-compressor eager": eager, "llm-compressor default (Triton)": lambda: registry("memoryless_mse"),
             "observers_core": ours}
    t = time_interleaved(cands, repeats=repeat, warmup=1, sync=torch.cuda.synchronize)
    same = all(torch.equal(a, b) for a, b in zip(out["eager"], out["ours"]))
    ours_t = t["observers_core"].median
    print(f"CUDA {torch.cuda.get_device_name()}: grid search {rows}x4096 int4 g128: "
          + ", ".join(f"{k} {v.median * 1e3:.1f} ms" for k, v in t.items())
          + f"; eager / ours {t['llm-compressor eager'].median / ours_t:.1f}x, "
          f"Triton / ours {t['llm-compressor default (Triton)'].median / ours_t:.1f}x; "
          f"ranges bit for bit equal to the eager search: {same}")


def oneshot_case(repeat: int) -> None:
    import datasets
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import observers_core.adapters.llmcompressor as oc

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    where = tempfile.mkdtemp()
    cfg.save_pretrained(where)
    model = LlamaForCausalLM(cfg).eval()
    model.config._name_or_path = where
    vocab = {f"t{i}": i for i in range(255)}
    vocab["[UNK]"] = 255
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[UNK]")
    ds = datasets.Dataset.from_dict({"input_ids": torch.randint(0, 255, (8, 32)).tolist(),
                                     "attention_mask": [[1] * 32] * 8})

    def run(observer):
        m = copy.deepcopy(model)
        recipe = QuantizationModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"],
                                      weight_observer=observer)
        oneshot(model=m, processor=tok, dataset=ds, recipe=recipe, num_calibration_samples=8,
                max_seq_length=32, pipeline="basic")

    for obs in ("memoryless_mse", "memoryless_minmax"):
        names = {"llm-compressor": obs, "observers_core": oc.PREFIX + obs.replace("_", "-")}
        t = time_interleaved({k: (lambda n=n: run(n)) for k, n in names.items()}, repeats=repeat, warmup=1)
        print(f"W4A16 oneshot, tiny Llama (hidden 256, 2 layers), weights by {obs}: llm-compressor "
              f"{t['llm-compressor'].median:.2f} s, observers_core {t['observers_core'].median:.2f} s, "
              f"ratio {t['llm-compressor'].median / t['observers_core'].median:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-oneshot", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    print(machine_line("torch", "llmcompressor", "compressed-tensors"), f"; torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    if opts.device == "cuda":
        gpu_grid_case(opts.rows, opts.repeat)
        print(f"total {time.perf_counter() - t0:.0f} s")
        return
    grid_search_case(opts.rows, opts.repeat)
    if not opts.skip_oneshot:
        oneshot_case(opts.repeat)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
