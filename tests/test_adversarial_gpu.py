"""Adversarial steps on the GPU backends: every public observer class on torch CUDA (against the same class
on torch CPU), on CuPy (against the NumPy observer, the same generic class) and on JAX's GPU (against the
same class on JAX's CPU) takes the same seeded
sequence of steps: adversarial batches of every kind, dtype and shape of ``test_adversarial_stateful.py``
(bool/complex/int/float16/bfloat16/float64, NaN/Inf, float32's limit, subnormals, empty, another channel
count), an input on the wrong device, ``calculate_qparams``, a state-dict round trip and ``reset``.

Each step must raise nothing but the documented ``ValueError``/``TypeError``, be accepted or rejected as
its CPU twin decides, and leave the state bit for bit as it was when it is rejected. The values are the
other GPU tests' business (docs/gpu.md "GPU arithmetic": GPUs round some divisions differently), so a
decision that hangs on a rounding (``calculate_qparams`` of a moving average whose range went
disordered) is not compared. Skipped without a GPU; the CPU backends run these steps in
``test_adversarial_stateful.py``. A JAX state goes where its first batch is, so JAX's "wrong device" is
its own test: a state on the GPU refuses a batch committed to the CPU.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import _cupy_available, _jax_gpu_available, _torch_cuda_available

from _adversarial_strategies import CLASSES, DTYPES, KINDS, make_batch, make_observer, to_backend, to_host

BAD_INPUT = (ValueError, TypeError)
STEPS = 16
SEQUENCES = 4


def _torch_cuda():
    if not _torch_cuda_available():
        pytest.skip("torch has no CUDA device here")

    def make(spec, cfg):
        return make_observer("torch", spec, cfg).cuda(), make_observer("torch", spec, cfg)

    def put(a, on_device=True):
        t = to_backend("torch", a)
        return t.cuda() if on_device else t

    return make, put


def _cupy():
    if not _cupy_available():
        pytest.skip("cupy or a CUDA device is not available here")
    import cupy

    def make(spec, cfg):
        return make_observer("cupy", spec, cfg), make_observer("numpy", spec, cfg)

    def put(a, on_device=True):
        a = _without_bfloat16(a)
        return cupy.asarray(a) if on_device else a

    return make, put


def _jax_gpu():
    if not _jax_gpu_available():
        pytest.skip("JAX has no GPU here")
    import jax

    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]

    def make(spec, cfg):
        return make_observer("jax", spec, cfg), make_observer("jax", spec, cfg)

    def put(a, on_device=True):
        return jax.device_put(to_backend("jax", a), gpu if on_device else cpu)

    return make, put


def _without_bfloat16(a):
    """``a``, bfloat16 as its exact float32 upcast (CuPy has no bfloat16; its NumPy twin gets the same)."""
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def _host_put(backend):
    """How the CPU twin takes a host batch."""
    if backend == "torch-cuda":
        return lambda a: to_backend("torch", a)
    if backend == "jax-gpu":
        import jax

        return lambda a: jax.device_put(to_backend("jax", a), jax.devices("cpu")[0])
    return _without_bfloat16


def _state(obs):
    """The state dict on the host (CuPy arrays through ``.get()``)."""
    return {k: v.get() if type(v).__module__.startswith("cupy") else to_host(v) for k, v in obs.state_dict().items()}


def _same_bits(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a
    )


def _outcome(fn):
    """``None`` if ``fn()`` runs, the exception's type for the documented bad-input errors; anything else
    propagates (a crash fails the test with its traceback)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except BAD_INPUT as exc:
        return type(exc)
    return None


