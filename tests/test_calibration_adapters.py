"""Calibration observers (Horizon ``observer_v2``: KL, MSE, percentile, mix) of
``observers_core.adapters.torch``, ``.jax`` (under ``jax.jit``), ``.cupy`` (skipped without a GPU) and the
generic array ones (numpy, array_api_strict).

Oracles, written plainly here: each observer's ``min_val``/``max_val`` after several batches equal a
reference that runs the core's searches (``kl_threshold``, ``mse_threshold``, ``percentile_range``) on
the same ``|x|`` histograms, clips the finite range of the batch to ``[-amax, amax]`` and applies the
moving average ``m + c * (b - m)`` in float32; per tensor also with the float64 NumPy references of
``_calibration_reference`` in place of the core searches. MixObserver's pick is checked against each
candidate's fake-quantization error computed directly in float64. Qparams against
``observers_core.calculate_qparams`` (itself bit-exact with torch).
"""

from __future__ import annotations

import copy
import io
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import array_api_compat.numpy as npx  # noqa: E402
from array_api_compat import array_namespace  # noqa: E402
import observers_core as oc  # noqa: E402
from _calibration_reference import (  # noqa: E402
    kl_threshold_ref,
    mse_errors_ref,
    percentile_range_ref,
    pick_ref,
)
from conftest import TraceDelta, _cupy_available, adapter_backend, to_numpy, to_torch  # noqa: E402
from observers_core.adapters import _array_calibration as generic  # noqa: E402  (no public numpy module)
from observers_core.adapters import torch as tobs  # noqa: E402
from observers_core.families import calibration as generic_family  # noqa: E402
from observers_core.families.calibration import positive_levels  # noqa: E402

try:  # bfloat16 for numpy (installed with jax)
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

