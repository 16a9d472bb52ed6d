"""The LLM family's pure functions (observers_core.families.llm) without llm-compressor: the same results
on numpy, array_api_strict and torch, chunking that changes nothing, the stopping rule against an eager
loop, mergeable statistics, and argument checks. Parity with llm-compressor itself:
tests/test_llmcompressor_parity.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from observers_core.families import llm

CONFIGS = {
    "int4-group": llm.Config(num_bits=4, type="int", strategy="group", group_size=128, search="mse"),
    "int4-asym": llm.Config(num_bits=4, type="int", symmetric=False, strategy="group", group_size=128, search="mse"),
    "nvfp4": llm.Config(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                        scale_dtype="float8_e4m3fn", search="mse"),
    "mxfp4": llm.Config(num_bits=4, type="float", strategy="group", group_size=32, scale_dtype="uint8",
                        zp_dtype="uint8", search="mse"),
    "fp8-channel": llm.Config(num_bits=8, type="float", strategy="channel", search="mse"),
    "int8-imatrix": llm.Config(num_bits=8, type="int", strategy="channel", search="imatrix", maxshrink=0.95,
                               grid=20, norm=3.0),
}


def weight(seed=0, shape=(16, 256)):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    w[3, 7] = 12.0
    w[5] = 0.0
    return w


def to_numpy(a):
    return np.asarray(a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a)


@pytest.mark.parametrize("name", CONFIGS)
def test_backends_agree(name):
    """numpy, array_api_strict and torch give the same bits (float32)."""
    torch = pytest.importorskip("torch")
    xs = pytest.importorskip("array_api_strict")
    cfg, w = CONFIGS[name], weight()
    out = []
    for arr in (torch.from_numpy(w), w, xs.asarray(w)):
        o = llm.flatten(arr, cfg)
        state = llm.update(cfg, llm.init(cfg, qparam_shape=tuple(o.shape[1:-1]), xp=_ns(arr)), o)
        q = llm.qparams(cfg, state)
        out.append((np.asarray(q.scale), np.asarray(q.zero_point), np.asarray(state.min_vals)))
    for other in out[1:]:
        for a, b in zip(out[0], other):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _ns(arr):
    from array_api_compat import array_namespace

    return array_namespace(arr)


@pytest.mark.parametrize("name", CONFIGS)
def test_chunking_changes_nothing(name):
    cfg, o = CONFIGS[name], None
    o = llm.flatten(weight(1), cfg)
    ref = llm.grid_search(o, cfg)
    for chunk in (1, 100, 5000, 2**16):
        got = llm.grid_search(o, replace(cfg, chunk_elements=chunk))
        for a, b in zip(ref, got):
            assert np.array_equal(a, b)


def eager_select(err, cmin, cmax, mn, mx, patience, imatrix=False):
    """llm-compressor's loop over the precomputed error table (best starts at the dtype's max)."""
    best = np.full(err.shape[1:], np.finfo(err.dtype).max, dtype=err.dtype)
    bmin, bmax, stale = mn.copy(), mx.copy(), 0
    for i in range(err.shape[0]):
        improved = err[i] < best
        if improved.any():
            best[improved], bmin[improved], bmax[improved] = err[i][improved], cmin[i][improved], cmax[i][improved]
            stale = 0
        else:
            stale += 1
            if (patience > 0 or not imatrix) and stale >= patience:
                break
    return bmin, bmax


@pytest.mark.parametrize("patience", [0, 1, 2, 5])
@pytest.mark.parametrize("imatrix", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_stopping_rule_matches_the_eager_loop(patience, imatrix, seed):
    rng = np.random.default_rng(seed)
    t, g = 12, 5
    err = rng.integers(0, 4, (t, g)).astype(np.float32)  # many ties and plateaus
    err[rng.random((t, g)) < 0.1] = np.nan
    cmin, cmax = -rng.random((t, g)).astype(np.float32), rng.random((t, g)).astype(np.float32)
    mn, mx = cmin[0] * 2, cmax[0] * 2
    cfg = llm.Config(search="imatrix" if imatrix else "mse", patience=patience)
    got = llm.select_candidates(err, cmin, cmax, mn, mx, cfg)
    want = eager_select(err, cmin, cmax, mn, mx, patience, imatrix)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


def test_static_merge_equals_single_pass():
    cfg = llm.Config(num_bits=8, type="float", strategy="tensor", mode="static")
    batches = [np.random.default_rng(i).standard_normal((2, 8, 64)).astype(np.float32) * (i + 1) for i in range(4)]
    flat = [llm.flatten(b, cfg, role="activation") for b in batches]
    single = llm.init(cfg, qparam_shape=(1,))
    for f in flat:
        single = llm.update(cfg, single, f)
    shards = [llm.init(cfg, qparam_shape=(1,)) for _ in range(2)]
    for i, f in enumerate(flat):
        shards[i % 2] = llm.update(cfg, shards[i % 2], f)
    merged = llm.merge(cfg, shards[0], shards[1])
    assert np.array_equal(merged.min_vals, single.min_vals) and np.array_equal(merged.max_vals, single.max_vals)
    assert int(merged.count) == 4
    with pytest.raises(ValueError, match="moving"):
        llm.merge(replace(cfg, mode="moving"), shards[0], shards[1])


def test_importance_merge_equals_single_pass():
    xs = [np.random.default_rng(i).standard_normal((3, 5, 32)).astype(np.float32) for i in range(4)]
    single = llm.importance_init(32)
    for x in xs:
        single = llm.importance_update(single, x)
    a, b = llm.importance_init(32), llm.importance_init(32)
    for x in xs[:2]:
        a = llm.importance_update(a, x)
    b_parts = [llm.importance_update(llm.importance_init(32), x) for x in xs[2:]]
    merged = a
    for part in b_parts:  # shards merged in batch order
        merged = llm.importance_merge(merged, part)
    assert np.array_equal(merged.sum, single.sum) and int(merged.count) == int(single.count) == 60
    imp = llm.importance(merged)
    np.testing.assert_allclose(imp, np.concatenate([x.reshape(-1, 32) for x in xs]).astype(np.float64).__pow__(2).mean(0),
                               rtol=1e-5)


def test_fused_global_scale_takes_the_largest_range():
    a = (np.array([-1.0, -2.0], np.float32), np.array([1.0, 3.0], np.float32))
    b = (np.array([-7.0], np.float32), np.array([0.5], np.float32))
    g = llm.fused_global_scale([a, b])
    # torch's 2688 / tensor([7.]): the reciprocal of 7 then the product, 384.00003 (not 384)
    assert g.dtype == np.float32 and g.shape == (1,) and g[0] == (np.float32(1) / np.float32(7.0)) * np.float32(2688)
    zero = (np.zeros(3, np.float32), np.zeros(3, np.float32))
    assert llm.fused_global_scale([zero])[0] == 1.0  # 448*6/tiny overflows: 1, as compressed-tensors


@pytest.mark.parametrize("kwargs,match", [
    ({"type": "fp"}, "type"), ({"num_bits": 6, "type": "float"}, "num_bits"),
    ({"strategy": "group"}, "group_size"), ({"group_size": 32}, "group_size"),
    ({"scale_dtype": "float64"}, "scale_dtype"), ({"norm": 0}, "norm"), ({"grid": 0}, "grid"),
    ({"expand": 0.5}, "expand"), ({"patience": -1}, "patience"), ({"mode": "ema"}, "mode"),
    ({"num_bits": 4, "type": "float", "symmetric": False}, "FP4"),
])
def test_config_errors_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        llm.Config(**kwargs)


def test_flatten_errors():
    cfg = llm.Config(num_bits=4, strategy="group", group_size=128)
    with pytest.raises(ValueError, match="group_size=128"):
        llm.flatten(np.zeros((4, 200), np.float32), cfg)
    with pytest.raises(ValueError, match="2-D"):
        llm.flatten(np.zeros((4, 2, 128), np.float32), cfg)
    with pytest.raises(ValueError, match="role"):
        llm.flatten(np.zeros((4, 128), np.float32), cfg, role="bias")


def test_update_refuses_another_shape_and_keeps_empty_batches():
    cfg = llm.Config(num_bits=8, strategy="channel", mode="static")
    state = llm.init(cfg, qparam_shape=(4, 1))
    same = llm.update(cfg, state, np.zeros((1, 4, 1, 0), np.float32))
    assert same is state
    with pytest.raises(ValueError, match="qparam shape"):
        llm.update(cfg, state, llm.flatten(np.ones((5, 8), np.float32), cfg))


def test_docs_llm_blocks_run():
    """Every Python block of docs/llm.md runs on the CPU."""
    import re
    from pathlib import Path

    pytest.importorskip("torch")
    pytest.importorskip("llmcompressor")
    text = (Path(__file__).resolve().parents[1] / "docs" / "llm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/llm.md", "exec"), {})


class PairCollective:
    """Two members, the other's values given: min/max/sum of (mine, theirs)."""

    def __init__(self, other):
        self.other = list(other)

    def min(self, x):
        return np.minimum(x, self.other.pop(0))

    def max(self, x):
        return np.maximum(x, self.other.pop(0))

    def sum(self, x):
        return x + self.other.pop(0)