def _steps(spec, cfg, seed):
    """A seeded sequence of ``(op, args)``."""
    rng = np.random.default_rng(seed)
    shapes = spec.shapes(cfg)
    ch_axis = spec.ch_axis(cfg)
    for _ in range(STEPS):
        op = rng.choice(["observe"] * 8 + ["wrong_device", "qparams", "qparams", "state_dict", "reset"])
        if op in ("observe", "wrong_device"):
            shape = shapes[rng.integers(len(shapes))]
            kind, dtype = KINDS[rng.integers(len(KINDS))], DTYPES[rng.integers(len(DTYPES))]
            batch = make_batch(kind, int(rng.integers(2**31)), shape, dtype, ch_axis)
            yield op, (kind, dtype, shape, batch)
        else:
            yield op, ()


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("backend", ["torch-cuda", "cupy", "jax-gpu"])
def test_gpu_observers_take_adversarial_steps_as_their_cpu_twins(backend, name):
    make, put = {"torch-cuda": _torch_cuda, "cupy": _cupy, "jax-gpu": _jax_gpu}[backend]()
    host_put = _host_put(backend)
    spec = CLASSES[name]
    steps = 0
    for c, cfg in enumerate(spec.configs):
        for seq in range(SEQUENCES):
            gpu, cpu = make(spec, cfg)
            log = []
            for op, args in _steps(spec, cfg, 1000 * c + seq):
                log.append((op, args[:3]))
                before = _state(gpu)
                if op == "observe":
                    batch = args[3]
                    got, want = _outcome(lambda: gpu(put(batch))), _outcome(lambda: cpu(host_put(batch)))
                elif op == "wrong_device":  # torch: ValueError (another device); CuPy: TypeError (not CuPy)
                    if name == "FixedQParamsObserver" or backend == "jax-gpu":
                        continue  # Fixed: its forward does not look at x, as torch.ao's; JAX: a state goes where its first
                        # batch is (tests/_jax_distributed_checks.py checks the refusal of a committed other device)
                    got = want = _outcome(lambda: gpu(put(args[3], on_device=False)))
                    assert got is not None, f"{backend} {name} {cfg} took a batch from the host; {log}"
                elif op == "qparams":
                    got, want = _outcome(gpu.calculate_qparams), _outcome(cpu.calculate_qparams)
                    if name.startswith("MovingAverage"):
                        want = got  # a disordered average's refusal can hang on a GPU rounding (module doc)
                elif op == "state_dict":
                    got = _outcome(lambda: gpu.load_state_dict(gpu.state_dict()))
                    want = _outcome(lambda: cpu.load_state_dict(cpu.state_dict()))
                else:
                    if not spec.resettable:
                        continue
                    got, want = _outcome(gpu.reset_min_max_vals), _outcome(cpu.reset_min_max_vals)
                assert got == want, f"{backend} {name} {cfg}: {op} gave {got} where the CPU twin gave {want}; {log}"
                if got is not None:
                    assert _same_bits(before, _state(gpu)), f"{backend} {name} {cfg}: a rejected {op} changed the state; {log}"
                steps += 1
    assert steps >= len(spec.configs) * SEQUENCES * STEPS // 2


@pytest.mark.gpu("jax-gpu")
@pytest.mark.parametrize("name", sorted(set(CLASSES) - {"FixedQParamsObserver"}))
def test_jax_gpu_state_refuses_a_batch_committed_to_the_cpu(name):
    """JAX: once the state is on the GPU, a batch committed to the CPU raises ``ValueError("x is on device
    ...")`` and leaves the state; a NumPy batch (uncommitted) goes to the state's device."""
    _jax_gpu()
    import jax

    spec = CLASSES[name]
    cfg = next(c for c in spec.configs if not c.get("is_dynamic", False))
    shape = spec.shapes(cfg)[0]
    batch = make_batch("normal", 0, shape, "float32", spec.ch_axis(cfg))
    obs = make_observer("jax", spec, cfg)
    obs(jax.device_put(batch, jax.devices("gpu")[0]))
    before = _state(obs)
    with pytest.raises(ValueError, match="x is on device"):
        obs(jax.device_put(batch, jax.devices("cpu")[0]))
    assert _same_bits(before, _state(obs))
    obs(batch)
    assert all(leaf.devices() == {jax.devices("gpu")[0]} for leaf in obs.state_dict().values())