CLASSES = ("KLObserver", "MSEObserver", "PercentileObserver", "MixObserver")
CANDIDATES = ("minmax", "percentile", "kl", "mse")  # MixObserver's documented order (ties: first)
F32_EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors: one intra-op thread never waits on a busy 2-core machine (results do not depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------- backends


def make_backend(name: str) -> SimpleNamespace:
    return adapter_backend(name, generic)


def make(be, cls_name: str, **kwargs):
    return getattr(be.mod, cls_name)(**kwargs, **be.kw)


def stats(obs):
    """``(min_val, max_val)`` of any backend's observer as float32 numpy arrays."""
    if isinstance(obs, torch.nn.Module):
        return obs.min_val.numpy(), obs.max_val.numpy()
    sd = obs.state_dict()
    return to_numpy(sd["min_val"]), to_numpy(sd["max_val"])


def assert_same(ours, expected, what: str = "") -> None:
    """Same shape and values (NaN == NaN), bit for bit."""
    ours, expected = np.asarray(to_numpy(ours), np.float64), np.asarray(expected, np.float64)
    assert ours.shape == expected.shape, f"{what}: shape {ours.shape} != {expected.shape}"
    assert np.all((ours == expected) | (np.isnan(ours) & np.isnan(expected))), f"{what}: {ours} != {expected}"


def observe(obs, batches, asarray):
    for b in batches:
        x = asarray(b)
        assert obs(x) is x
    return obs


# -------------------------------------------------------------------------------------- data


def batches_of(seed: int, n: int = 4, shape=(3, 6, 40)) -> list[np.ndarray]:
    """float32 batches, channels along axis 1 with different distributions: normal, Laplace with
    outliers, one-sided (ReLU-like), uniform, sparse values, all zeros."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = np.empty(shape, np.float32)
        m = shape[0] * shape[2]
        cols = [
            rng.standard_normal(m) * 2.0,
            rng.laplace(size=m) * np.where(rng.random(m) < 0.02, 40.0, 1.0),
            np.maximum(rng.standard_normal(m), 0.0) * 5.0,
            rng.uniform(-0.3, 0.7, m),
            rng.choice(rng.standard_normal(5) * 3, m),
            np.zeros(m),
        ]
        for c in range(shape[1]):
            x[:, c, :] = cols[c % len(cols)].reshape(shape[0], shape[2])
        out.append(x)
    return out


def rows_of(x: np.ndarray, axis: int | None) -> np.ndarray:
    """``x`` as float64 rows: one row per tensor, or one per channel along ``axis``."""
    if axis is None:
        return np.asarray(x, np.float64).reshape(1, -1)
    return np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(x.shape[axis], -1)


def finite_range(x: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The finite min/max per row (``+inf``/``-inf`` where a row has none), float32."""
    lo, hi = [], []
    for r in rows_of(x, axis):
        r = r[np.isfinite(r)]
        lo.append(r.min() if r.size else np.inf)
        hi.append(r.max() if r.size else -np.inf)
    lo, hi = np.array(lo, np.float32), np.array(hi, np.float32)
    return (lo[0], hi[0]) if axis is None else (lo, hi)


# ------------------------------------------------------------------------------------ reference

CONFIGS = {  # name -> (class, kwargs, reference facts: levels |x| reaches, MSE reference quantizer)
    "percentile-tensor": ("PercentileObserver", dict(percentile=99.0, bins=256, averaging_constant=0.3), {}),
    "percentile-channel": ("PercentileObserver", dict(percentile=95.0, bins=512, averaging_constant=0.5, ch_axis=1,
                                                     qscheme="per_channel_symmetric"), {}),
    "mse-tensor": ("MSEObserver", dict(stride=3, averaging_constant=0.25, bins=256), {}),
    "mse-channel-affine": ("MSEObserver", dict(averaging_constant=0.1, ch_axis=1, dtype="quint8",
                                               qscheme="per_channel_affine", bins=512), {}),
    "kl-tensor-interval": ("KLObserver", dict(bins=256, update_interval=2, averaging_constant=0.4), {}),
    "kl-channel": ("KLObserver", dict(averaging_constant=0.2, ch_axis=1, qscheme="per_channel_symmetric"), {}),
    "kl-tensor-affine": ("KLObserver", dict(bins=512, dtype="quint8", qscheme="per_tensor_affine", averaging_constant=0.5), {}),
    "mix-tensor": ("MixObserver", dict(averaging_constant=0.3, bins=256, percentile=99.0), {}),
    "mix-channel": ("MixObserver", dict(averaging_constant=0.3, ch_axis=1, qscheme="per_channel_symmetric", bins=256,
                                        percentile=97.0, stride=2), {}),
}
# Quantizer facts, from the dtype tables (torch): (quant_min, quant_max, symmetric, symmetric zero point)
QUANTIZERS = {
    ("qint8", True): (-128, 127, True, 0),
    ("quint8", True): (0, 255, True, 128),
    ("quint8", False): (0, 255, False, 0),
}


def settings(kwargs: dict) -> SimpleNamespace:
    """The observer's configuration with Horizon's defaults filled in."""
    dtype = kwargs.get("dtype", "qint8")
    qscheme = kwargs.get("qscheme", "per_tensor_symmetric")
    symmetric = "symmetric" in qscheme
    qmin, qmax, sym, zp = QUANTIZERS[(dtype, symmetric)]
    ch_axis = kwargs.get("ch_axis", -1)
    return SimpleNamespace(
        spec=oc.quant_spec(dtype, qscheme), axis=None if ch_axis == -1 else ch_axis,
        c=kwargs.get("averaging_constant", 0.01), bins=kwargs.get("bins", 512), percentile=kwargs.get("percentile", 99.99),
        stride=kwargs.get("stride", 1), interval=kwargs.get("update_interval", 1),
        quant_min=qmin, quant_max=qmax, symmetric=sym, zero_point_sym=zp,
        levels=(qmax - zp + 1) if sym else (qmax - qmin + 1),  # the levels |x| in [0, amax] reaches
    )


def abs_hist(x: np.ndarray, s, hist=None):
    """The core's histogram of ``|x|`` (fresh, or ``hist`` updated)."""
    if hist is None:
        hist = oc.calib_histogram_init(bins=s.bins, num_channels=None if s.axis is None else x.shape[s.axis], xp=npx)
    return oc.calib_histogram_update(hist, x, axis=s.axis, absolute=True)


def core_amax(method: str, hist, s) -> np.ndarray:
    e = oc.calib_histogram_edges(hist)
    if method == "kl":
        return oc.kl_threshold(hist.counts, e, num_levels=s.levels)
    if method == "mse":
        return oc.mse_threshold(hist.counts, e, spec=s.spec, stride=s.stride)
    if method == "percentile":
        return oc.percentile_range(hist.counts, e, percentile=s.percentile)[1]
    return np.full(hist.max_val.shape, np.inf, np.float32)  # minmax: no clipping


def float64_amax(method: str, hist, s) -> np.ndarray:
    """Per tensor: the float64 one-candidate-at-a-time references of ``_calibration_reference``."""
    counts = np.asarray(hist.counts, np.float64)
    e = np.asarray(oc.calib_histogram_edges(hist), np.float64)
    if method == "kl":
        return np.float32(kl_threshold_ref(counts, e, num_levels=s.levels, start_bin=s.levels))
    if method == "mse":
        ref = mse_errors_ref(counts, e, quant_min=s.quant_min, quant_max=s.quant_max, symmetric=s.symmetric,
                             zero_point_sym=s.zero_point_sym, start_bin=min(128, s.bins - 1), stride=s.stride)
        vals = [v for *_, v in ref]
        return np.float32(ref[pick_ref(vals, tol=1e-9 * min(vals), ties="first")][1])
    if method == "percentile":
        return np.float32(percentile_range_ref(counts, e, percentile=s.percentile)[1])
    raise AssertionError(method)


def clip(lo, hi, amax):
    seen = lo <= hi
    amax = np.asarray(amax, np.float32)
    return np.where(seen, np.clip(lo, -amax, amax), lo), np.where(seen, np.clip(hi, -amax, amax), hi)


def moving_average(state, lo, hi, c: float):
    """``m + c * (b - m)`` in float32; an entry that has seen nothing takes ``b``; an unseen ``b`` changes nothing."""
    m, big_m = state
    with np.errstate(invalid="ignore"):
        fresh = (m == np.inf) & (big_m == -np.inf)
        new_m = np.where(fresh, lo, m + c * (lo - m))
        new_big = np.where(fresh, hi, big_m + c * (hi - big_m))
    seen = lo <= hi
    return np.where(seen, new_m, m).astype(np.float32), np.where(seen, new_big, big_m).astype(np.float32)


def direct_errors(x: np.ndarray, lo, hi, s) -> np.ndarray:
    """Each candidate's mean squared fake-quantization error of ``x``'s finite values, float64, written
    plainly: ``q = clip(round(x / scale) + z, Q_min, Q_max)``, ``(q - z) * scale``. Shape (rows, K)."""
    rows = rows_of(x, s.axis)
    lo, hi = np.reshape(lo, (rows.shape[0], -1)), np.reshape(hi, (rows.shape[0], -1))
    scale, zp = oc.calculate_qparams(lo, hi, s.spec)
    out = np.zeros(lo.shape)
    for r in range(rows.shape[0]):
        v = rows[r][np.isfinite(rows[r])]
        for k in range(lo.shape[1]):
            sc, z = float(scale[r, k]), float(zp[r, k])
            q = np.clip(np.round(v / sc) + z, s.quant_min, s.quant_max)
            out[r, k] = np.mean(((q - z) * sc - v) ** 2) if v.size else 0.0
    return out


def reference(cls_name: str, kwargs: dict, batches, amax_fn=core_amax):
    """``(min_val, max_val)`` after each batch (None before KL's first update) and MixObserver's picks."""
    s = settings(kwargs)
    shape = () if s.axis is None else (batches[0].shape[s.axis],)
    state = (np.full(shape, np.inf, np.float32), np.full(shape, -np.inf, np.float32))
    method = {"KLObserver": "kl", "MSEObserver": "mse", "PercentileObserver": "percentile", "MixObserver": "mix"}[cls_name]
    hist, seen, updated = None, None, False
    history, picks = [], []
    for step, x in enumerate(batches, start=1):
        lo, hi = finite_range(x, s.axis)
        if method == "kl":
            hist = abs_hist(x, s, hist)
            seen = (lo, hi) if seen is None else (np.minimum(seen[0], lo), np.maximum(seen[1], hi))
            if step % s.interval == 0:
                state = moving_average(state, *clip(*seen, amax_fn("kl", hist, s)), s.c)
                updated = True
            history.append(state if updated else None)
            continue
        h = abs_hist(x, s)
        if method == "mix":
            ranges = [clip(lo, hi, amax_fn(m, h, s)) for m in CANDIDATES]
            lo_k, hi_k = np.stack([r[0] for r in ranges], -1), np.stack([r[1] for r in ranges], -1)
            errs = direct_errors(x, lo_k, hi_k, s)
            pick = np.array([int(np.flatnonzero(e <= e.min() * (1 + 1e-12))[0]) for e in errs])
            picks.append((pick, errs))
            lo_k, hi_k = lo_k.reshape(-1, len(CANDIDATES)), hi_k.reshape(-1, len(CANDIDATES))
            lo = lo_k[np.arange(len(pick)), pick].reshape(np.shape(lo))
            hi = hi_k[np.arange(len(pick)), pick].reshape(np.shape(hi))
        else:
            lo, hi = clip(lo, hi, amax_fn(method, h, s))
        state = moving_average(state, lo, hi, s.c)
        history.append(state)
    return history, picks


def check_against_reference(be, config: str, batches) -> None:
    cls_name, kwargs, _ = CONFIGS[config]
    obs = make(be, cls_name, **kwargs)
    history, picks = reference(cls_name, kwargs, batches)
    s = settings(kwargs)
    for i, b in enumerate(batches):
        observe(obs, [b], be.asarray)
        if history[i] is None:  # KL before its first update: nothing averaged yet
            assert obs.min_val.shape in ((), (0,)) and np.all(np.isinf(stats(obs)[0]))
            continue
        assert_same(stats(obs)[0], history[i][0], f"{config} min_val after batch {i}")
        assert_same(stats(obs)[1], history[i][1], f"{config} max_val after batch {i}")
        if picks:
            assert_same(obs.last_choice, picks[i][0].reshape(np.shape(obs.last_choice)), f"{config} pick {i}")
    scale, zero_point = obs.calculate_qparams()
    want = oc.calculate_qparams(*history[-1], s.spec)
    assert_same(scale, want.scale, "scale")
    assert_same(zero_point, want.zero_point, "zero_point")


# ------------------------------------------------------------------ equal to the reference, every backend


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("backend", ["numpy", "torch", "cupy"])
def test_matches_reference_after_several_batches(backend, config):
    """min/max after every batch, MixObserver's picks and the final qparams equal the reference."""
    check_against_reference(make_backend(backend), config, batches_of(1))


@pytest.mark.parametrize("config", ["percentile-channel", "kl-tensor-interval", "mix-channel"])
def test_matches_reference_on_array_api_strict(config):
    check_against_reference(make_backend("array_api_strict"), config, batches_of(2, n=3))


@pytest.mark.parametrize("config", ["percentile-tensor", "mse-tensor", "kl-tensor-interval", "kl-tensor-affine"])
def test_per_tensor_matches_float64_references(config):
    """Per tensor, the core searches replaced by the float64 one-candidate-at-a-time references give the
    same states (the observers use the thresholds those searches define)."""
    cls_name, kwargs, _ = CONFIGS[config]
    batches = batches_of(3)
    obs = observe(make(make_backend("numpy"), cls_name, **kwargs), batches, np.asarray)
    history, _ = reference(cls_name, kwargs, batches, amax_fn=float64_amax)
    assert_same(stats(obs)[0], history[-1][0], "min_val")
    assert_same(stats(obs)[1], history[-1][1], "max_val")


@pytest.mark.parametrize("config", ["mix-tensor", "mix-channel"])
def test_mix_picks_the_least_measured_error(config):
    """Each batch's pick is the candidate of least directly measured error (float64), per channel, and
    the data makes several candidates win (so the check can fail)."""
    cls_name, kwargs, _ = CONFIGS[config]
    batches = batches_of(4, n=5)
    _, picks = reference(cls_name, kwargs, batches)
    winners = set()
    for be in (make_backend("numpy"), make_backend("torch")):
        obs = make(be, cls_name, **kwargs)
        for b, (want, errs) in zip(batches, picks):
            observe(obs, [b], be.asarray)
            got = to_numpy(obs.last_choice).reshape(-1)
            assert np.all(errs[np.arange(len(got)), got] <= errs.min(axis=1) * (1 + 1e-9)), (got, errs)
            assert np.array_equal(got, want)
            winners.update(got.tolist())
    assert len(winners) >= 2, winners


# --------------------------------------------------------------------------------- JAX (jit)

# One compiled configuration each (about 5-15 s apiece on a busy 2-core CPU): the per-batch methods and
# KL per tensor, Mix (every search, the error measurement and the pick) per channel.
JAX_CASES = [
    ("PercentileObserver", dict(percentile=99.0, bins=256, averaging_constant=0.3)),
    ("MSEObserver", dict(stride=3, averaging_constant=0.25, bins=256)),
    ("KLObserver", dict(bins=256, update_interval=2, averaging_constant=0.4)),
    ("MixObserver", dict(averaging_constant=0.3, ch_axis=1, qscheme="per_channel_symmetric", bins=256, percentile=97.0,
                         stride=2)),
]


@pytest.mark.parametrize("cls_name, kwargs", JAX_CASES, ids=lambda v: v if isinstance(v, str) else str(v.get("ch_axis", -1)))
def test_jax_jit_equals_numpy_and_traces_once(cls_name, kwargs):
    """Under jax.jit: the same states, picks and qparams as the numpy observer; every step traces once
    per input shape (later batches and a second observer reuse it) and nothing syncs with the host."""
    jax = pytest.importorskip("jax")
    be = make_backend("jax")
    from observers_core.families import calibration as family

    steps = (family.kl_accumulate, family.kl_update) if cls_name == "KLObserver" else (family.batch_update,)
    batches = batches_of(5, n=4)
    ours = make(be, cls_name, **kwargs)
    ref = observe(make(make_backend("numpy"), cls_name, **kwargs), batches, np.asarray)
    observe(ours, batches[:2], be.asarray)  # KL: the first update runs at batch 2
    traces = [TraceDelta(be.mod.TRACES, step) for step in steps]
    with jax.transfer_guard_device_to_host("disallow"):
        observe(ours, batches[2:], be.asarray)
        observe(make(be, cls_name, **kwargs), batches, be.asarray)
    assert [t.count for t in traces] == [0] * len(steps)  # later batches and another observer: no new trace
    for a, b in zip(stats(ours), stats(ref)):
        assert_same(a, b, cls_name)
    if cls_name == "MixObserver":
        assert_same(ours.last_choice, ref.last_choice, "last_choice")
    for a, b in zip(ours.calculate_qparams(), ref.calculate_qparams()):
        assert_same(a, b, "qparams")


def test_jax_pure_update_composes_with_scan():
    """``obs.update``/``obs.qparams`` inside ``jax.jit`` + ``lax.scan`` give the stateful result (KL too: its
    state holds the accumulator and the batch count); the stateful call refuses tracers."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from observers_core.adapters import jax as jobs

    cls_name, kwargs = JAX_CASES[0]
    xs = jnp.asarray(np.stack(batches_of(5, n=4)))
    obs = observe(getattr(jobs, cls_name)(**kwargs), list(xs), lambda a: a)

    @jax.jit
    def calibrate(xs):
        state, _ = jax.lax.scan(lambda s, x: (obs.update(s, x), None), obs.init_state(), xs)
        return state, obs.qparams(state)

    state, qp = calibrate(xs)
    for a, b in zip((*state, *qp), (*obs.state, *obs.calculate_qparams())):
        assert_same(a, to_numpy(b))
    kl = jobs.KLObserver(bins=256, update_interval=2)  # KL's accumulator and batch count are in its state
    kl_state, _ = jax.jit(lambda xs: jax.lax.scan(lambda s, x: (kl.update(s, x), None), kl.update(None, xs[0]),
                                                  xs[1:]))(xs)
    kl_ref = observe(jobs.KLObserver(bins=256, update_interval=2), list(xs), lambda a: a)
    for a, b in zip((*kl_state.range, *kl.qparams(kl_state)), (*kl_ref.state, *kl_ref.calculate_qparams())):
        assert_same(a, to_numpy(b))
    assert int(kl_state.steps) == len(xs)
    with pytest.raises(TypeError, match="cannot run inside jit"):
        jax.jit(lambda x: obs(x))(xs[0])


# --------------------------------------------------------------------------- KL update interval


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_kl_runs_every_update_interval_and_warns_before(backend):
    """With update_interval=3: no KL before batch 3 (qparams warn, naming the interval, and are the
    defaults), KL at batch 3, nothing new at batches 4-5, while the histogram keeps accumulating."""
    be = make_backend(backend)
    kwargs = dict(bins=256, update_interval=3, averaging_constant=0.5)
    batches = batches_of(6, n=5)
    obs = make(be, "KLObserver", **kwargs)
    history, _ = reference("KLObserver", kwargs, batches)
    for i, b in enumerate(batches):
        observe(obs, [b], be.asarray)
        if i < 2:
            with pytest.warns(UserWarning, match=r"not run a KL update yet.*update_interval=3.*seen %d" % (i + 1)):
                scale, zero_point = obs.calculate_qparams()
            assert to_numpy(scale).tolist() == [1.0] and to_numpy(zero_point).tolist() == [0]
        else:
            assert_same(stats(obs)[0], history[i][0])
            assert_same(stats(obs)[1], history[i][1])
    assert_same(history[4][0], history[2][0])  # batches 4 and 5: no KL update (next at 6)
    assert int(to_numpy(obs.accumulator.hist.counts).sum()) == sum(b.size for b in batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obs.calculate_qparams()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_kl_pending_warning_only_before_the_first_kl_update(backend):
    """After a KL update that saw no finite value (an all-NaN batch) the qparams are the defaults without
    the "no KL update yet" warning (torch said so after the update had run); a loaded
    range is used before any batch."""
    be = make_backend(backend)
    obs = make(be, "KLObserver", bins=256, update_interval=1)
    observe(obs, [np.full((4, 5), np.nan, np.float32)], be.asarray)
    assert obs.num_steps == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scale, zero_point = obs.calculate_qparams()
    assert not any("KL update" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert to_numpy(scale).tolist() == [1.0] and to_numpy(zero_point).tolist() == [0]
    loaded = make(be, "KLObserver", bins=256, update_interval=4)
    loaded.load_state_dict(make(be, "MSEObserver", bins=256).state_dict() | {
        "min_val": be.asarray(np.float32(-2.0)), "max_val": be.asarray(np.float32(3.0))})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scale, _ = loaded.calculate_qparams()
    assert np.allclose(to_numpy(scale), 3.0 / 127.5)


def test_torch_kl_pending_warning_after_lowering_update_interval():
    """A batch with update_interval=3, then update_interval=1: no KL update has run yet, and the warning
    says so (it compared the batch count with the new interval and gave the base's generic warning)."""
    kl = tobs.KLObserver(bins=256, update_interval=3)
    kl(torch.from_numpy(batches_of(16, n=1)[0]))
    kl.update_interval = 1
    with pytest.warns(UserWarning, match="not run a KL update yet"):
        kl.calculate_qparams()
    kl(torch.from_numpy(batches_of(17, n=1)[0]))  # the next batch runs it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kl.calculate_qparams()
    kl.reset_min_max_vals()
    with pytest.warns(UserWarning, match="not run a KL update yet"):
        kl.calculate_qparams()


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_per_channel_array_state_dicts_load_into_fresh_torch_observers(backend, cls_name):
    """A per-channel state dict of the NumPy or JAX observers loads into a torch observer that has seen
    nothing (its buffers are empty until then): "size mismatch" before, as the buffers were fitted to the
    saved channel count only for tensor entries."""
    be = make_backend(backend)
    kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=1, qscheme="per_channel_symmetric")
    obs = make(be, cls_name, **kwargs)
    observe(obs, batches_of(18, n=2), be.asarray)
    fresh = getattr(tobs, cls_name)(**kwargs)
    fresh.load_state_dict(obs.state_dict())
    for u, v in zip(stats(fresh), stats(obs)):
        assert_same(u, v, "loaded into torch")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("cls_name, extra", [(c, {}) for c in CLASSES] + [("KLObserver", {"update_interval": 3})])
def test_another_channel_count_is_refused_and_changes_nothing(backend, cls_name, extra):
    """Per channel, a batch with another channel count raises ValueError naming both counts (KL before its
    first update: the accumulated histogram's), and the state (KL: the accumulator too) is untouched;
    after reset_min_max_vals() the new count is accepted."""
    be = make_backend(backend)
    obs = make(be, cls_name, ch_axis=1, qscheme="per_channel_symmetric", bins=256, **extra)
    rng = np.random.default_rng(9)
    observe(obs, [rng.standard_normal((8, 4)).astype(np.float32)], be.asarray)
    before = [to_numpy(v).copy() for v in stats(obs)]
    acc = None if cls_name != "KLObserver" else to_numpy(obs.accumulator.hist.counts).copy()
    with pytest.raises(ValueError, match=r"5 channels along ch_axis=1 but the observer holds 4; call reset_min_max_vals"):
        observe(obs, [rng.standard_normal((8, 5)).astype(np.float32)], be.asarray)
    for was, now in zip(before, stats(obs)):
        np.testing.assert_array_equal(was, to_numpy(now))
    if acc is not None:
        np.testing.assert_array_equal(acc, to_numpy(obs.accumulator.hist.counts))
    obs.reset_min_max_vals()
    observe(obs, [rng.standard_normal((8, 5)).astype(np.float32)], be.asarray)
    if extra:  # no KL update yet: the accumulator holds the new channels
        assert to_numpy(obs.accumulator.hist.counts).shape[0] == 5
    else:
        assert to_numpy(stats(obs)[0]).shape == (5,)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_kl_load_of_another_channel_count_empties_the_accumulator(backend):
    """A per-channel KLObserver that accumulated 3 channels loads a 4-channel range (as torch.ao's per-channel
    observers load another channel count): its accumulated histogram could take no batch the loaded range
    takes (it refused every later batch, 3 or 4 channels), so the load empties it, on every framework; the
    observer then goes on as a fresh one that loaded the same state dict (the batch count aside)."""
    be = make_backend(backend)
    kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=1, qscheme="per_channel_symmetric")
    rng = np.random.default_rng(21)
    three = observe(make(be, "KLObserver", **kwargs), [rng.standard_normal((6, 3, 5)).astype(np.float32)], be.asarray)
    source = observe(make(be, "KLObserver", **kwargs), [rng.standard_normal((6, 4, 5)).astype(np.float32)], be.asarray)
    fresh = make(be, "KLObserver", **kwargs)
    later = [rng.standard_normal((6, 4, 5)).astype(np.float32) * 2 for _ in range(2)]
    for obs in (three, fresh):
        obs.load_state_dict(source.state_dict())
        assert obs.accumulator is None
        observe(obs, later, be.asarray)
    for u, v in zip(stats(three), stats(fresh)):
        assert_same(u, v, "after the load")
    same = observe(make(be, "KLObserver", **kwargs), [np.ones((2, 4, 5), np.float32)], be.asarray)
    acc_before = same.accumulator
    same.load_state_dict(source.state_dict())  # the same channel count: the accumulator stays
    assert same.accumulator is not None
    np.testing.assert_array_equal(to_numpy(same.accumulator.hist.counts), to_numpy(acc_before.hist.counts))