def test_collective_update_equals_one_process_on_both_batches():
    cfg = llm.Config(num_bits=8, type="float", strategy="tensor", mode="static")
    a, b = (llm.flatten(np.random.default_rng(s).standard_normal((2, 4, 64)).astype(np.float32) * (s + 1), cfg,
                        role="activation") for s in range(2))
    bmn, bmx = llm.observe(cfg, b)
    got = llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), a, collective=PairCollective([bmn, bmx]))
    want = llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), np.concatenate([a, b]))
    assert np.array_equal(got.min_vals, want.min_vals) and np.array_equal(got.max_vals, want.max_vals)
    # an empty batch with a collective contributes the identity instead of being skipped
    empty = np.zeros((0, 1, 64), np.float32)
    got = llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), empty, collective=PairCollective([bmn, bmx]))
    assert np.array_equal(got.max_vals, bmx) and int(got.count) == 1
    with pytest.raises(ValueError, match="search"):
        llm.update(replace(cfg, search="mse"), llm.init(cfg, qparam_shape=(1,)), a, collective=PairCollective([]))
    with pytest.raises(TypeError, match="collective"):
        llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), a, collective=object())
    imp = llm.importance_init(64)
    part = llm.importance_update(llm.importance_init(64), b.reshape(-1, 64))
    got = llm.importance_update(imp, a.reshape(-1, 64), collective=PairCollective([part.sum, part.count]))
    want = llm.importance_update(llm.importance_update(imp, a.reshape(-1, 64)), b.reshape(-1, 64))
    assert np.array_equal(got.sum, want.sum) and int(got.count) == int(want.count)


