"""Passes over the input in the XLA programs of the JAX observers' jitted updates (issue 36).

A "pass" is a kernel of the compiled program (an instruction of the optimized HLO's entry computation
that is not a view, tuple or parameter) reading ``x`` or a full-size array computed from ``x``: each one
streams the batch through memory once, which is what bounds a min/max update. Counted on the CPU backend
(XLA:CPU fuses differently from XLA:GPU, which also fuses sibling reductions; the counts here are the CPU
ones). docs/gpu-kernels-jax.md has the numbers before and after.

- The min/max family: one pass (one variadic ``lax.reduce`` giving min and max, the masking of
  non-finite values fused in); the old ``jnp.min`` + ``jnp.max`` + ``any(isnan)`` took four.
- The calibration family: range, bin index, histogram scatter (XLA:CPU does not fuse a scatter with the
  computation of its indices); Mix adds its candidate errors. HistogramObserver: range, position, bin
  index, scatter. These are pinned as upper bounds.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from observers_core import quant_spec  # noqa: E402
from observers_core._minmax import minmax_init, reduce_aminmax  # noqa: E402
from observers_core.adapters import jax as jobs  # noqa: E402
from observers_core.families import calibration as calib  # noqa: E402
from observers_core.families import histogram as histogram_family  # noqa: E402
from observers_core.families import minmax as minmax_family  # noqa: E402

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the counts are XLA:CPU's")

SHAPE = (4, 8, 64, 64)  # N = 131072 elements, more than every array the calibration searches build here
N = math.prod(SHAPE)

_SHAPE = re.compile(r"\b(?:pred|[suf]\d+|bf16|f8\w*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_VIEWS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}


def _elements(shape_text: str) -> int:
    """The largest array of an HLO shape (a tuple's largest element)."""
    return max((math.prod(int(d) for d in dims.split(",") if d) for dims in _SHAPE.findall(shape_text)), default=0)


def passes_over_x(hlo: str, n: int, x_param: int) -> list[tuple[str, str]]:
    """``(name, opcode)`` of the entry computation's kernels that read parameter ``x_param`` (``x``, of ``n``
    elements) or an array of at least ``n`` elements computed from it. A while loop or conditional taking
    ``x`` counts once (none of the programs counted here passes ``x`` into one)."""
    entry = hlo[hlo.index("\nENTRY"):].split("\n}", 1)[0].splitlines()[2:]
    tainted, out = set(), []
    for line in entry:
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        if op == "parameter":
            if rest.startswith(f"{x_param})"):
                tainted.add(name)
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        if any(o in tainted for o in operands):
            if _elements(shape) >= n or op in ("tuple", "get-tuple-element"):
                tainted.add(name)
            if op not in _VIEWS:
                out.append((name, op))
    return out


def count_passes(fn, *args) -> int:
    """Passes over the last argument (``x``) in ``jax.jit(fn)``'s optimized HLO on this backend."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    x_param = len(jax.tree_util.tree_leaves(args)) - 1
    return len(passes_over_x(hlo, math.prod(args[-1].shape), x_param))


def stablehlo_reductions(fn, *args) -> int:
    """``stablehlo.reduce`` operations that JAX emits for ``fn`` (before XLA's fusion)."""
    return jax.jit(fn).lower(*args).as_text().count("stablehlo.reduce")


def _config(ch_axis, averaging_constant, ignore_nonfinite):
    qscheme = "per_tensor_affine" if ch_axis is None else "per_channel_affine"
    return minmax_family.Config(quant_spec("quint8", qscheme), averaging_constant, ch_axis, ignore_nonfinite)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
@pytest.mark.parametrize("ignore_nonfinite", [False, True])
@pytest.mark.parametrize("averaging_constant", [None, 0.01], ids=["running", "moving"])
@pytest.mark.parametrize("ch_axis", [None, 1], ids=["per_tensor", "per_channel"])
def test_minmax_update_reads_x_once(ch_axis, averaging_constant, ignore_nonfinite, dtype):
    config = _config(ch_axis, averaging_constant, ignore_nonfinite)
    state = minmax_init(num_channels=None if ch_axis is None else SHAPE[ch_axis], xp=jnp)
    x = jax.ShapeDtypeStruct(SHAPE, jnp.dtype(dtype))

    def step(s, x):
        return minmax_family.update(config, s, x)

    assert stablehlo_reductions(step, state, x) == 1
    assert count_passes(step, state, x) == 1


@pytest.mark.parametrize("cls", ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
                                 "MovingAveragePerChannelMinMaxObserver"])
def test_minmax_observers_pure_update_reads_x_once(cls):
    per_channel = "PerChannel" in cls
    obs = getattr(jobs, cls)(**({"ch_axis": 1} if per_channel else {}))
    state = obs.init_state(SHAPE[1]) if per_channel else obs.init_state()
    assert count_passes(obs.update, state, jax.ShapeDtypeStruct(SHAPE, jnp.float32)) == 1


#: passes of each calibration step on XLA:CPU: the range (1), the bin index of every value (1) and the
#: scatter into the histogram (1: not fused with its indices on CPU); Mix: also its candidate errors
#: (1 + 2 per candidate: each fake-quantization error is a full-size temporary, then summed)
CALIBRATION_PASSES = {"percentile": 3, "mse": 3, "kl": 3, "mix": 13}


@pytest.mark.parametrize("ch_axis", [-1, 1], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("method", sorted(CALIBRATION_PASSES))
def test_calibration_step_passes(method, ch_axis):
    qscheme = "per_tensor_symmetric" if ch_axis < 0 else "per_channel_symmetric"
    config, _ = calib.make_config("test", method, dtype="qint8", qscheme=qscheme, quant_min=None, quant_max=None,
                                  ch_axis=ch_axis, averaging_constant=0.01, bins=2048)
    axis = None if ch_axis < 0 else ch_axis
    channels = None if axis is None else SHAPE[axis]
    x = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    if method == "kl":
        acc = calib.kl_init(channels, bins=config.bins, device=None, xp=jnp)
        passes = count_passes(lambda a, x: calib.kl_accumulate(a, x, axis=axis, xp=jnp), acc, x)
    else:
        state = minmax_init(num_channels=channels, xp=jnp)
        passes = count_passes(lambda s, x: calib.batch_update(s, x, axis=axis, config=config, xp=jnp), state, x)
    assert passes <= CALIBRATION_PASSES[method]  # (fewer is progress: lower the pin)


@pytest.mark.parametrize("ignore_nonfinite", [False, True])
def test_histogram_step_passes(ignore_nonfinite):
    """HistogramObserver's step on XLA:CPU: the range (1), the position of every value on the new range
    (1, float32, full size), its bin index (1) and the scatter (1); it was 7 with the old range."""
    config = histogram_family.Config(ignore_nonfinite=ignore_nonfinite)
    state = histogram_family.init(config, xp=jnp)
    passes = count_passes(lambda s, x: histogram_family.update(config, s, x), state,
                          jax.ShapeDtypeStruct(SHAPE, jnp.float32))
    assert passes <= 4


def _reference(a: np.ndarray, axes, ignore_nonfinite: bool):
    """min/max with NaN propagated (or non-finite values skipped) and a tie of signed zeros giving
    ``(-0.0, +0.0)`` (IEEE 754 minimum/maximum, ``stablehlo.minimum``/``maximum``)."""
    if ignore_nonfinite:
        a_lo, a_hi = np.where(np.isfinite(a), a, np.inf), np.where(np.isfinite(a), a, -np.inf)
    else:
        a_lo = a_hi = a
    with np.errstate(invalid="ignore"):
        lo, hi = np.min(a_lo, axis=axes), np.max(a_hi, axis=axes)
        neg_zero = np.any((a_lo == 0) & np.signbit(a_lo), axis=axes) & (lo == 0)
        pos_zero = np.any((a_hi == 0) & ~np.signbit(a_hi), axis=axes) & (hi == 0)
    return np.where(neg_zero, -0.0, lo).astype(a.dtype), np.where(pos_zero, 0.0, hi).astype(a.dtype)


@pytest.mark.parametrize("ignore_nonfinite", [False, True])
@pytest.mark.parametrize("axes", [None, (0, 2)], ids=["all", "per_channel"])
def test_one_pass_reduction_values(axes, ignore_nonfinite):
    """The variadic reduction on arrays past XLA:CPU's 4096-element NaN hazard: NaN anywhere propagates
    (in its channel only), +/-inf, signed zeros, skipped non-finite values, bit for bit."""
    rng = np.random.default_rng(36)
    cases = []
    for pos in (0, 4097, 2**15 - 1):
        a = rng.standard_normal((64, 4, 128)).astype(np.float32).reshape(-1)
        a[pos] = np.nan
        cases.append(a.reshape(64, 4, 128))
    b = rng.standard_normal((64, 4, 128)).astype(np.float32)
    b[3, 1, 7], b[60, 2, 100] = np.inf, -np.inf
    zeros = np.zeros((64, 4, 128), np.float32)
    zeros[::3] = -0.0
    only_nonfinite = np.full((64, 4, 128), np.nan, np.float32)
    only_nonfinite[:, 0] = np.inf
    cases += [b, zeros, -zeros, only_nonfinite]
    fn = jax.jit(lambda x: reduce_aminmax(x, axes, ignore_nonfinite=ignore_nonfinite, xp=jnp))
    for a in cases:
        lo, hi = fn(jnp.asarray(a))
        want_lo, want_hi = _reference(a, axes, ignore_nonfinite)
        for ours, want in ((lo, want_lo), (hi, want_hi)):
            ours = np.asarray(ours)
            assert ours.dtype == want.dtype and ours.shape == want.shape
            assert np.array_equal(ours, want, equal_nan=True), (ours, want)
            assert (np.signbit(ours) == np.signbit(want))[~np.isnan(want)].all(), (ours, want)
    for dtype in (np.int8, np.uint8, np.int32, np.float16):
        a = rng.integers(-100 if dtype != np.uint8 else 0, 100, size=(64, 4, 128)).astype(dtype)
        lo, hi = fn(jnp.asarray(a))
        want_lo, want_hi = _reference(a, axes, ignore_nonfinite)
        assert np.asarray(lo).dtype == dtype and np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi)
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.bfloat16):  # e4m3fn has no infinity (identity)
        a = rng.standard_normal((64, 4, 128)).astype(dtype)
        lo, hi = fn(jnp.asarray(a))
        want_lo, want_hi = _reference(a.astype(np.float32), axes, ignore_nonfinite)
        assert np.asarray(lo).dtype == dtype
        assert np.array_equal(np.asarray(lo, np.float32), want_lo) and np.array_equal(np.asarray(hi, np.float32), want_hi)