# -------------------------------------------------------------------------- special values, dtypes

BACKENDS = ["numpy", "torch", "cupy"]


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_are_skipped(backend, cls_name):
    """Per tensor, a batch with NaN/+-Inf gives the state of its finite values; a batch with no finite
    value changes nothing (per-batch methods) and an all-NaN channel keeps its range."""
    be = make_backend(backend)
    kwargs = dict(bins=256, averaging_constant=0.5)
    x0, x1 = batches_of(7, n=2)
    dirty = x1.copy()
    dirty[0, 0, :3] = [np.nan, np.inf, -np.inf]
    a = observe(make(be, cls_name, **kwargs), [x0, dirty], be.asarray)
    b = observe(make(be, cls_name, **kwargs), [x0.reshape(-1), x1.reshape(-1)[3:]], be.asarray)
    for u, v in zip(stats(a), stats(b)):
        assert_same(u, v, "finite values only")
    if cls_name != "KLObserver":  # KL counts the batch as a step (and re-averages the same range)
        before = stats(a)
        observe(a, [np.full((4, 5), np.nan, np.float32)], be.asarray)
        for u, v in zip(stats(a), before):
            assert_same(u, v, "all-NaN batch")
    per_channel = make(be, cls_name, ch_axis=1, qscheme="per_channel_symmetric", **kwargs)
    x2 = x1.copy()
    x2[:, 2, :] = np.nan
    observe(per_channel, [x0, x2], be.asarray)
    history, _ = reference(cls_name, dict(ch_axis=1, qscheme="per_channel_symmetric", **kwargs), [x0, x2])
    assert_same(stats(per_channel)[0], history[-1][0])
    assert_same(stats(per_channel)[1], history[-1][1])


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_and_huge_ranges(backend, cls_name):
    """All zeros: range (0, 0), scale eps. Data times 2**100 (exact in float32): every threshold, range
    and average scales exactly, qparams stay finite."""
    be = make_backend(backend)
    kwargs = dict(bins=256, averaging_constant=0.5)
    zeros = observe(make(be, cls_name, **kwargs), [np.zeros((4, 8), np.float32)] * 2, be.asarray)
    assert_same(stats(zeros)[0], np.float32(0))
    assert_same(stats(zeros)[1], np.float32(0))
    assert to_numpy(zeros.calculate_qparams()[0]).tolist() == [np.float32(F32_EPS)]
    batches = batches_of(8, n=3)
    small = observe(make(be, cls_name, **kwargs), batches, be.asarray)
    huge = observe(make(be, cls_name, **kwargs), [b * np.float32(2.0**100) for b in batches], be.asarray)
    for u, v in zip(stats(huge), stats(small)):
        assert_same(u, np.asarray(v) * np.float32(2.0**100))
    scale = to_numpy(huge.calculate_qparams()[0])
    assert np.all(np.isfinite(scale)) and np.all(scale > 1e28)