def test_memoryless_merge_keeps_the_later_batch():
    cfg = llm.Config(num_bits=8, strategy="tensor")
    x = llm.flatten(np.arange(8, dtype=np.float32).reshape(2, 4), cfg)
    a = llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), x)
    b = llm.update(cfg, llm.init(cfg, qparam_shape=(1,)), x * 2)
    assert llm.merge(cfg, a, b).max_vals[0] == 14.0
    assert llm.merge(cfg, b, llm.init(cfg, qparam_shape=(1,))).max_vals[0] == 14.0


def test_importance_weights_layout_and_fallbacks():
    """``importance_weights``: normalised E[x^2] per input channel laid out like the flattened weight, or
    ``(None, reason)`` where llm-compressor falls back to the uniform search."""
    cfg = llm.Config(num_bits=4, strategy="group", group_size=128, search="imatrix")
    x = np.random.default_rng(3).standard_normal((10, 256)).astype(np.float32)
    state = llm.importance_update(llm.importance_init(256), x)
    w, reason = llm.importance_weights(state, cfg, (4, 256))
    want = llm.normalized_importance(llm.importance(state))
    assert reason == "" and w.shape == (1, 4, 2, 128) and np.array_equal(w[0, 3].reshape(-1), want)
    assert llm.importance_weights(llm.importance_init(256), cfg, (4, 256))[1] == "no importance data"
    assert "columns" in llm.importance_weights(state, cfg, (4, 128))[1]
    assert llm.importance_weights(state, replace(cfg, strategy="tensor", group_size=None), (4, 256))[0] is None


