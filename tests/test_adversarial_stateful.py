"""Adversarial stateful tests (issue 11): every public observer class, on every CPU backend in lock step.

One hypothesis ``RuleBasedStateMachine`` per class holds the same observer on numpy, array_api_strict,
torch and JAX and applies the same step to all of them: adversarial batches (bool/complex/int/float16/
bfloat16/float64 dtypes, a changed channel count or ndim, empty, NaN/Inf, values near float32's maximum,
subnormals, zeros-only and dead channels), state_dict round trips (own, another backend's raw arrays,
torch.ao's, corrupted), ``reset_min_max_vals``, ``copy.deepcopy`` and pickle (continuing with the
copy), and merges: a replica of the same configuration observes a batch and its state_dict is merged
into the observer's with the family's merge function, run in each backend's own arrays (what
``sync_observers`` does across ranks), then loaded back.

After every step:
- only the documented exceptions: ``ValueError``/``TypeError`` for bad input (``RuntimeError`` only
  from ``torch.nn.Module.load_state_dict``'s own key/shape errors), and a rejected call leaves the
  state_dict bit for bit as it was;
- all backends accept or reject the same step, and hold the same state_dict and ``calculate_qparams``
  bits (numpy is the reference; +0 == -0 in min/max states; zero points compare by value, int32 vs
  int64 being documented; JAX's documented differences: float64 statistics are float32 without x64, and
  after a float32 subnormal reached the state, min/max may hold zero where the others hold the
  subnormal, and histogram/calibration/MX/BFP results built on it are not compared);
- the state equals a float64/NumPy shadow model where the class has a simple one (running min/max,
  moving average, the histogram's range, low-bit group statistics); the others rely on cross-backend
  equality.

Deterministic (``derandomize=True``, no example database) and bounded: see ``SETTINGS``. To hunt for
new failures, ``OBSERVERS_CORE_FUZZ_EXAMPLES=60 python -m pytest tests/test_adversarial_stateful.py``
runs each machine on that many random examples of 15 steps (new seeds every run; the fixes of commits
cafdec5 and 8c26445 came from such runs).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("array_api_strict")

from conftest import flushed  # noqa: E402

from _adversarial_strategies import (  # noqa: E402
    BACKENDS,
    CLASSES,
    DTYPES,
    F32_TINY,
    KINDS,
    ClassSpec,
    bits_differ,
    clone,
    make_batch,
    make_observer,
    make_torch_ao,
    state_of,
    to_backend,
    to_host,
)

_FUZZ_EXAMPLES = int(os.environ.get("OBSERVERS_CORE_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=_FUZZ_EXAMPLES or 10,  # about 100 steps per class: JAX compiles per (shape, dtype) dominate
    stateful_step_count=15 if _FUZZ_EXAMPLES else 10,
    deadline=None,
    derandomize=not _FUZZ_EXAMPLES,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

BAD_INPUT = (ValueError, TypeError)


def _disordered(state: dict) -> bool:
    """Whether a min/max state holds ``min_val > max_val`` in an entry that has seen something."""
    lo, hi = np.asarray(state["min_val"]), np.asarray(state["max_val"])
    return bool(np.any((lo > hi) & ~((lo == np.inf) & (hi == -np.inf))))
CORRUPTIONS = ("missing", "extra", "shape", "nan_eps", "neg_eps", "zero_eps", "min_gt_max", "bool", "complex")
#: families whose results are not compared on JAX once a subnormal reached the state (documented FTZ).
_FTZ_SENSITIVE = ("histogram", "calibration")


def merged_state_dict(spec: ClassSpec, a: dict, b: dict) -> dict:
    """``a`` with ``b`` merged in by the family's merge, in ``a``'s own namespace: running min/max and
    low-bit ``minmax_merge``, moving averages and the calibration observers' ranges
    ``moving_average_merge``, the histogram ``histogram_merge``. A side that has seen nothing per channel
    (shape ``(0,)``) gives the other; other differing shapes raise ``ValueError``."""
    from observers_core import HistogramState, MinMaxState, histogram_merge, minmax_merge, moving_average_merge

    if tuple(b["min_val"].shape) == (0,):
        return a
    if tuple(a["min_val"].shape) == (0,):
        return {**a, **{k: b[k] for k in ("min_val", "max_val")}}
    if any(tuple(a[k].shape) != tuple(b[k].shape) for k in a if k != "eps"):
        raise ValueError("the states have different shapes: nothing to merge")
    if spec.family == "histogram":
        merged = histogram_merge(HistogramState(a["histogram"], a["min_val"], a["max_val"]),
                                 HistogramState(b["histogram"], b["min_val"], b["max_val"]))  # fmt: skip
        return {**a, "histogram": merged.histogram, "min_val": merged.min_val, "max_val": merged.max_val}
    exact = spec.family == "lowbit" or spec.name in ("MinMaxObserver", "PerChannelMinMaxObserver")
    merged = (minmax_merge if exact else moving_average_merge)(
        MinMaxState(a["min_val"], a["max_val"]), MinMaxState(b["min_val"], b["max_val"]))
    return {**a, "min_val": merged.min_val, "max_val": merged.max_val}


def _same_bytes(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a.values(), b.values())
    )


def _has_subnormal(a: np.ndarray) -> bool:
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        return False
    v = np.asarray(a, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return bool(np.any((np.abs(v) < F32_TINY) & (v != 0)))


def _native(backend: str, sd: dict) -> dict:
    """A host state_dict as ``backend``'s own arrays (what that backend's ``state_dict`` returns)."""
    return {k: to_backend(backend, np.asarray(v)) for k, v in sd.items()}


def _corrupt(sd: dict, how: str) -> dict | None:
    """``sd`` (host arrays) made invalid in one way; ``None`` where that way does not apply."""
    sd = {k: np.array(v, copy=True) for k, v in sd.items()}
    keys = list(sd)
    main = "min_val" if "min_val" in sd else "scale"
    param = "eps" if "eps" in sd else ("scale" if "scale" in sd else None)
    if how == "missing":
        del sd[keys[-1]]
    elif how == "extra":
        sd["bogus"] = np.zeros(1, np.float32)
    elif how == "shape":  # (a 0-d entry as (2,): a one-element (1,) loads as its value, as in torch.ao)
        sd[main] = np.repeat(sd[main][..., None], 2, axis=-1)
    elif how in ("nan_eps", "neg_eps", "zero_eps"):
        if param is None:
            return None
        sd[param] = np.full_like(sd[param], {"nan_eps": np.nan, "neg_eps": -1.0, "zero_eps": 0.0}[how])
    elif how == "min_gt_max":
        if "min_val" in sd:
            shape = sd["min_val"].shape if sd["min_val"].size else ()
            sd["min_val"], sd["max_val"] = np.ones(shape, np.float32), np.zeros(shape, np.float32)
        else:  # FixedQParamsObserver: a zero point outside [quant_min, quant_max]
            sd["zero_point"] = np.full_like(sd["zero_point"], 1000)
    elif how == "bool":
        sd[main] = np.ones(sd[main].shape, bool)
    elif how == "complex":
        sd[main] = sd[main].astype(np.complex64)
    return sd


_LogList = list  # the steps so far, quoted in failure messages


class ObserverMachine(RuleBasedStateMachine):
    SPEC: ClassSpec

    # -- setup ---------------------------------------------------------------------------------
    @initialize(data=st.data())
    def setup(self, data):
        self.cfg = data.draw(st.sampled_from(self.SPEC.configs), label="config")
        self.obs = {b: make_observer(b, self.SPEC, self.cfg) for b in BACKENDS}
        self.shadow = None if self.SPEC.shadow is None else self.SPEC.shadow(self.cfg)
        self.jax_ftz = False  # a float32 subnormal reached the state (JAX flushes it)
        self.log = _LogList()

    # -- helpers -------------------------------------------------------------------------------
    def _states(self) -> dict:
        return {b: state_of(o) for b, o in self.obs.items()}

    def _attempt(self, fn, allowed, what):
        """Run ``fn`` on every backend: ``{backend: None | exception}``; anything outside ``allowed``
        (per backend) fails here; a rejection must leave the state bit for bit."""
        before = self._states()
        outcome = {}
        for b, o in self.obs.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    fn(b, o)
                    outcome[b] = None
                except allowed(b) as err:
                    outcome[b] = err
            if outcome[b] is not None:
                after = state_of(self.obs[b])
                assert _same_bytes(before[b], after), f"{b}: rejected {what} changed the state: {before[b]} -> {after}"
        return outcome

    def _agree(self, outcome, what):
        accepted = {b for b, e in outcome.items() if e is None}
        assert accepted in (set(), set(BACKENDS)), (
            f"{what}: backends disagree: accepted by {sorted(accepted)}, rejected by "
            + ", ".join(f"{b} ({type(e).__name__}: {e})" for b, e in outcome.items() if e is not None)
        )
        return bool(accepted)

    # -- rules ---------------------------------------------------------------------------------
    @rule(data=st.data())
    def observe(self, data):
        shape = data.draw(st.sampled_from(self.SPEC.shapes(self.cfg)), label="shape")
        kind = data.draw(st.sampled_from(KINDS), label="kind")
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        seed = data.draw(st.integers(0, 2**16), label="seed")
        self._observe(make_batch(kind, seed, shape, dtype, self.SPEC.ch_axis(self.cfg)), (kind, seed, shape, dtype))

    @rule(data=st.data())
    def dead_then_wide(self, data):
        """A state that has seen only zeros (a dead ReLU channel), then a batch far wider than the bin
        count: the re-binning ratio of the calibration histograms overflows there (issue 11, item 2)."""
        shape = data.draw(st.sampled_from([s for s in self.SPEC.shapes(self.cfg) if 0 not in s]), label="shape")
        seed = data.draw(st.integers(0, 2**16), label="seed")
        ch = self.SPEC.ch_axis(self.cfg)
        self._observe(make_batch("zeros", seed, shape, "float32", ch), ("zeros", seed, shape, "float32"))
        self._observe(make_batch("wide", seed, shape, "float32", ch), ("wide", seed, shape, "float32"))

    def _observe(self, batch, desc):
        kind, seed, shape, dtype = desc
        self.log.append(f"observe(make_batch({kind!r}, {seed}, {shape}, {dtype!r}))")

        def call(b, o):
            x = to_backend(b, batch)
            out = o(x)
            assert out is x, f"{b}: the observer did not return its input"

        outcome = self._attempt(call, lambda b: BAD_INPUT, f"observe({kind}, {shape}, {dtype})")
        if self._agree(outcome, f"observe({kind}, {shape}, {dtype})"):
            if _has_subnormal(batch):
                self.jax_ftz = True
            if self.shadow is not None and batch.size:
                self.shadow.update(batch)

    @rule()
    def roundtrip_own(self):
        self.log.append("roundtrip_own()")
        before = self._states()
        self._attempt(lambda b, o: o.load_state_dict(o.state_dict()), lambda b: (), "own state_dict")
        after = self._states()
        for b in BACKENDS:
            assert _same_bytes(before[b], after[b]), f"{b}: loading its own state_dict changed it"

    @rule(src=st.sampled_from(BACKENDS))
    def load_from_backend(self, src):
        """README: state dicts load across backends (raw arrays of another framework)."""
        self.log.append(f"load_from_backend({src!r})")
        sd = self.obs[src].state_dict()
        ref = state_of(self.obs[src])
        outcome = self._attempt(lambda b, o: o.load_state_dict(sd), lambda b: (), f"{src}'s state_dict")
        assert all(e is None for e in outcome.values())
        for b in BACKENDS:
            got = state_of(self.obs[b])
            for k in ref:
                why = bits_differ(ref[k], got[k], narrow=b == "jax")
                assert why is None, f"{b}[{k!r}] after loading {src}'s state_dict: {why}"
        if self.shadow is not None:
            self.shadow.sync(ref)

    @precondition(lambda self: self.SPEC.torch_ao)
    @rule(seed=st.integers(0, 2**16))
    def load_torch_ao(self, seed):
        """A torch.ao observer's state_dict (torch tensors) loads as is on every backend."""
        import torch

        self.log.append(f"load_torch_ao({seed})")
        tao = make_torch_ao(self.SPEC, self.cfg)
        shape = [s for s in self.SPEC.shapes(self.cfg) if len(s) >= 2 and 0 not in s][0]
        tao(torch.from_numpy(make_batch("normal", seed, shape, "float32", self.SPEC.ch_axis(self.cfg))))
        sd = tao.state_dict()
        outcome = self._attempt(lambda b, o: o.load_state_dict(sd), lambda b: (), "torch.ao's state_dict")
        assert all(e is None for e in outcome.values())
        for b in BACKENDS:
            got = state_of(self.obs[b])
            for k, v in sd.items():
                why = bits_differ(v, got[k], state=False)
                assert why is None, f"{b}[{k!r}] after loading torch.ao's state_dict: {why}"
        if self.shadow is not None:
            self.shadow.sync({k: to_host(v) for k, v in sd.items()})

    @rule(how=st.sampled_from(CORRUPTIONS))
    def load_corrupted(self, how):
        """A corrupted state_dict is rejected (ValueError/TypeError; torch's own RuntimeError for
        missing/unexpected keys and shape mismatches) and leaves the state as it was."""
        good = state_of(self.obs["numpy"])
        bad = _corrupt(good, how)
        if bad is None:
            return
        self.log.append(f"load_corrupted({how!r})")

        def allowed(b):
            return BAD_INPUT + (RuntimeError,) if b == "torch" and how in ("missing", "extra", "shape") else BAD_INPUT

        if how == "min_gt_max" and self.SPEC.name.startswith("MovingAverage") and bad["min_val"].ndim == good["min_val"].ndim:
            # the moving averages reach min_val > max_val themselves (torch's formula overflows or cancels)
            # and load it on every backend (tests/test_state_dict_interop.py)
            self._attempt(lambda b, o: o.load_state_dict(_native(b, bad)), lambda b: (), "a disordered state_dict")
            if self.shadow is not None:
                self.shadow.sync(bad)
            return
        outcome = self._attempt(lambda b, o: o.load_state_dict(_native(b, bad)), allowed, f"corrupted ({how})")
        accepted = sorted(b for b, e in outcome.items() if e is None)
        assert not accepted, f"corrupted state_dict ({how}: {bad}) accepted by {accepted}"

    @precondition(lambda self: self.SPEC.name != "FixedQParamsObserver" and not self.cfg.get("is_dynamic"))
    @rule(data=st.data())
    def merge_replica(self, data):
        """A replica observes one batch; the family merge of both state_dicts is loaded. Refused (the
        state as it was) when the replica rejects the batch or the states' shapes differ. The running
        min/max and static low-bit merges are exact (the shadow observes the batch); the others are
        followed by the shadow syncing to numpy's state."""
        shape = data.draw(st.sampled_from(self.SPEC.shapes(self.cfg)), label="shape")
        kind = data.draw(st.sampled_from(KINDS), label="kind")
        seed = data.draw(st.integers(0, 2**16), label="seed")
        batch = make_batch(kind, seed, shape, "float32", self.SPEC.ch_axis(self.cfg))
        self.log.append(f"merge_replica(make_batch({kind!r}, {seed}, {shape}, 'float32'))")

        def merge(b, o):
            replica = make_observer(b, self.SPEC, self.cfg)
            replica(to_backend(b, batch))
            o.load_state_dict(merged_state_dict(self.SPEC, o.state_dict(), replica.state_dict()))

        if self._agree(self._attempt(merge, lambda b: BAD_INPUT, "merge_replica"), "merge_replica"):
            if _has_subnormal(batch):
                self.jax_ftz = True
            if self.shadow is None:
                return
            if self.SPEC.name in ("MinMaxObserver", "PerChannelMinMaxObserver") or self.SPEC.family == "lowbit":
                if batch.size:
                    self.shadow.update(batch)
            else:
                self.shadow.sync(state_of(self.obs["numpy"]))

    @rule(how=st.sampled_from(("deepcopy", "pickle")))
    def copy_and_continue(self, how):
        """Every observer deep-copies and pickles on every backend; the copy holds the same state and
        qparams, and the machine continues with the copies."""
        self.log.append(f"copy_and_continue({how!r})")
        failures = {}
        copies = {}
        for b, o in self.obs.items():
            try:
                copies[b] = clone(o, how)
            except Exception as err:  # noqa: BLE001 - every failure is reported below
                failures[b] = f"{type(err).__name__}: {err}"
        assert not failures, f"{how} fails on {failures}"
        for b, c in copies.items():
            assert _same_bytes(state_of(c), state_of(self.obs[b])), f"{b}: {how} changed the state"
            why = self._qparams_differ(self._qparams(self.obs[b]), self._qparams(c), ftz=False, narrow=False)
            assert why is None, f"{b}: {how} changed calculate_qparams: {why}"
        self.obs = copies

    @precondition(lambda self: self.SPEC.resettable)
    @rule()
    def reset(self):
        self.log.append("reset()")
        outcome = self._attempt(lambda b, o: o.reset_min_max_vals(), lambda b: (), "reset_min_max_vals")
        assert all(e is None for e in outcome.values())
        if self.shadow is not None:
            self.shadow = self.SPEC.shadow(self.cfg)
        self.jax_ftz = False

    # -- checks after every step ---------------------------------------------------------------
    @staticmethod
    def _qparams(o):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return tuple(to_host(a) for a in o.calculate_qparams())
            except BAD_INPUT + (RuntimeError,) as err:
                return err

    def _qparams_of(self, lo, hi):
        """numpy's pure ``qparams`` of a low-bit state."""
        from observers_core import MinMaxState

        return tuple(to_host(a) for a in self.obs["numpy"].qparams(MinMaxState(lo, hi)))

    @staticmethod
    def _qparams_differ(a, b, *, ftz, narrow):
        if isinstance(a, Exception) or isinstance(b, Exception):
            if type(a) is type(b) and str(a) == str(b):
                return None  # the same refusal (a copy of torch's disordered moving average raises as it does)
            return f"calculate_qparams raised: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            # a float zero point (-min / scale) carries the sign of a zero min, in which the backends'
            # states may differ (docs/exactness.md): compared as the states are, +0 == -0
            why = bits_differ(x, y, state=i == 1, ftz=ftz, narrow=narrow)
            if why:
                return why
        return None

    @invariant()
    def backends_agree(self):
        if not hasattr(self, "obs"):
            return
        states = self._states()
        qps = {b: self._qparams(o) for b, o in self.obs.items()}
        ref, ref_qp = states["numpy"], qps["numpy"]
        assert not isinstance(ref_qp, Exception), f"numpy calculate_qparams raised {ref_qp!r}; steps: {self.log}"
        for b in BACKENDS[1:]:
            jax = b == "jax"
            if jax and self.jax_ftz and self.SPEC.family in _FTZ_SENSITIVE:
                continue  # documented: XLA:CPU flushes subnormals; histograms built on them differ
            assert list(states[b]) == list(ref), f"{b} state_dict keys {list(states[b])} != numpy's {list(ref)}"
            for k in ref:
                why = bits_differ(ref[k], states[b][k], ftz=jax, narrow=jax)
                assert why is None, f"{b} state_dict[{k!r}] != numpy's: {why}; steps: {self.log}"
            if jax and self.jax_ftz and self.SPEC.name in ("PerBlockMXObserver", "PerBlockBFPObserver"):
                continue  # block exponents of a flushed amax differ (documented FTZ)
            expected_qp = ref_qp
            if jax and self.jax_ftz and self.SPEC.family in ("observers", "lowbit") and "min_val" in states[b]:
                # documented FTZ: JAX's qparams are numpy's qparams of JAX's own statistics, flushed as
                # XLA flushes them when it computes (a loaded state may hold subnormals): the zero point
                # -min/scale of per_channel_affine_float_qparams is then 0, not tiny, fp8's scale
                # amax / 448 of a flushed amax is eps; FixedQParamsObserver has no statistics
                expected_qp = self._qparams_of(flushed(states[b]["min_val"]), flushed(states[b]["max_val"]))
            elif jax and self.SPEC.family == "lowbit" and ref["min_val"].dtype == np.float64:
                # documented: JAX without x64 holds float64 statistics as float32; its qparams are
                # numpy's qparams of the float32-rounded statistics
                expected_qp = self._qparams_of(ref["min_val"].astype(np.float32), ref["max_val"].astype(np.float32))
            if b == "torch" and self.SPEC.name.startswith("MovingAverage") and _disordered(ref) \
                    and isinstance(qps[b], ValueError):
                continue  # documented (docs/torch.md, Differences from torch.ao): torch.ao's moving average can leave
                # min_val > max_val (overflow, cancellation); torch raises there, numpy gives scale 1
            why = self._qparams_differ(expected_qp, qps[b], ftz=jax, narrow=jax)
            assert why is None, f"{b} calculate_qparams != numpy's: {why}; steps: {self.log}"

    @invariant()
    def matches_shadow(self):
        if getattr(self, "shadow", None) is None:
            return
        expected = self.shadow.expected()
        if expected is None:
            return
        for b, o in self.obs.items():
            got = state_of(o)
            for k, v in expected.items():
                jax = b == "jax"
                why = bits_differ(v, got[k], ftz=jax, narrow=jax)
                assert why is None, f"{b} state_dict[{k!r}] != shadow model: {why}; steps: {self.log}"