INPUT_DTYPES = ["float16", "bfloat16", "int8", "int32", "float64"]


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_input_dtypes_equal_their_float32_values(backend, dtype):
    """float16/bfloat16/integer/float64 inputs give the state of the same values in float32 (every
    value is exact in float32: the float64 values are float32 values)."""
    be = make_backend(backend)
    if dtype == "bfloat16" and backend == "numpy" and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    if dtype == "bfloat16" and backend == "cupy":
        pytest.skip("cupy has no bfloat16")
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(9)
    raw = [(rng.standard_normal((5, 6, 7)) * 30).astype(np.float32).astype(np_dtype) for _ in range(2)]
    as_f32 = [r.astype(np.float32) for r in raw]
    for cls_name in CLASSES:
        kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=1, qscheme="per_channel_symmetric")
        a = observe(make(be, cls_name, **kwargs), raw, be.asarray)
        b = observe(make(be, cls_name, **kwargs), as_f32, be.asarray)
        for u, v in zip(stats(a), stats(b)):
            assert_same(u, v, f"{cls_name} {dtype}")


@pytest.mark.parametrize("backend", BACKENDS + ["jax"])
def test_empty_inputs_are_no_ops(backend):
    be = make_backend(backend)
    for cls_name in CLASSES:
        obs = make(be, cls_name, bins=256)
        x = be.asarray(np.zeros((0, 3), np.float32))
        assert obs(x) is x
        assert np.all(np.isinf(stats(obs)[0]))
        if cls_name == "KLObserver":
            assert obs.num_steps == 0


