"""NVFP4 codes and scales against torchao 0.18 and ModelOpt 0.47; ModelOpt's MseCalibrator and its
126-candidate E4M3 sweep reproduced (observers_core.families.nvfp4), bit for bit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
pytest.importorskip("modelopt")

import array_api_compat.numpy as anp  # noqa: E402
import array_api_compat.torch as tnp  # noqa: E402

from observers_core.families import llm, nvfp4  # noqa: E402


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().float().view(torch.int32).numpy()


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(32, 128, generator=g)
    outlier = base.clone()
    outlier[3, 17] = 300.0
    zero_block = base.clone()
    zero_block[5, 16:32] = 0.0
    zero_block[7, :] = 0.0
    return {"random": base, "outlier": outlier, "zero_block": zero_block, "tiny": base * 1e-6,
            "large": base * 1e4, "heavy": torch.randn(32, 128, generator=g) ** 5}


INPUTS = _inputs()


# --------------------------------------------------------------------------------------------- torchao


@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("two_level", [True, False])
def test_torchao_nvfp4_quantize(name, two_level):
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    x = INPUTS[name]
    amax = torch.max(torch.abs(x))
    p = per_tensor_amax_to_scale(amax) if two_level else None
    theirs_scale, packed = nvfp4_quantize(x, 16, p)
    theirs_values = f4_unpacked_to_f32(unpack_uint4(packed)).reshape(x.shape)
    ours_p = nvfp4.per_tensor_scale(amax, xp=tnp) if two_level else None
    if two_level:
        assert np.array_equal(_bits(ours_p), _bits(p))
    for xp, arr, pp in ((tnp, x, ours_p), (anp, x.numpy(), None if ours_p is None else ours_p.numpy())):
        s8, values = nvfp4.torchao_quantize(arr, pp, xp=xp)
        assert np.array_equal(_bits(torch.as_tensor(np.asarray(s8))), _bits(theirs_scale.float())), xp
        assert np.array_equal(_bits(torch.as_tensor(np.asarray(values))), _bits(theirs_values)), xp
    codes = nvfp4.e2m1_codes(values, xp=anp)
    assert np.array_equal(codes[:, 0::2] | (codes[:, 1::2] << 4), packed.numpy())


def _nonfinite() -> torch.Tensor:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    x[0, 3], x[1, 20], x[3, 5] = float("nan"), float("inf"), -float("inf")
    x[2, :16] = 0.0
    return x


@pytest.mark.parametrize("two_level", [True, False])
def test_torchao_nonfinite(two_level):
    """NaN/Inf weights: torchao's block scales (NaN for a NaN block, 448 for an Inf block) are ours; its E2M1
    cast has no NaN handling (bit arithmetic on the NaN's bits), ours keeps NaN: compared on finite values."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

    x = _nonfinite()
    p = torch.tensor(3.0 / 2688) if two_level else None
    theirs_scale, packed = nvfp4_quantize(x, 16, p)
    theirs_values = f4_unpacked_to_f32(unpack_uint4(packed)).reshape(x.shape)
    s8, values = nvfp4.torchao_quantize(x, p, xp=tnp)
    assert np.array_equal(_bits(s8), _bits(theirs_scale.float()))
    finite = ~torch.isnan(values)
    assert bool(torch.isnan(values[0, :16]).all()) and bool(finite[1:].all())
    assert torch.equal(values[finite], theirs_values[finite])


@pytest.mark.parametrize("given_p", [True, False])
def test_modelopt_nonfinite(given_p):
    """NaN/Inf weights: ModelOpt's scales (NaN everywhere when amax is NaN) and codes (NaN -> +6) are ours."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    x = _nonfinite()
    p = torch.tensor(3.0 / 2688) if given_p else None
    qt, scale, _ = NVFP4QTensor.quantize(x.clone(), 16, weights_scaling_factor_2=p)
    s8, values, _ = nvfp4.modelopt_quantize(x, p, xp=tnp)
    assert np.array_equal(_bits(s8), _bits(scale.float()))
    codes = nvfp4.e2m1_codes(values, xp=tnp)
    assert torch.equal(codes[:, 0::2] | (codes[:, 1::2] << 4), qt._quantized_data)


# --------------------------------------------------------------------------------------------- ModelOpt


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_modelopt_nvfp4_qtensor(name):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    x = INPUTS[name]
    qt, scale, wsf2 = NVFP4QTensor.quantize(x.clone(), 16)
    for xp, arr in ((tnp, x), (anp, x.numpy())):
        s8, values, p = nvfp4.modelopt_quantize(arr, xp=xp)
        assert np.array_equal(_bits(torch.as_tensor(np.asarray(p)).reshape(())), _bits(wsf2.reshape(())))
        assert np.array_equal(_bits(torch.as_tensor(np.asarray(s8))), _bits(scale.float()))
        codes = np.asarray(nvfp4.e2m1_codes(values, xp=xp))
        assert np.array_equal(codes[:, 0::2] | (codes[:, 1::2] << 4), qt._quantized_data.numpy())


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_modelopt_static_block_scales(name):
    from modelopt.torch.kernels.quantization.gemm.fp4_kernel import compute_fp4_scales

    x = INPUTS[name]
    amax = x.abs().reshape(32, 8, 16).amax(-1)
    for gamax in (amax.max(), amax.max() * 0.5, torch.tensor(1e-9), torch.tensor(0.0)):
        theirs = compute_fp4_scales(amax, gamax)
        ours = nvfp4.modelopt_block_scales(amax, gamax, xp=tnp)
        assert np.array_equal(_bits(ours), _bits(theirs))
        ours_np = nvfp4.modelopt_block_scales(amax.numpy(), gamax.numpy(), xp=anp)
        assert np.array_equal(_bits(torch.as_tensor(ours_np)), _bits(theirs))


_TRITON_SCRIPT = textwrap.dedent("""
    import sys, types, torch, triton
    import triton.language as tl  # noqa: F401  (must be visible to the jit'd function)
    import modelopt.torch.kernels.quantization.common.nvfp4_quant as nq
    from modelopt.torch.kernels.quantization.gemm import fp4_kernel as fk


    @triton.jit
    def _isnan(x):
        return x != x


    nq.libdevice = types.SimpleNamespace(isnan=_isnan)  # the interpreter has no CUDA libdevice; same predicate
    x = torch.load(sys.argv[1]); scale = torch.load(sys.argv[2])
    y = torch.empty_like(x)
    fk.static_blockwise_fp4_fake_quant_kernel[(scale.numel(),)](
        x.view(-1), y.view(-1), scale, scale.numel(), x.shape[-1], OUT_DTYPE=fk._torch_dtype_to_tl(torch.float32))
    torch.save(y, sys.argv[3])
""")


@pytest.mark.slow
def test_modelopt_triton_fake_quantize_interpreted(tmp_path):
    """ModelOpt's Triton kernel (interpreted on CPU in a subprocess; its CUDA ``libdevice.isnan`` replaced by
    ``x != x``) against modelopt_fake_quantize, with ties, NaN/Inf values and zero/NaN/Inf scales."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -0.75, -2.5, -5.0, 0.0, -0.0,
                         float("nan"), float("inf")])
    x = torch.cat([ties[None, :], -ties[None, :], torch.randn(6, 16) * 3])
    scale = torch.tensor([1.0, 1.0, 0.0, float("nan"), float("inf"), 0.37, 2.0**-9, 448.0])
    paths = [tmp_path / n for n in ("x.pt", "s.pt", "y.pt")]
    torch.save(x, paths[0])
    torch.save(scale, paths[1])
    script = tmp_path / "anchor.py"  # triton.jit needs its source in a file
    script.write_text(_TRITON_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(script), *map(str, paths)], check=True, env=env,
                   capture_output=True, timeout=300)
    theirs = torch.load(paths[2])
    ours = nvfp4.modelopt_fake_quantize(x, scale, xp=tnp)
    assert np.array_equal(_bits(ours), _bits(theirs))