@pytest.mark.parametrize("name", ["PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"])
def test_per_channel_forward_with_pinned_buffer_leaves_buffers_valid(name):
    """A NumPy view of the empty per-channel buffer (``obs.min_val.numpy()``, as a user inspecting the
    state does) pins its storage; the first forward must then either work or fail leaving the buffers
    as they were. (Reading the data is not attempted: a buffer whose shape outgrew its storage
    segfaults when printed.)"""
    import torch

    from observers_core.adapters import torch as tobs

    obs = getattr(tobs, name)(ch_axis=0)
    view = obs.min_val.numpy()  # noqa: F841 - kept alive on purpose
    try:
        obs(torch.ones(3, 5))
    except BAD_INPUT + (RuntimeError,):
        pass
    for key in ("min_val", "max_val"):
        buf = obs.state_dict()[key]
        shape, have, need = tuple(buf.shape), buf.untyped_storage().nbytes(), buf.numel() * buf.element_size()
        del buf  # never in an assertion message: printing it segfaults
        assert have >= need, f"{key} has shape {shape} but {have} bytes of storage"


for _name, _spec in CLASSES.items():
    _machine = type(f"{_name}Machine", (ObserverMachine,), {"SPEC": _spec})
    _case = _machine.TestCase
    _case.settings = SETTINGS
    _case.pytestmark = [pytest.mark.slow]  # a hypothesis stateful fuzz campaign
    globals()[f"Test{_name}"] = _case
del _name, _spec, _machine, _case