# ---------------------------------------------------------------------------------- bad arguments

BAD_ARGUMENTS = [
    ("PercentileObserver", dict(percentile=0.0), ValueError, "percentile=0.0 is out of range"),
    ("PercentileObserver", dict(percentile=100.5), ValueError, "percentile=100.5"),
    ("MixObserver", dict(percentile=-1), ValueError, "percentile=-1"),
    ("PercentileObserver", dict(percentile="99"), TypeError, "percentile must be a float"),
    ("KLObserver", dict(bins=100), ValueError, "bins=100 is smaller than the 128 quantized levels"),
    ("PercentileObserver", dict(bins=200, dtype="quint8", qscheme="per_tensor_affine"), ValueError,
     "bins=200 is smaller than the 256"),
    ("MSEObserver", dict(bins=1.5), TypeError, "bins must be an int"),
    ("MSEObserver", dict(stride=0), ValueError, "stride=0 is out of range"),
    ("KLObserver", dict(update_interval=0), ValueError, "update_interval=0 is out of range"),
    ("MSEObserver", dict(averaging_constant=-0.1), ValueError, "averaging_constant=-0.1 is out of range"),
    ("KLObserver", dict(averaging_constant=1.5), ValueError, "averaging_constant=1.5"),
    ("MixObserver", dict(averaging_constant=None), TypeError, "averaging_constant must be a float"),
    ("MixObserver", dict(ch_axis=-2), ValueError, "ch_axis=-2 is not allowed"),
    ("MSEObserver", dict(ch_axis=0), ValueError, "ch_axis=0 observes per channel and needs a per_channel"),
    ("MSEObserver", dict(qscheme="per_channel_symmetric"), ValueError, "ch_axis=-1 observes per tensor"),
    ("KLObserver", dict(ch_axis=1.0), TypeError, "ch_axis must be an int"),
    ("MixObserver", dict(dtype="qint4"), ValueError, "dtype='qint4' is not a supported"),
    ("KLObserver", dict(quant_min=1, quant_max=127), ValueError, "must include 0"),
    ("MSEObserver", dict(is_sync_quantize="yes"), TypeError, "is_sync_quantize must be a bool"),
    ("PercentileObserver", dict(is_sync_quantize=1), TypeError, "is_sync_quantize must be a bool"),
    # another class's keyword: not in Horizon's signature, and it was silently ignored (every backend)
    ("KLObserver", dict(percentile=99.0), TypeError, "KLObserver.. got an unexpected keyword argument 'percentile'"),
    ("KLObserver", dict(stride=2), TypeError, "KLObserver.. got an unexpected keyword argument 'stride'"),
    ("MSEObserver", dict(percentile=99.0), TypeError, "MSEObserver.. got an unexpected keyword argument 'percentile'"),
    ("MSEObserver", dict(update_interval=2), TypeError, "unexpected keyword argument 'update_interval'"),
    ("PercentileObserver", dict(stride=2), TypeError, "PercentileObserver.. got an unexpected keyword argument 'stride'"),
    ("PercentileObserver", dict(update_interval=2), TypeError, "unexpected keyword argument 'update_interval'"),
    ("MixObserver", dict(update_interval=2), TypeError, "MixObserver.. got an unexpected keyword argument"),
    # torch's base arguments the searches would not follow (torch took them: ignore_nonfinite=False was ignored)
    ("KLObserver", dict(ignore_nonfinite=False), TypeError, "unexpected keyword argument 'ignore_nonfinite'"),
    ("MSEObserver", dict(reduce_range=True), TypeError, "unexpected keyword argument 'reduce_range'"),
]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_calibration_observers_say_they_skip_nonfinite_values(backend):
    """``ignore_nonfinite`` is ``True`` on the four classes, which always skip NaN/Inf (it read ``False``, the
    base's default): a NaN/Inf batch leaves the range of the finite values."""
    be = make_backend(backend)
    finite = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    with_nonfinite = finite.copy()
    with_nonfinite[:, :3] = [np.nan, np.inf, -np.inf]
    for name in ("KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"):
        obs, reference = make(be, name), make(be, name)
        assert obs.ignore_nonfinite is True, name
        obs(be.asarray(with_nonfinite))
        reference(be.asarray(finite[:, 3:]))
        for got, want in zip(stats(obs), stats(reference)):
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_torch_takes_is_dynamic_false_as_torchs_flows_pass_it():
    """torch's FakeQuantize and torchao's prepare_pt2e pass ``is_dynamic``: False is taken, True refused naming it
    (it reached torch's base, whose flag makes a convert quantize dynamically); the array observers take neither."""
    assert tobs.KLObserver(is_dynamic=False).is_dynamic is False
    for name in ("KLObserver", "MixObserver"):
        with pytest.raises(NotImplementedError, match=f"is_dynamic=True is not supported by {name}"):
            getattr(tobs, name)(is_dynamic=True)
        with pytest.raises(TypeError, match="is_dynamic must be a bool"):
            getattr(tobs, name)(is_dynamic=1)
        with pytest.raises(TypeError, match="unexpected keyword argument 'is_dynamic'"):
            make(make_backend("numpy"), name, is_dynamic=False)


@pytest.mark.parametrize("cls_name, kwargs, error, match", BAD_ARGUMENTS)
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_bad_arguments_name_the_argument(backend, cls_name, kwargs, error, match):
    with pytest.raises(error, match=match):
        make(make_backend(backend), cls_name, **kwargs)


def test_only_torch_takes_is_sync_quantize():
    """The array observers' stateful call syncs nothing, so the flag is refused there with the ways that
    do sync; the torch observers take it (synced per batch: tests/test_distributed_torch.py)."""
    with pytest.raises(NotImplementedError, match=r"obs.update\(state, x, collective=...\)"):
        make(make_backend("numpy"), "MSEObserver", is_sync_quantize=True)
    assert make(make_backend("torch"), "MSEObserver", is_sync_quantize=True).sync is True


def test_torch_accepts_torch_dtypes_and_qschemes():
    obs = tobs.MixObserver(ch_axis=0, dtype=torch.quint8, qscheme=torch.per_channel_affine, bins=256)
    assert obs.dtype is torch.quint8 and obs.qscheme is torch.per_channel_affine
    assert (obs.quant_min, obs.quant_max, obs.config.levels) == (0, 255, 256)
    with pytest.raises(ValueError, match="dtype=torch.float32 is not a supported"):
        tobs.KLObserver(dtype=torch.float32)


def _torch_level_span(dtype: str, qscheme: str, quant_min, quant_max) -> int | None:
    """The levels ``[0, amax]`` reaches under torch.ao's own qparams: ``MinMaxObserver`` fed ``[0, amax]`` with
    ``amax = (Q_max - Q_min) / 2`` (symmetric scale exactly 1, affine ``(Q_max - Q_min) / amax`` levels per
    unit), then ``clamp(round(x / s) + z, Q_min, Q_max)`` of 0 and amax; ``None`` where torch refuses."""
    try:
        obs = torch.ao.quantization.MinMaxObserver(dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme),
                                                    quant_min=quant_min, quant_max=quant_max)
    except (AssertionError, ValueError, RuntimeError):
        return None
    amax = (obs.quant_max - obs.quant_min) / 2
    obs(torch.tensor([0.0, amax]))
    scale, zero_point = obs.calculate_qparams()
    x = torch.tensor([0.0, amax], dtype=torch.float64)
    q = torch.clamp(torch.round(x / scale.double()) + zero_point.double(), obs.quant_min, obs.quant_max)
    return int(q[1] - q[0]) + 1