@pytest.mark.parametrize("name", CONFIGS)
def test_numpy_and_jax_give_the_same_bits(name):
    """JAX (XLA rewrites a division by a broadcast value into a multiplication by its reciprocal, contracts
    ``a * b + c`` and reads subnormals as 0: the family divides and adds so that none of it changes a bit):
    ranges, scales, zero points, global scale and the fake-quantized weight equal NumPy's; a moving average of
    two batches and importance-weighted errors too."""
    jnp = pytest.importorskip("jax.numpy")
    cfg, w = CONFIGS[name], weight()
    moving = replace(cfg, mode="moving", averaging_constant=0.3)
    x = np.random.default_rng(5).standard_normal((6, w.shape[1])).astype(np.float32) * np.linspace(
        0.1, 3, w.shape[1], dtype=np.float32)
    out = []
    for arr, xp in ((w, None), (jnp.asarray(w), jnp)):
        o = llm.flatten(arr, cfg, xp=xp)
        imp = llm.importance_update(llm.importance_init(w.shape[1], xp=xp), x if xp is None else jnp.asarray(x), xp=xp)
        weights = llm.importance_weights(imp, cfg, w.shape, xp=xp)[0] if cfg.search == "imatrix" else None
        state = llm.update(cfg, llm.init(cfg, qparam_shape=tuple(o.shape[1:-1]), xp=xp), o, weights=weights, xp=xp)
        q = llm.qparams(cfg, state, xp=xp)
        shape = (1, *o.shape[1:-1], 1)
        zp = None if cfg.symmetric else xp_reshape(q.zero_point.astype("float32"), shape)
        fq = llm.fake_quantize(o, xp_reshape(q.scale, shape), zp, cfg, global_scale=q.global_scale, xp=xp)
        m = llm.init(moving, qparam_shape=tuple(o.shape[1:-1]), xp=xp)
        for k in (1.0, -2.5):
            m = llm.update(moving, m, o * k, xp=xp)
        out.append([q.scale, q.zero_point, state.min_vals, state.max_vals, fq, m.min_vals, m.max_vals, imp.sum]
                   + ([q.global_scale] if q.global_scale is not None else []))
    for i, (a, b) in enumerate(zip(*out)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (i, int((a != b).sum()))


def xp_reshape(a, shape):
    return a.reshape(shape)


def test_global_scale_rounds_as_torch():
    """``448 * 6 / amax`` as torch (and so compressed-tensors) computes a number over a tensor: the reciprocal,
    then the product (a single division differs in about a quarter of the values); NumPy and JAX give those bits."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    amax = (np.random.default_rng(7).random(4096) * 10 + 1e-3).astype(np.float32)
    want = (2688.0 / torch.from_numpy(amax)).numpy()
    for a, xp in ((amax, None), (jnp.asarray(amax), jnp), (torch.from_numpy(amax), None)):
        got = np.stack([np.asarray(llm.global_scale(-a[i:i + 1], a[i:i + 1], xp=xp))[0] for i in range(0, 4096, 64)])
        assert np.array_equal(got, want[::64])
