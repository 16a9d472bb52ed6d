"""End to end: llm-compressor's ``oneshot`` with a ``QuantizationModifier`` on a tiny Llama built from a
transformers ``LlamaConfig`` (no download), with observers_core's observers named in the recipe against
llm-compressor's own: every scale, zero point and global scale of the model bit for bit equal."""

from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.slow  # a few seconds per oneshot on two cores

# (scheme, llm-compressor's observers, ours): weights and input activations
CASES = [
    ("W4A16", {"weights": "memoryless_minmax"}, {"weights": "observers-core-memoryless-minmax"}),
    ("W4A16", {"weights": "memoryless_mse"}, {"weights": "observers-core-memoryless-mse"}),
    ("FP8", {"weights": "memoryless_minmax", "input": "static_minmax"},
     {"weights": "observers-core-memoryless-minmax", "input": "observers-core-static-minmax"}),
    ("NVFP4", {"weights": "memoryless_minmax", "input": "static_minmax"},
     {"weights": "observers-core-memoryless-minmax", "input": "observers-core-static-minmax"}),
    ("NVFP4", {"weights": "nvfp4_expanded_mse", "input": "static_minmax"},
     {"weights": "observers-core-nvfp4-expanded-mse", "input": "observers-core-static-minmax"}),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer Llama (hidden 128, so groups of 128 divide), a word-level tokenizer and 8 random samples."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    where = tmp_path_factory.mktemp("tiny_llama")
    cfg.save_pretrained(where)  # oneshot reads the config from name_or_path
    model = LlamaForCausalLM(cfg).eval()
    model.config._name_or_path = str(where)
    vocab = {f"t{i}": i for i in range(255)}
    vocab["[UNK]"] = 255
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[UNK]")
    g = torch.Generator().manual_seed(1)
    ds = datasets.Dataset.from_dict({"input_ids": torch.randint(0, 255, (8, 16), generator=g).tolist(),
                                     "attention_mask": [[1] * 16] * 8})
    return model, tok, ds


def quantize(tiny, scheme: str, observers: dict):
    import observers_core.adapters.llmcompressor  # noqa: F401  (registers observers-core-*)
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model, tok, ds = tiny
    model = copy.deepcopy(model)
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"], observer=dict(observers))
    oneshot(model=model, processor=tok, dataset=ds, recipe=recipe, num_calibration_samples=8, max_seq_length=16,
            pipeline="basic")
    return model


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("scheme,theirs,ours", CASES, ids=[f"{c[0]}-{c[1]['weights']}" for c in CASES])
def test_oneshot_same_qparams(tiny, scheme, theirs, ours):
    a = quantize(tiny, scheme, theirs).state_dict()
    b = quantize(tiny, scheme, ours).state_dict()
    keys = [k for k in a if k.endswith(("scale", "zero_point"))]
    assert keys and set(keys) == {k for k in b if k.endswith(("scale", "zero_point"))}
    if scheme != "W4A16":
        assert any("input_global_scale" in k or "input_scale" in k for k in keys)  # activations observed too
    for k in keys:
        assert a[k].dtype == b[k].dtype and torch.equal(_bits(a[k]), _bits(b[k])), k