@pytest.mark.parametrize("qscheme", ["per_tensor_symmetric", "per_tensor_affine"])
def test_positive_levels_are_the_levels_the_quantizer_reaches(qscheme):
    """``config.levels`` (KL's ``num_levels``, the ``bins >=`` bound) counts the levels torch.ao's quantizer maps
    ``[0, amax]`` to, for every dtype and custom range torch accepts (quint4x2 symmetric: 9 of 16; qint8
    symmetric on [-3, 100]: 53 of 104)."""
    ranges = [(None, None)] + [(lo, hi) for lo in (-128, -127, -100, -3, -1, 0) for hi in (1, 3, 7, 15, 100, 127, 255)]
    checked = 0
    for dtype in ("qint8", "quint8", "quint4x2", "int8", "uint8", "int16"):
        for quant_min, quant_max in ranges:
            expected = _torch_level_span(dtype, qscheme, quant_min, quant_max)
            if expected is None:
                continue
            spec = oc.quant_spec(dtype, qscheme, quant_min=quant_min, quant_max=quant_max)
            assert positive_levels(spec) == expected, (dtype, qscheme, quant_min, quant_max)
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("cls_name", CLASSES)
def test_torch_settable_attributes_take_effect_at_the_next_batch(cls_name):
    """``averaging_constant`` (and KLObserver's ``update_interval``) set after construction, as torch.ao's
    moving averages allow, are used from the next batch on: the observer then runs as one constructed
    with the new values from the same state; bad values raise naming the attribute, nothing changes."""
    batches = batches_of(12, n=4)
    changed = getattr(tobs, cls_name)(bins=256, averaging_constant=0.01)
    changed(torch.from_numpy(batches[0]))
    changed.averaging_constant = 0.75
    reference = getattr(tobs, cls_name)(bins=256, averaging_constant=0.75)
    reference.load_state_dict(changed.state_dict())
    if cls_name == "KLObserver":  # the accumulator too (not in the state dict)
        reference(torch.from_numpy(batches[0]))
        reference.load_state_dict(changed.state_dict())
    for x in batches[1:]:
        changed(torch.from_numpy(x))
        reference(torch.from_numpy(x))
    assert changed.averaging_constant == changed.config.averaging_constant == 0.75
    for u, v in zip(stats(changed), stats(reference)):
        assert_same(u, v, "after averaging_constant was set")
    before = [s.copy() for s in stats(changed)]
    for value, error in ((1.5, ValueError), ("0.5", TypeError), (None, TypeError)):
        with pytest.raises(error, match="averaging_constant"):
            changed.averaging_constant = value
    assert changed.averaging_constant == 0.75
    for u, v in zip(stats(changed), before):
        assert_same(u, v, "after refused values")


@pytest.mark.parametrize("cls_name", CLASSES)
def test_torch_quantizer_attributes_set_after_construction_reach_the_searches(cls_name):
    """torch.ao reads ``quant_min``/``quant_max``/``qscheme``/``dtype`` at each call: set after construction they
    reach the searches too (MSE's quantizer, KL's levels), not only ``calculate_qparams``: the observer then runs
    as one constructed with them from the same state. A setting the configuration cannot take raises at the
    next batch, naming it, with the state untouched."""
    batches = batches_of(14, n=4)
    changed = getattr(tobs, cls_name)(bins=256, averaging_constant=0.5)
    changed(torch.from_numpy(batches[0]))
    changed.quant_min, changed.quant_max = -7, 7
    reference = getattr(tobs, cls_name)(bins=256, averaging_constant=0.5, quant_min=-7, quant_max=7)
    reference.load_state_dict(changed.state_dict())
    if cls_name == "KLObserver":  # the accumulator too (not in the state dict)
        reference(torch.from_numpy(batches[0]))
        reference.load_state_dict(changed.state_dict())
    unchanged = copy.deepcopy(reference)
    unchanged.quant_min, unchanged.quant_max = -128, 127
    for x in batches[1:]:
        for obs in (changed, reference, unchanged):
            obs(torch.from_numpy(x))
    assert changed.config.levels == reference.config.levels == 8
    for u, v in zip(stats(changed), stats(reference)):
        assert_same(u, v, "after quant_min/quant_max were set")
    if cls_name != "PercentileObserver":  # (the percentile does not depend on the quantizer)
        assert any(not np.array_equal(u, v) for u, v in zip(stats(changed), stats(unchanged)))  # it mattered
    before = [s.copy() for s in stats(changed)]
    changed.quant_min, changed.quant_max = -(2**15), 2**15 - 1  # 32768 levels > bins
    with pytest.raises(ValueError, match=r"bins=256 is smaller .* \(set after construction\)"):
        changed(torch.from_numpy(batches[1]))
    changed.quant_min, changed.quant_max = -128, 127
    changed.qscheme = torch.per_channel_symmetric
    with pytest.raises(ValueError, match="qscheme='per_channel_symmetric' .*must stay per tensor"):
        changed(torch.from_numpy(batches[1]))
    for u, v in zip(stats(changed), before):
        assert_same(u, v, "after refused settings")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_loaded_eps_reaches_the_mse_search(backend):
    """A loaded ``eps`` is the MSE candidates' quantizer's ``eps`` too (as ``calculate_qparams``'s): the
    observer then runs as the pure ``batch_update`` with that ``eps``, which differs from the default's."""
    be = make_backend(backend)
    x = batches_of(15, n=1)[0]  # |x| up to ~160: candidate scales amax / 127.5 below 1.3, eps 4 replaces them all
    obs = make(be, "MSEObserver", bins=256, averaging_constant=0.5)
    obs.load_state_dict({"eps": np.array([4.0], np.float32), "min_val": np.array(-1.0, np.float32),
                         "max_val": np.array(1.0, np.float32)})
    obs(be.asarray(x))
    config, _ = generic_family.make_config("MSEObserver", "mse", dtype="qint8", qscheme="per_tensor_symmetric",
                                           quant_min=None, quant_max=None, ch_axis=-1, averaging_constant=0.5, bins=256)
    start = oc.MinMaxState(np.array(-1.0, np.float32), np.array(1.0, np.float32))
    results = []
    for eps in (4.0, oc.quant_spec("qint8").eps):
        cfg = generic_family.with_spec(config, oc.quant_spec("qint8", "per_tensor_symmetric", eps=eps))
        results.append(generic_family.batch_update(start, x, axis=None, config=cfg, xp=npx)[0])
    for u, v in zip(stats(obs), results[0]):
        assert_same(u, np.asarray(v), "with the loaded eps")
    assert obs.config.spec.eps == 4.0
    assert any(not np.array_equal(u, v) for u, v in zip(results[0], results[1]))  # eps mattered


