"""observers_core's observers in llm-compressor's registry against llm-compressor 0.14's own, through
llm-compressor's interface (``Observer.load_from_registry``, ``obs(x)``, ``obs.get_qparams()``): scale,
zero point and global scale bit for bit (dtype, shape, every bit, NaN included), on compressed-tensors'
preset schemes."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")
pytest.importorskip("compressed_tensors")

from compressed_tensors.quantization import QuantizationArgs, preset_name_to_scheme  # noqa: E402
from llmcompressor.observers import Observer  # noqa: E402

import observers_core.adapters.llmcompressor as oc  # noqa: E402

WEIGHT_PRESETS = ["W2A16", "W3A16", "W4A16", "W5A16", "W6A16", "W7A16", "W8A16", "W4A16_ASYM", "W8A8", "FP8",
                  "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "NVFP4", "MXFP4A16", "MXFP8"]
SLOW = pytest.mark.slow


def slow(*values):
    """Parameters run only with ``-m slow`` (the default run stays short)."""
    return [pytest.param(*v, marks=SLOW) if isinstance(v, tuple) else pytest.param(v, marks=SLOW) for v in values]


WEIGHT_OBSERVERS = ["memoryless_minmax", "memoryless_mse", *slow("static_minmax", "minmax", "mse")]
KINDS = ["random", "outlier", "zero_row", "scaled_small", "scaled_large"]


def weight_args(preset: str) -> QuantizationArgs:
    return preset_name_to_scheme(preset, ["Linear"]).weights


def make_weight(kind: str, shape=(32, 256), seed=0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    if kind == "outlier":
        w[3, 17] = 40.0
        w[7, 100] = -25.0
    elif kind == "zero_row":
        w[1] = 0.0
        w[5, :64] = 0.0
    elif kind == "scaled_small":
        w = w * 1e-4
    elif kind == "scaled_large":
        w = w * 1e3
    return w.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (NaN payloads and signed zeros compared exactly)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def assert_same_qparams(theirs: dict, ours: dict) -> None:
    for key in ("scale", "zero_point", "global_scale"):
        a, b = theirs[key], ours[key]
        if a is None or b is None:
            assert a is None and b is None, key
            continue
        assert a.dtype == b.dtype, (key, a.dtype, b.dtype)
        assert a.shape == b.shape, (key, a.shape, b.shape)
        diff = (bits(a) != bits(b)).sum().item()
        assert diff == 0, f"{key}: {diff} of {a.numel()} differ"


def run(name: str, args: QuantizationArgs, batches, base_name="weight", **kwargs) -> dict:
    obs = Observer.load_from_registry(name, base_name=base_name, args=args.model_copy(deep=True), **kwargs)
    for x in batches:
        obs(x)
    return obs.get_qparams()


def both(name: str, args: QuantizationArgs, batches, **kwargs) -> tuple[dict, dict]:
    ours_name = oc.PREFIX + name.replace("_", "-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return run(name, args, batches, **kwargs), run(ours_name, args, batches, **kwargs)


def test_every_name_registered():
    for name in oc.NAMES:
        theirs = Observer.get_value_from_registry(name)
        ours = Observer.get_value_from_registry(oc.PREFIX + name)
        assert ours is not theirs
        if isinstance(ours, type):
            assert issubclass(ours, Observer) and issubclass(ours, theirs)


@pytest.mark.parametrize("preset", WEIGHT_PRESETS)
@pytest.mark.parametrize("observer", WEIGHT_OBSERVERS)
def test_weight_presets(preset, observer):
    if preset == "FP8_BLOCK" and "mse" in observer:
        pytest.skip("covered by test_fp8_block_mse (slow)")
    shape = (200, 300) if preset == "FP8_BLOCK" else (32, 256)  # blocks of 128 padded
    w = make_weight("random", shape)
    assert_same_qparams(*both(observer, weight_args(preset), [w]))


@SLOW
@pytest.mark.parametrize("observer", ["memoryless_mse", "mse"])
def test_fp8_block_mse(observer):
    assert_same_qparams(*both(observer, weight_args("FP8_BLOCK"), [make_weight("outlier", (200, 300))]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "NVFP4A16", "MXFP4A16", *slow("W8A8", "FP8", "MXFP8")])
def test_weight_kinds_mse(preset, kind):
    assert_same_qparams(*both("memoryless_mse", weight_args(preset), [make_weight(kind, seed=1)]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("preset", ["W4A16", "NVFP4A16", *slow("W4A16_ASYM", "MXFP4A16", "FP8_BLOCK")])
def test_weight_kinds_minmax(preset, kind):
    assert_same_qparams(*both("memoryless_minmax", weight_args(preset), [make_weight(kind, (256, 256), seed=2)]))


@pytest.mark.parametrize("observer", ["nvfp4_expanded_mse", "fouroversix"])
@pytest.mark.parametrize("kind", ["random", "outlier", "zero_row"])
def test_nvfp4_expanded(observer, kind):
    assert_same_qparams(*both(observer, weight_args("NVFP4A16"), [make_weight(kind, (16, 128), seed=3)]))


@pytest.mark.parametrize("kwargs", [{"maxshrink": 0.5, "grid": 10, "patience": 1, "norm": 2.0},
                                    {"patience": 0}, {"expand": 1.3, "norm": 3.0}, {"maxshrink": 0.0}])
def test_mse_observer_kwargs(kwargs):
    assert_same_qparams(*both("memoryless_mse", weight_args("W4A16"), [make_weight("outlier", seed=4)], **kwargs))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("preset", ["W4A16", "NVFP4A16", "MXFP8", *slow("W4A16_ASYM", "FP8", "MXFP4A16")])
@pytest.mark.parametrize("observer", ["memoryless_minmax", "memoryless_mse"])
def test_half_precision_weights(preset, observer, dtype):
    assert_same_qparams(*both(observer, weight_args(preset), [make_weight("outlier", seed=5, dtype=dtype)]))


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "FP8", "NVFP4A16", "MXFP4A16"])
@pytest.mark.parametrize("observer", ["memoryless_minmax", "memoryless_mse"])
def test_nonfinite_weights(preset, observer):
    w = make_weight("random", seed=6)
    w[0, 0] = float("nan")
    w[2, 5] = float("inf")
    w[4, 200] = -float("inf")
    assert_same_qparams(*both(observer, weight_args(preset), [w]))


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "NVFP4A16", "MXFP4A16", "FP8"])
@pytest.mark.parametrize("observer", ["memoryless_minmax", "memoryless_mse"])
def test_all_zero_weight(preset, observer):
    assert_same_qparams(*both(observer, weight_args(preset), [torch.zeros(8, 128)]))


def test_group_size_not_dividing_is_a_clear_error():
    args = weight_args("W4A16")
    w = torch.randn(8, 200)
    with pytest.raises(RuntimeError):  # llm-compressor: torch's unflatten error
        run("memoryless_minmax", args, [w])
    obs = Observer.load_from_registry(oc.PREFIX + "memoryless-minmax", base_name="weight", args=args.model_copy(deep=True))
    with pytest.raises(ValueError, match="group_size=128"):
        obs(w)
    assert not obs.has_statistics  # nothing recorded


def test_empty_activation_is_a_no_op():
    args = preset_name_to_scheme("FP8", ["Linear"]).input_activations
    for name in ("static_minmax", oc.PREFIX + "static-minmax"):
        obs = Observer.load_from_registry(name, base_name="input", args=args.model_copy(deep=True))
        obs(torch.empty(0, 4, 64))
        assert not obs.has_statistics
        with pytest.raises(AssertionError):
            obs.get_qparams()
    with pytest.raises(oc.NoStatisticsError, match="No statistics"):
        obs.get_qparams()


def activations(n=3, seed=7, shape=(2, 8, 256), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(shape, generator=g) * (1 + i)
        x[0, 0, i] = 20.0 * (i + 1)
        out.append(x.to(dtype))
    return out


@pytest.mark.parametrize("preset", ["FP8", "NVFP4"])
@pytest.mark.parametrize("observer", ["static_minmax", "minmax", "mse", *slow("memoryless_minmax", "memoryless_mse")])
def test_activation_batches(preset, observer):
    args = preset_name_to_scheme(preset, ["Linear"]).input_activations
    assert_same_qparams(*both(observer, args, activations(), base_name="input"))


@SLOW
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_activation_batches_half(dtype):
    args = preset_name_to_scheme("FP8", ["Linear"]).input_activations
    for observer in ("static_minmax", "minmax", "mse"):
        assert_same_qparams(*both(observer, args, activations(dtype=dtype), base_name="input"))


def test_minmax_averaging_constant():
    args = preset_name_to_scheme("FP8", ["Linear"]).input_activations
    for c in (0.5, 1.0):
        assert_same_qparams(*both("minmax", args, activations(), base_name="input", averaging_constant=c))


def _imatrix_pair(name: str, preset: str, w: torch.Tensor, inputs, **kwargs):
    results = []
    for obs_name in (name, oc.PREFIX + name.replace("_", "-")):
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        obs = Observer.load_from_registry(obs_name, base_name="weight", args=weight_args(preset).model_copy(deep=True),
                                          **kwargs)
        obs.attach(lin)
        with torch.no_grad():
            for x in inputs:
                lin(x)
        stats = (obs._imatrix_sum.clone(), obs._imatrix_count.clone())
        obs(lin.weight)
        results.append((obs.get_qparams(), *stats))
        obs.detach(lin)
    return results


@pytest.mark.parametrize("name,preset", [("imatrix_mse", "W4A16"), ("imatrix_mse", "W4A16_ASYM"),
                                         ("imatrix_mse", "NVFP4A16"), ("imatrix_mse", "W8A8"),
                                         ("nvfp4_expanded_imatrix", "NVFP4A16")])
def test_imatrix(name, preset):
    w = make_weight("outlier", (16, 256), seed=8)
    (theirs, s1, c1), (ours, s2, c2) = _imatrix_pair(name, preset, w, activations(seed=9))
    assert torch.equal(bits(s1), bits(s2)) and torch.equal(c1, c2)
    assert_same_qparams(theirs, ours)


def test_imatrix_without_data_falls_back_to_uniform():
    w = make_weight("random", (16, 256), seed=10)
    (theirs, _, _), (ours, _, _) = _imatrix_pair("imatrix_mse", "W4A16", w, [])
    assert_same_qparams(theirs, ours)


def test_nvfp4_fused_global_scale():
    """q/k/v observers fused: one global scale from all three ranges, the block scales follow."""
    from llmcompressor.observers.fusion import FusionHandler

    args = weight_args("NVFP4A16")
    weights = [make_weight("random", (16, 64), seed=s) * (1 + s) for s in range(3)]
    out = {}
    for prefix in ("", oc.PREFIX):
        mods = [torch.nn.Linear(64, 16, bias=False) for _ in weights]
        obs = []
        for m, w in zip(mods, weights):
            with torch.no_grad():
                m.weight.copy_(w)
            obs.append(Observer.load_from_registry(prefix + ("memoryless-minmax" if prefix else "memoryless_minmax"),
                                                   base_name="weight", args=args.model_copy(deep=True)))
        FusionHandler.fuse(zip(obs, mods))
        obs[0](mods[0].weight)
        out[prefix] = [o.get_qparams() for o in obs]
    for theirs, ours in zip(out[""], out[oc.PREFIX]):
        assert_same_qparams(theirs, ours)
    assert torch.equal(out[oc.PREFIX][0]["global_scale"], out[oc.PREFIX][2]["global_scale"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "W8A16", "NVFP4A16", "MXFP4A16", "FP8_BLOCK"])
def test_mse_larger_grid(preset, seed):
    w = make_weight(KINDS[seed % len(KINDS)], (512, 1024), seed=100 + seed)
    assert_same_qparams(*both("memoryless_mse", weight_args(preset), [w]))


@pytest.mark.parametrize("strategy", ["tensor", "attn_head"])
@pytest.mark.parametrize("observer", ["static_minmax", "minmax", "memoryless_mse"])
def test_attention_states(strategy, observer):
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True)
    g = torch.Generator().manual_seed(11)
    states = [torch.randn(2, 4, 6, 16, generator=g) * (i + 1) for i in range(2)]
    assert_same_qparams(*both(observer, args, states, base_name="k"))


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "W8A8", "FP8", "NVFP4A16", "MXFP4A16", "MXFP8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_equals_compressed_tensors(preset, dtype):
    """The core's fake quantizer (E2M1/E4M3/int values, NVFP4's global scale) against compressed-tensors'
    ``fake_quantize`` with the same qparams, on the weight's own layout."""
    from compressed_tensors.quantization.lifecycle import fake_quantize

    from observers_core.families import llm

    args = weight_args(preset)
    w = make_weight("outlier", (32, 256), seed=12, dtype=dtype)
    qp = run(oc.PREFIX + "memoryless-minmax", args, [w])
    theirs = fake_quantize(w, qp["scale"], qp["zero_point"], args, global_scale=qp["global_scale"])
    cfg = oc.config_from_args(args)
    flat = llm.flatten(w, cfg)
    zp = None if args.symmetric else qp["zero_point"].unsqueeze(-1)
    ours = llm.fake_quantize(flat, qp["scale"].reshape(flat.shape[1:-1]).unsqueeze(-1), zp, cfg,
                             global_scale=qp["global_scale"]).reshape(w.shape)
    assert ours.dtype == theirs.dtype and torch.equal(bits(ours), bits(theirs))
