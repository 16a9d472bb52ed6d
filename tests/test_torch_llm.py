"""The torch observers of the LLM family (observers_core.adapters.torch.LLMObserver): equal to the family's
functions and to llm-compressor 0.14's observers bit for bit, state_dict / torch.save round trips, bad input."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from observers_core.adapters.torch import LLMObserver, llm_fused_global_scale  # noqa: E402
from observers_core.families import llm  # noqa: E402

XP = pytest.importorskip("array_api_compat.torch")

W4_GROUP = llm.Config(num_bits=4, strategy="group", group_size=128)
NVFP4 = llm.Config(num_bits=4, type="float", strategy="tensor_group", group_size=16, scale_dtype="float8_e4m3fn")
FP8_TENSOR = llm.Config(num_bits=8, type="float", strategy="tensor")


def bits(t):
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def weight(seed=0, shape=(32, 256)):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    w[3, 17] = 40.0
    w[1] = 0.0
    return w


def acts(n=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 5, 256, generator=g) * (1 + i) for i in range(n)]


CASES = {
    "int4-group-minmax": (W4_GROUP, "weight"),
    "int4-asym-mse": (llm.Config(num_bits=4, symmetric=False, strategy="group", group_size=128, search="mse"), "weight"),
    "nvfp4-mse": (llm.Config(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                             scale_dtype="float8_e4m3fn", search="mse"), "weight"),
    "fp8-static": (llm.Config(num_bits=8, type="float", strategy="tensor", mode="static"), "activation"),
    "fp8-moving": (llm.Config(num_bits=8, type="float", strategy="tensor", mode="moving", averaging_constant=0.3),
                   "activation"),
}


@pytest.mark.parametrize("name", CASES)
def test_equals_the_family_functions(name):
    cfg, role = CASES[name]
    batches = [weight()] if role == "weight" else acts()
    obs = LLMObserver(cfg, role=role)
    state = None
    for x in batches:
        assert obs(x) is x
        o = llm.flatten(x, cfg, role=role)
        state = state or llm.init(cfg, qparam_shape=tuple(o.shape[1:-1]), dtype=o.dtype, xp=XP)
        state = llm.update(cfg, state, o)
    want = llm.qparams(cfg, state)
    got = obs.calculate_qparams()
    assert same(got[0], want.scale)
    assert torch.equal(got[1].float(), want.zero_point.float())
    assert len(got) == (3 if cfg.strategy == "tensor_group" else 2)
    if cfg.strategy == "tensor_group":
        assert same(got[2], want.global_scale)
    assert int(obs.count) == len(batches)


# ------------------------------------------------------------------------------------ llm-compressor


def _theirs(name, preset, batches, part="weights", base_name="weight", module=None, inputs=()):
    pytest.importorskip("llmcompressor")
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.observers import Observer

    args = getattr(preset_name_to_scheme(preset, ["Linear"]), part)
    obs = Observer.load_from_registry(name, base_name=base_name, args=args)
    if module is not None:
        obs.attach(module)
        with torch.no_grad():
            for x in inputs:
                module(x)
    for x in batches:
        obs(x)
    return args, obs.get_qparams()


@pytest.mark.parametrize("preset,name,search", [("W4A16", "memoryless_minmax", None),
                                                 ("W4A16_ASYM", "memoryless_mse", "mse"),
                                                 ("NVFP4A16", "memoryless_mse", "mse"),
                                                 ("MXFP4A16", "memoryless_minmax", None)])
def test_weights_equal_llmcompressor(preset, name, search):
    from observers_core.adapters.llmcompressor import config_from_args

    w = weight(2)
    args, theirs = _theirs(name, preset, [w])
    obs = LLMObserver(config_from_args(args, search=search))
    obs(w)
    got = obs.calculate_qparams()
    assert same(got[0], theirs["scale"]) and same(got[1], theirs["zero_point"].to(got[1].dtype))
    if theirs["global_scale"] is not None:
        assert same(got[2], theirs["global_scale"])


@pytest.mark.parametrize("name,mode", [("static_minmax", "static"), ("minmax", "moving")])
def test_activations_equal_llmcompressor(name, mode):
    from observers_core.adapters.llmcompressor import config_from_args

    batches = acts()
    args, theirs = _theirs(name, "FP8", batches, part="input_activations", base_name="input")
    obs = LLMObserver(config_from_args(args, mode=mode), role="activation")
    for x in batches:
        obs(x)
    scale, zp = obs.calculate_qparams()
    assert same(scale, theirs["scale"]) and same(zp, theirs["zero_point"])


def test_imatrix_equals_llmcompressor():
    from observers_core.adapters.llmcompressor import config_from_args

    w, inputs = weight(3, (16, 256)), acts(2, seed=4)
    lin = torch.nn.Linear(256, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    args, theirs = _theirs("imatrix_mse", "W4A16", [w], module=lin, inputs=inputs)
    obs = LLMObserver(config_from_args(args, search="imatrix", maxshrink=0.95, grid=20.0, patience=5, norm=3.0))  # their defaults
    lin2 = torch.nn.Linear(256, 16, bias=False)
    handle = obs.attach(lin2)
    with torch.no_grad():
        for x in inputs:
            lin2(x)
    handle.remove()
    assert int(obs.importance_count) == sum(x.shape[0] * x.shape[1] for x in inputs)
    obs(w)
    scale, zp = obs.calculate_qparams()
    assert same(scale, theirs["scale"]) and same(zp, theirs["zero_point"])


def test_nonfinite_weight_equals_llmcompressor():
    from observers_core.adapters.llmcompressor import config_from_args

    w = weight(5)
    w[2, 5], w[7, 130] = float("nan"), float("inf")
    args, theirs = _theirs("memoryless_minmax", "W4A16", [w])
    obs = LLMObserver(config_from_args(args))
    obs(w)
    assert same(obs.calculate_qparams()[0], theirs["scale"])


def test_imatrix_without_data_falls_back_to_uniform():
    cfg = llm.Config(num_bits=4, strategy="group", group_size=128, search="imatrix")
    w = weight(6)
    obs = LLMObserver(cfg)
    with pytest.warns(UserWarning, match="no importance data"):
        obs(w)
    want = llm.qparams(cfg, llm.update(cfg, llm.init(cfg, qparam_shape=(32, 2), xp=XP), llm.flatten(w, cfg)))
    assert same(obs.calculate_qparams()[0], want.scale)


def test_fused_global_scale():
    ws = [weight(s, (16, 64)) * (1 + s) for s in range(3)]
    obs = [LLMObserver(NVFP4) for _ in ws]
    for o, w in zip(obs, ws):
        o(w)
    g = llm_fused_global_scale(*obs)
    assert same(g, llm.global_scale(-ws[2].abs().max().reshape(1), ws[2].abs().max().reshape(1)))
    for o, w in zip(obs, ws):
        s, _, g2 = o.calculate_qparams(global_scale=g)
        assert g2 is g
        want = llm.calculate_qparams(o.min_vals, o.max_vals, NVFP4, global_scale=g)[0]
        assert same(s, want)
    with pytest.raises(ValueError, match=r"observers\[0\]"):
        llm_fused_global_scale(LLMObserver(NVFP4))


# ---------------------------------------------------------------------------------------- state_dict


@pytest.mark.parametrize("name", ["int4-asym-mse", "fp8-moving"])
def test_state_dict_round_trip(name):
    cfg, role = CASES[name]
    batches = [weight()] if role == "weight" else acts()
    a = LLMObserver(cfg, role=role)
    a(batches[0])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = LLMObserver(cfg, role=role)
    b.load_state_dict(torch.load(buf))
    for x in batches[1:]:
        a(x)
        b(x)
    for qa, qb in zip(a.calculate_qparams(), b.calculate_qparams()):
        assert same(qa, qb)
    assert set(a.state_dict()) == {"min_vals", "max_vals", "count"}
    c = LLMObserver(cfg, role=role).to(torch.float64)  # .to() moves the buffers; loading restores dtypes
    c.load_state_dict(a.state_dict())
    assert c.min_vals.dtype == torch.float32


def test_imatrix_state_dict_keeps_importance():
    cfg = llm.Config(num_bits=4, strategy="group", group_size=128, search="imatrix")
    a = LLMObserver(cfg)
    for x in acts(2):
        a.collect_importance(x)
    b = LLMObserver(cfg)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.importance_sum, b.importance_sum) and int(b.importance_count) == 20
    w = weight(7)
    a(w)
    b(w)
    assert same(a.calculate_qparams()[0], b.calculate_qparams()[0])


def test_bad_state_dict_changes_nothing():
    a = LLMObserver(W4_GROUP)
    a(weight())
    before = {k: v.clone() for k, v in a.state_dict().items()}
    bad = dict(before, max_vals=before["max_vals"][:3])
    with pytest.raises(ValueError, match="min_vals/max_vals"):
        a.load_state_dict(bad)
    with pytest.raises(ValueError, match="count"):
        a.load_state_dict(dict(before, count=torch.tensor(1.5)))
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())


# ----------------------------------------------------------------------------------------- bad input


def test_bad_input_is_a_clear_error_and_changes_nothing():
    obs = LLMObserver(W4_GROUP)
    obs(weight())
    before = {k: v.clone() for k, v in obs.state_dict().items()}
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        obs(torch.ones(32, 256, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        obs(np.ones((32, 256), np.float32))
    with pytest.raises(TypeError, match="dtype torch.float16"):
        s = LLMObserver(llm.Config(strategy="tensor", mode="static"))
        s(torch.ones(4, 4))
        s(torch.ones(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="group_size"):
        obs(torch.ones(32, 100))
    with pytest.raises(ValueError, match="2-D"):
        obs(torch.ones(256))
    with pytest.raises(ValueError, match="qparam shape"):
        s = LLMObserver(llm.Config(strategy="channel", mode="static"))
        s(torch.ones(4, 8))
        s(torch.ones(5, 8))
    assert all(torch.equal(before[k], v) for k, v in obs.state_dict().items())
    with pytest.raises(RuntimeError, match="no statistics"):
        LLMObserver(W4_GROUP).calculate_qparams()
    with pytest.raises(ValueError, match="role"):
        LLMObserver(W4_GROUP, role="bias")
    with pytest.raises(ValueError, match="search='imatrix'"):
        LLMObserver(W4_GROUP).collect_importance(torch.ones(2, 256))


def test_empty_activation_records_nothing():
    obs = LLMObserver(FP8_TENSOR, role="activation")
    x = torch.empty(0, 256)
    assert obs(x) is x and not obs.has_statistics


def test_half_precision_weight_equals_the_family():
    cfg = llm.Config(num_bits=4, strategy="group", group_size=128, search="mse")
    w = weight(9).to(torch.bfloat16)
    obs = LLMObserver(cfg)
    obs(w)
    o = llm.flatten(w, cfg)
    state = llm.update(cfg, llm.init(cfg, qparam_shape=(32, 2), dtype=w.dtype, xp=XP), o)
    assert obs.min_vals.dtype == torch.bfloat16
    assert same(obs.calculate_qparams()[0], llm.qparams(cfg, state).scale)


def test_module_api():
    obs = LLMObserver(num_bits=8, strategy="channel")
    assert "strategy='channel'" in repr(obs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obs(weight())
    assert obs.min_vals.shape == (32, 1)
    obs.reset()
    assert not obs.has_statistics and obs.min_vals.numel() == 0
    with pytest.raises(TypeError, match="not both"):
        LLMObserver(W4_GROUP, num_bits=8)