def test_torch_constructor_eps_is_the_searches_eps_and_a_load_checks_only_entries():
    """torch's base takes ``eps=`` (Horizon's signature does not): it is the MSE search's ``eps`` as a loaded one is,
    so an observer that loads another's state continues it exactly; a load checks the entries only, not
    attributes set since (those are checked at the next batch, as before)."""
    x, y = (torch.from_numpy(b) for b in batches_of(16, n=2))
    a = tobs.MSEObserver(bins=256, averaging_constant=0.5, eps=0.05)
    a(x)
    b = tobs.MSEObserver(bins=256, averaging_constant=0.5, eps=0.05)
    b.load_state_dict(a.state_dict())
    a(y)
    b(y)
    assert a.config.spec.eps == b.config.spec.eps == float(np.float32(0.05))
    for u, v in zip(stats(a), stats(b)):
        assert_same(u, v, "constructor eps vs loaded eps")
    c = tobs.MSEObserver(bins=256, averaging_constant=0.5)
    c.dtype = torch.float32  # refused at the next batch, not by a load
    c.load_state_dict(a.state_dict())
    for u, v in zip(stats(c), stats(a)):
        assert_same(u, v, "loaded")
    with pytest.raises(ValueError, match="dtype=torch.float32"):
        c(y)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_range_without_the_symmetric_zero_point_is_refused(backend):
    """A symmetric zero point above ``quant_max`` (uint16's 2**15 with a custom range below it) leaves no level
    for ``|x|``: refused at construction naming the range (the KL search failed at every batch with a message
    naming none); on torch also when set after construction (qint8 observer set to quint8: zero point 128)."""
    for cls_name in CLASSES:
        with pytest.raises(ValueError, match=r"quant_max=1000 put the symmetric zero point 32768 above quant_max"):
            make(make_backend(backend), cls_name, dtype="uint16", quant_min=0, quant_max=1000)
    if backend == "torch":
        obs = tobs.KLObserver(bins=256)
        x = torch.from_numpy(batches_of(17, n=1)[0])
        obs(x)
        before = [s.copy() for s in stats(obs)]
        obs.dtype = torch.quint8
        with pytest.raises(ValueError, match=r"\(set after construction\) put the symmetric zero point 128"):
            obs(x)
        for u, v in zip(stats(obs), before):
            assert_same(u, v, "after the refused batch")


def test_torch_kl_update_interval_set_after_construction():
    kl = tobs.KLObserver(bins=256, update_interval=4)
    kl.update_interval = 1
    x = torch.from_numpy(batches_of(13, n=1)[0])
    kl(x)  # would not have run the KL update with the constructor's interval
    every_batch = tobs.KLObserver(bins=256, update_interval=1)
    every_batch(x)
    assert kl.update_interval == kl.config.update_interval == 1
    assert torch.equal(kl.min_val, every_batch.min_val) and torch.isfinite(kl.min_val)
    for value, error in ((0, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="update_interval"):
            kl.update_interval = value
    assert kl.update_interval == 1


# ------------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("backend", ["numpy", "array_api_strict", "torch", "cupy"])
def test_bad_inputs_raise_and_leave_state_untouched(backend, cls_name):
    be = make_backend(backend)
    obs = make(be, cls_name, ch_axis=1, qscheme="per_channel_symmetric", bins=256, averaging_constant=0.5)
    observe(obs, batches_of(10, n=1), be.asarray)
    before = [s.copy() for s in stats(obs)]
    steps = getattr(obs, "num_steps", None)
    bad = [
        (np.ones((3, 6), bool), TypeError, "real"),
        (np.ones((3, 5, 2), np.float32), ValueError, "channels"),  # another channel count
        (np.ones((6,), np.float32), ValueError, "ch_axis"),  # no axis 1
    ]
    for value, error, match in bad:
        with pytest.raises(error, match=match):
            obs(be.asarray(value))
    with pytest.raises(TypeError):
        obs([1.0, 2.0])
    for u, v in zip(stats(obs), before):
        assert_same(u, v, "state after bad inputs")
    assert getattr(obs, "num_steps", None) == steps


# ------------------------------------------------------------------------------------ state dicts


@pytest.mark.parametrize("ch_axis", [-1, 1])
@pytest.mark.parametrize("cls_name", CLASSES)
def test_torch_state_dict_round_trips(cls_name, ch_axis):
    """state_dict (eps, min_val, max_val; no histogram), torch.save/load into a fresh observer (per
    channel into empty buffers), deepcopy; the loaded observer continues like the original."""
    kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=ch_axis)
    if ch_axis != -1:
        kwargs["qscheme"] = torch.per_channel_symmetric
    batches = batches_of(11, n=3)
    obs = observe(getattr(tobs, cls_name)(**kwargs), batches[:2], to_torch)
    sd = obs.state_dict()
    assert list(sd) == ["eps", "min_val", "max_val"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = getattr(tobs, cls_name)(**kwargs)
    fresh.load_state_dict(torch.load(buf))
    clone = copy.deepcopy(obs)
    for other in (fresh, clone):
        for a, b in zip(stats(other), stats(obs)):
            assert_same(a, b)
        for a, b in zip(other.calculate_qparams(), obs.calculate_qparams()):
            assert_same(a, b)
    observe(clone, batches[2:], to_torch)
    observe(obs, batches[2:], to_torch)
    for a, b in zip(stats(clone), stats(obs)):
        assert_same(a, b, "deepcopy continues identically")
    if cls_name != "KLObserver":  # per-batch methods depend on the saved range alone
        observe(fresh, batches[2:], to_torch)
        for a, b in zip(stats(fresh), stats(obs)):
            assert_same(a, b, "loaded observer continues identically")


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax"])
def test_loaded_ranges_must_be_finite_or_unseen(backend):
    """The averaged range is finite (``+inf``/``-inf`` before any value); a state dict with a one-sided
    infinity or NaN is refused with the state untouched (it loaded, and every later average was NaN)."""
    be = make_backend(backend)
    kwargs = dict(bins=256, ch_axis=1, qscheme="per_channel_symmetric")
    obs = make(be, "MSEObserver", **kwargs)
    observe(obs, batches_of(14, n=1), be.asarray)
    before = [s.copy() for s in stats(obs)]
    good = obs.state_dict()
    for lo, hi in ((-1.0, np.inf), (-np.inf, 1.0), (np.nan, 1.0), (-1.0, np.nan)):
        bad = dict(good, min_val=be.asarray(np.array([-2, lo, -2, -2, -2, -2], np.float32)),
                   max_val=be.asarray(np.array([2, hi, 2, 2, 2, 2], np.float32)))
        with pytest.raises(ValueError, match="not finite at \\[1\\]"):
            obs.load_state_dict(bad)
        for u, v in zip(stats(obs), before):
            assert_same(u, v, "after a refused load")
    unseen = dict(good, min_val=be.asarray(np.array([-2, np.inf, -2, -2, -2, -2], np.float32)),
                  max_val=be.asarray(np.array([2, -np.inf, 2, 2, 2, 2], np.float32)))
    obs.load_state_dict(unseen)  # a channel that has seen nothing
    observe(obs, batches_of(15, n=1), be.asarray)
    assert np.all(np.isfinite(stats(obs)[0])) and np.all(np.isfinite(stats(obs)[1]))


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("backend", ["numpy", "array_api_strict", "jax", "cupy"])
def test_array_state_dict_round_trips_and_loads_torch(backend, cls_name):
    be = make_backend(backend)
    kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=1, qscheme="per_channel_symmetric")
    batches = batches_of(12, n=2)
    torch_obs = observe(getattr(tobs, cls_name)(**kwargs), batches, to_torch)
    for source in (make(be, cls_name, **kwargs).state_dict(), torch_obs.state_dict()):
        target = make(be, cls_name, **kwargs)
        target.load_state_dict(source)
        want = [np.asarray(to_numpy(source[k]), np.float32) for k in ("min_val", "max_val")]
        if want[0].shape == (0,):  # never updated: nothing to compare but the emptiness
            assert target.state is None
            continue
        for a, b in zip(stats(target), want):
            assert_same(a, b)
        assert_same(target.calculate_qparams()[0], torch_obs.calculate_qparams()[0])
    with pytest.raises(ValueError, match="min_val > max_val"):
        target.load_state_dict({"eps": np.array([F32_EPS], np.float32), "min_val": np.ones(6, np.float32),
                                "max_val": np.zeros(6, np.float32)})
    assert_same(stats(target)[0], want[0], "state kept after a bad state dict")


# ---------------------------------------------------------------------------- torch module behaviour