# ----------------------------------------------------------------------- compressed-tensors vs the others


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_compressed_tensors_against_torchao_and_modelopt(name):
    """The llm family (compressed-tensors' NVFP4: ``e4m3(G * bamax / 6)``, ``G = 2688 / amax``; values
    ``e2m1(x / (s8 / G))``) against torchao and ModelOpt, which round the same quantities with other float32
    operations: E4M3 block-scale codes and E2M1 codes equal on every block holding a non-zero value; an
    all-zero block's scale is each anchor's floor (compressed-tensors eps 0.125, torchao 2**-6, ModelOpt 1)
    and its values are 0 everywhere; ``1 / G`` is ``P = amax / 2688`` or one ulp off."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from observers_core._mx import MX_ELEMENTS, round_to_element

    x = INPUTS[name]
    cfg = llm.Config(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                     scale_dtype="float8_e4m3fn")
    obs = llm.flatten(x, cfg, xp=tnp)
    state = llm.update(cfg, llm.init(cfg, qparam_shape=tuple(obs.shape[1:-1]), xp=tnp), obs, xp=tnp)
    qp = llm.qparams(cfg, state, xp=tnp)
    ct, gs = qp.scale, qp.global_scale
    ct_values = round_to_element(torch.clamp(obs / (ct / gs)[None, ..., None], -6.0, 6.0),
                                 MX_ELEMENTS["fp4_e2m1"], tnp).reshape(x.shape)
    amax = torch.max(torch.abs(x))
    p = per_tensor_amax_to_scale(amax)
    # 1 / (2688 / amax) is P rounded twice: equal or one float32 ulp apart (here: equal but for "large")
    assert abs(int(_bits(1.0 / gs)[0]) - int(_bits(p.reshape(1))[0])) <= 1
    ta, packed = nvfp4_quantize(x, 16, p)
    qt, mo, _ = NVFP4QTensor.quantize(x.clone(), 16)
    nonzero = x.reshape(32, 8, 16).abs().amax(-1) > 0
    for theirs in (ta.float(), mo.float()):
        assert torch.equal(ct[nonzero], theirs[nonzero])
    assert set(ct[~nonzero].tolist()) <= {0.125}
    assert set(ta.float()[~nonzero].tolist()) <= {2.0**-6}
    assert set(mo.float()[~nonzero].tolist()) <= {1.0}
    for data in (packed, qt._quantized_data):
        theirs_values = f4_unpacked_to_f32(unpack_uint4(data)).reshape(x.shape)
        assert torch.equal(ct_values, theirs_values)  # -0.0 == 0.0: zero blocks' signs aside


# -------------------------------------------------------------------------------------- MseCalibrator


def _int8_quant(x, amax):
    s = amax / 127.0
    return torch.round(torch.clamp(x / s, -127.0, 127.0)) * s


def _fp8_quant(x, amax):
    from modelopt.torch.quantization.tensor_quant import scaled_e4m3_impl

    return scaled_e4m3_impl(x, amax)


def _modelopt_mse(batches, amax, axis, quant, **kw):
    from modelopt.torch.quantization.calib import MseCalibrator

    cal = MseCalibrator(amax=amax.clone(), axis=axis, quant_func=quant, **kw)
    for b in batches:
        cal.collect(b)
    losses = torch.stack(cal._losses_sum)
    return cal.compute_amax(), losses


@pytest.mark.parametrize("quant", [_int8_quant, _fp8_quant], ids=["int8", "fp8"])
@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("kw", [{}, pytest.param({"step_size": 0.05, "start_multiplier": 0.5, "stop_multiplier": 1.5},
                                                marks=pytest.mark.slow)])
def test_mse_calibrator(quant, axis, kw):
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(16, 64, generator=g) * (1 + i) for i in range(4)]
    batches[2][0, 0] = 40.0
    x0 = batches[0]
    amax = x0.abs().amax() if axis is None else x0.abs().amax(dim=1, keepdim=True)
    theirs_amax, theirs_losses = _modelopt_mse(batches, amax, axis, quant, **kw)
    cfg = nvfp4.MseConfig(axis=axis, **kw)
    m = nvfp4.mse_multipliers(cfg, xp=tnp)
    kept = () if axis is None else (16,)
    state = nvfp4.mse_init(m.shape[0], kept, xp=tnp)
    per_batch = [nvfp4.mse_losses(b, amax, m, quant, cfg, xp=tnp) for b in batches]
    for losses in per_batch:
        state = nvfp4.mse_update(state, losses, xp=tnp)
    assert np.array_equal(_bits(state.loss_sum), _bits(theirs_losses))
    ours = nvfp4.mse_amax(state, amax, m, xp=tnp)
    assert ours.shape == theirs_amax.shape and np.array_equal(_bits(ours), _bits(theirs_amax))
    # shards in any grouping merge to the same exact sums; the float32 sum keeps ModelOpt's bits when
    # the last shard is one batch
    exact = nvfp4.mse_amax(state, amax, m, exact=True, xp=tnp)
    for split in ([0, 1], [0, 2], [0, 3], [0, 1, 3], [0, 2, 3]):
        shards = []
        for a, b in zip(split, split[1:] + [len(batches)]):
            s = nvfp4.mse_init(m.shape[0], kept, xp=tnp)
            for losses in per_batch[a:b]:
                s = nvfp4.mse_update(s, losses, xp=tnp)
            shards.append(s)
        merged = shards[0]
        for s in shards[1:]:
            merged = nvfp4.mse_merge(merged, s)
        assert torch.equal(merged.exact, state.exact) or torch.equal(
            nvfp4.exact_value(merged.exact, xp=tnp), nvfp4.exact_value(state.exact, xp=tnp))
        assert torch.equal(nvfp4.mse_amax(merged, amax, m, exact=True, xp=tnp), exact)
        ends = split[1:] + [len(batches)]
        if all(b - a == 1 for a, b in zip(split[1:], ends[1:])):  # every later shard one batch
            assert np.array_equal(_bits(merged.loss_sum), _bits(theirs_losses))


def test_mse_exact_sum_is_the_real_sum():
    from fractions import Fraction

    rng = np.random.default_rng(2)
    vals = [(rng.random(5) ** rng.integers(1, 40, 5) * 10.0 ** rng.integers(-30, 30, 5)).astype(np.float32)
            for _ in range(40)]
    bins = None
    for v in vals:
        bins = nvfp4.exact_add(bins, v, xp=anp)
    want = [float(sum(Fraction(float(v[i])) for v in vals)) for i in range(5)]
    assert list(nvfp4.exact_value(bins, xp=anp)) == want


def test_mse_bad_input():
    cfg = nvfp4.MseConfig()
    m = nvfp4.mse_multipliers(cfg, xp=tnp)
    state = nvfp4.mse_init(m.shape[0], xp=tnp)
    with pytest.raises(ValueError, match="state has no batches"):
        nvfp4.mse_amax(state, torch.tensor(1.0), m, xp=tnp)
    with pytest.raises(ValueError, match="x is empty"):
        nvfp4.mse_losses(torch.zeros(0), torch.tensor(1.0), m, _int8_quant, cfg, xp=tnp)
    with pytest.raises(ValueError, match="losses has shape"):
        nvfp4.mse_update(state, torch.zeros(3), xp=tnp)
    with pytest.raises(ValueError, match="step_size"):
        nvfp4.MseConfig(step_size=0.0)
    with pytest.raises(ValueError, match="stop_multiplier"):
        nvfp4.MseConfig(start_multiplier=2.0, stop_multiplier=1.0)
    with pytest.raises(TypeError, match="axis"):
        nvfp4.MseConfig(axis=[0])
    with pytest.raises(TypeError, match="step_size"):
        nvfp4.MseConfig(step_size="0.1")


def test_mse_nan_loss_is_chosen_first_like_torch_argmin():
    amax = torch.tensor(2.0)
    m = torch.tensor([0.5, 1.0, 2.0])
    state = nvfp4.mse_init(3, xp=tnp)
    state = nvfp4.mse_update(state, torch.tensor([3.0, float("nan"), 1.0]), xp=tnp)
    for exact in (False, True):
        assert float(nvfp4.mse_amax(state, amax, m, exact=exact, xp=tnp)) == 2.0
        assert int(torch.argmin(state.loss_sum)) == 1


# --------------------------------------------------------------------------------------- the 126 sweep


def _modelopt_static_quant(global_amax):
    from modelopt.torch.kernels.quantization.gemm.fp4_kernel import compute_fp4_scales
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor, e2m1_values

    def quant(x, amax):  # the static fake quantizer's math, E2M1 by ModelOpt's own rounding
        s = compute_fp4_scales(amax.reshape(-1), global_amax).reshape(-1, 1).expand(x.shape[0], 1)
        codes = NVFP4QTensor._cast_fp4((x / s).clone())
        return e2m1_values[codes.long()] * s

    return quant


@pytest.mark.parametrize("name", [n if n in ("random", "zero_block") else
                                  pytest.param(n, marks=pytest.mark.slow) for n in sorted(INPUTS)] + ["nonfinite"])
def test_nvfp4_sweep_matches_modelopt(name):
    """Also NaN/Inf weights (a finite global amax): a block with a NaN or Inf value has NaN/Inf losses for
    every candidate, and both pick the first (``torch.argmin``)."""
    from modelopt.torch.quantization.calib import MseCalibrator, NVFP4MSECalibrator

    full = _nonfinite() if name == "nonfinite" else INPUTS[name]
    x = full.reshape(-1, 16)[:64]
    amax = x.abs().amax(-1)
    gamax = full[torch.isfinite(full)].abs().max()
    cal = NVFP4MSECalibrator(amax=amax, global_amax=gamax, axis=0, quant_func=_modelopt_static_quant(gamax))
    MseCalibrator.collect(cal, x)
    theirs_losses = torch.stack(cal._losses_sum)
    theirs_amax = MseCalibrator.compute_amax(cal)
    cal.reset()
    cal.collect(x)
    assert torch.equal(cal.compute_amax(), theirs_amax)
    for xp, xx, gg in ((tnp, x, gamax), (anp, x.numpy(), gamax.numpy())):
        best, losses = nvfp4.nvfp4_scale_sweep(xx, gg, chunk_elements=4096, xp=xp)
        if xp is tnp:
            assert np.array_equal(_bits(losses), _bits(theirs_losses))
        assert np.array_equal(_bits(torch.as_tensor(np.asarray(best))), _bits(theirs_amax)), xp


def test_scale_candidates_are_modelopts():
    from modelopt.torch.kernels.quantization.gemm._fp8_scale_candidates import fp8_scale_candidates

    theirs = fp8_scale_candidates()
    assert theirs.shape == (126,)
    assert np.array_equal(_bits(torch.as_tensor(nvfp4.e4m3_scale_candidates())), _bits(theirs))
    assert np.array_equal(_bits(nvfp4.e4m3_scale_candidates(xp=tnp)), _bits(theirs))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="block_size=16"):
        nvfp4.torchao_quantize(np.zeros((2, 24), np.float32))
    with pytest.raises(ValueError, match="block_size"):
        nvfp4.block_amax(np.zeros((2, 32), np.float32), 0)
    with pytest.raises(ValueError, match="blocks must be 2-D"):
        nvfp4.nvfp4_scale_sweep(np.zeros(16, np.float32), np.float32(1.0))


def test_nonfinite_and_zero_blocks_follow_modelopt():
    """NaN/Inf weights and all-zero blocks: ModelOpt's static fake quantizer's defined results."""
    x = torch.randn(4, 16)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2] = 0.0
    scale = torch.tensor([0.5, 0.5, 0.0, 1.0])
    y = nvfp4.modelopt_fake_quantize(x, scale, xp=tnp)
    assert float(y[0, 3]) == -3.0  # NaN -> -6 s
    assert float(y[1, 5]) == 3.0  # Inf saturates at 6 s
    assert torch.equal(y[2], torch.zeros(16))
    best, losses = nvfp4.nvfp4_scale_sweep(torch.zeros(2, 16), torch.tensor(1.0), xp=tnp)
    assert torch.equal(losses, torch.zeros(126, 2))
    assert torch.equal(best, torch.full((2,), float(nvfp4.e4m3_scale_candidates(xp=tnp)[0])))


def test_array_api_strict_gives_the_numpy_bits():
    xs = pytest.importorskip("array_api_strict")
    w = INPUTS["outlier"].numpy()
    a = xs.asarray(w)
    for ours, want in (
        (nvfp4.torchao_quantize(a, nvfp4.per_tensor_scale(xs.max(xs.abs(a)), xp=xs), xp=xs),
         nvfp4.torchao_quantize(w, nvfp4.per_tensor_scale(np.abs(w).max()))),
        (nvfp4.modelopt_quantize(a, xp=xs)[:2], nvfp4.modelopt_quantize(w)[:2]),
        (nvfp4.nvfp4_scale_sweep(xs.reshape(a, (-1, 16))[:32, :], xs.max(xs.abs(a)), chunk_elements=5000, xp=xs),
         nvfp4.nvfp4_scale_sweep(w.reshape(-1, 16)[:32], np.abs(w).max())),
    ):
        for o, t in zip(ours, want):
            assert np.array_equal(np.asarray(o).view(np.int32), np.asarray(t).view(np.int32))