def test_torch_observer_module_behaviour():
    """torch's ObserverBase subclass: with_args/QConfig, FakeQuantize (ch_axis=-1 is also FakeQuantize's
    per-tensor convention), repr, reset, the KL histogram in non-persistent buffers."""
    from torch.ao.quantization import FakeQuantize, QConfig
    from torch.ao.quantization.observer import ObserverBase as TorchObserverBase

    for cls_name in CLASSES:
        cls = getattr(tobs, cls_name)
        assert issubclass(cls, TorchObserverBase) and cls_name in tobs.__all__
        assert isinstance(cls.with_args(averaging_constant=0.5)(), cls)
    assert tobs.MinMaxObserver.__module__ == "observers_core.adapters.torch"  # torch's name, not Horizon's
    qconfig = QConfig(activation=tobs.KLObserver.with_args(bins=256),
                      weight=tobs.MixObserver.with_args(ch_axis=0, qscheme=torch.per_channel_symmetric, bins=256))
    assert isinstance(qconfig.activation(), tobs.KLObserver)
    fq = FakeQuantize(observer=tobs.MixObserver, quant_min=-128, quant_max=127, dtype=torch.qint8,
                      qscheme=torch.per_tensor_symmetric, bins=256)
    x = to_torch(batches_of(13, n=1)[0])
    y = fq(x)
    scale, zero_point = fq.activation_post_process.calculate_qparams()
    want = torch.fake_quantize_per_tensor_affine(x, float(scale), int(zero_point), -128, 127)
    assert torch.equal(y, want)
    kl = tobs.KLObserver(bins=256, ch_axis=1, qscheme=torch.per_channel_symmetric)
    kl(x)
    assert "update_interval=1" in repr(kl) and "num_steps=1" in repr(kl)
    assert kl.hist_counts.shape == (6, 256) and "hist_counts" not in kl.state_dict()
    kl.reset_min_max_vals()
    assert kl.min_val.numel() == 0 and kl.hist_counts.numel() == 0 and kl.num_steps == 0
    with pytest.warns(UserWarning, match="not run a KL update yet"):
        kl.calculate_qparams()


@pytest.mark.gpu("torch-cuda")
def test_torch_cuda_buffers_and_qparams_match_cpu():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    batches = batches_of(14, n=3)
    for cls_name in CLASSES:
        kwargs = dict(bins=256, averaging_constant=0.5, ch_axis=1, qscheme=torch.per_channel_symmetric)
        cpu = observe(getattr(tobs, cls_name)(**kwargs), batches, to_torch)
        gpu = getattr(tobs, cls_name)(**kwargs).cuda()
        observe(gpu, batches, lambda a: to_torch(a).cuda())
        assert gpu.min_val.is_cuda
        for a, b in zip((*stats(cpu),), (gpu.min_val.cpu().numpy(), gpu.max_val.cpu().numpy())):
            assert_same(b, a, cls_name)


@pytest.mark.gpu("cupy")
def test_cupy_state_stays_on_the_inputs_gpu():
    if not _cupy_available():
        pytest.skip("cupy or a CUDA device is not available here")
    import cupy
    from observers_core.adapters import cupy as cobs

    device = cupy.cuda.Device(cupy.cuda.runtime.getDeviceCount() - 1)
    with device:
        x = cupy.asarray(batches_of(15, n=1)[0])
    for cls_name in CLASSES:
        obs = getattr(cobs, cls_name)(bins=256, ch_axis=1, qscheme="per_channel_symmetric")
        assert obs(x) is x
        for arr in (*obs.state, *obs.calculate_qparams()):
            assert isinstance(arr, cupy.ndarray) and arr.device == device
    with pytest.raises(TypeError, match="cupy.ndarray"):
        obs(np.ones((3, 6), np.float32))


@pytest.mark.parametrize("backend", ["torch", "torch-cuda", "cupy"])
def test_per_channel_results_do_not_depend_on_the_chunk_bound(backend, monkeypatch):
    """The searches evaluate channels in chunks that bound their temporaries, with a larger bound on an eager
    GPU (torch CUDA, CuPy: fewer launches). Every calibration observer per channel gives the same state and
    qparams, bit for bit, with its backend's bound as with one channel per chunk."""
    from observers_core import _calibration

    if backend == "torch-cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    if backend == "cupy":
        if not _cupy_available():
            pytest.skip("cupy or a CUDA device is not available here")
        import cupy
        from observers_core.adapters import cupy as module

        asarray, qscheme = cupy.asarray, "per_channel_symmetric"
    else:
        module, qscheme = tobs, torch.per_channel_symmetric
        asarray = (lambda a: to_torch(a).cuda()) if backend == "torch-cuda" else to_torch
    probe = asarray(np.zeros(1, np.float32))
    bound = _calibration._chunk_elements(probe, array_namespace(probe))
    assert bound == (_calibration._CHUNK_ELEMENTS if backend == "torch" else _calibration._DEVICE_CHUNK_ELEMENTS)
    batches = batches_of(16, n=3)
    for cls_name in CLASSES:
        results = []
        for chunk in (None, 1):
            if chunk is not None:
                monkeypatch.setattr(_calibration, "_CHUNK_ELEMENTS", chunk)
                monkeypatch.setattr(_calibration, "_DEVICE_CHUNK_ELEMENTS", chunk)
            obs = getattr(module, cls_name)(bins=256, ch_axis=1, qscheme=qscheme)
            obs = observe(obs.cuda() if backend == "torch-cuda" else obs, batches, asarray)
            state = obs.state_dict()
            results.append([to_numpy(a) for a in (state["min_val"], state["max_val"], *obs.calculate_qparams())])
            monkeypatch.undo()
        for ours, expected in zip(*results):
            assert_same(ours, expected, cls_name)


@pytest.mark.parametrize("per_channel", [False, True])
def test_kl_pure_steps_and_a_collective(per_channel):
    """KLObserver's pure steps: ``accumulate`` then ``kl_step`` every ``update_interval`` batches is the
    stateful observer, bit for bit; with a collective (three members, threads) every member holds the
    accumulator and KL range of one observer that saw the concatenated batches (an empty shard takes part)."""
    from _thread_collective import run_members

    kwargs = dict(ch_axis=1, qscheme="per_channel_symmetric") if per_channel else {}
    make_obs = lambda: generic.KLObserver(bins=256, update_interval=2, averaging_constant=0.4, **kwargs)  # noqa: E731
    rng = np.random.default_rng(11)
    steps = [[(rng.standard_normal((int(rng.integers(0, 4)), 5)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
              for _ in range(3)] for _ in range(4)]  # fmt: skip
    for shards in steps:
        shards[0] = np.concatenate([shards[0], rng.standard_normal((2, 5)).astype(np.float32)])

    def pure(obs, acc, state, batches, collective=None):
        for i, x in enumerate(batches, start=1):
            acc = obs.accumulate(acc, x, collective=collective)
            if i % obs.update_interval == 0:
                state = obs.kl_step(state, acc)
        return acc, state

    def member(rank, collective):
        obs = make_obs()
        return pure(obs, obs.init_accumulator(5 if per_channel else None), None, [s[rank] for s in steps], collective)

    stateful = make_obs()
    for shards in steps:
        stateful(np.concatenate(shards))
    alone = make_obs()
    acc, state = pure(alone, None, None, [np.concatenate(s) for s in steps])
    for got_acc, got_state in [(acc, state), *run_members(3, member)]:
        for a, b in zip([*got_acc.hist, *got_acc.seen, *got_state], [*stateful.accumulator.hist,
                                                                        *stateful.accumulator.seen, *stateful.state]):
            np.testing.assert_array_equal(a, b)
    kl_state = None  # the one-step pure path: update(state, x) over KLState (accumulator and count inside)
    for shards in steps:
        kl_state = alone.update(kl_state, np.concatenate(shards))
    for a, b in zip([*kl_state.acc.hist, *kl_state.acc.seen, *kl_state.range], [*acc.hist, *acc.seen, *state]):
        np.testing.assert_array_equal(a, b)
