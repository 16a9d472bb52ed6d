"""``nn.Module`` methods on the torch observers: dtype conversions of the buffers (``.half()``,
``.bfloat16()``, ``.double()``, as ``model.half()`` does to a prepared model) give torch.ao's states and
qparams, dtypes included; KLObserver's accumulator keeps its dtype through them; ``torch.jit.script``
refuses our observers with a ``TypeError`` that says why (torch.ao's script)."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.ao.quantization.observer as tao  # noqa: E402

from observers_core.adapters import torch as ot  # noqa: E402
from observers_core.adapters import horizon  # noqa: E402

CONVERSIONS = ("half", "bfloat16", "double", "float")
MINMAX = {
    "MinMaxObserver": ("per_tensor_affine", "per_tensor_symmetric"),
    "MovingAverageMinMaxObserver": ("per_tensor_affine", "per_tensor_symmetric"),
    "PerChannelMinMaxObserver": ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"),
    "MovingAveragePerChannelMinMaxObserver": (
        "per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"),
}


def _batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 16, generator=g) * s + o for s, o in ((1.0, 0.0), (3.0, 1.0), (0.5, -2.0))]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("conversion", CONVERSIONS)
@pytest.mark.parametrize("name", sorted(MINMAX))
def test_converted_minmax_observers_equal_torchs(name, conversion):
    """One batch, the conversion, two more batches: buffers and qparams equal torch.ao's bit for bit,
    dtypes included (float16 buffers give a float16 scale, computed in float16, as torch's)."""
    for seed in range(5):
        for qscheme in MINMAX[name]:
            ours, theirs = (getattr(mod, name)(qscheme=getattr(torch, qscheme)) for mod in (ot, tao))
            for obs in (ours, theirs):
                first, *rest = _batches(seed)
                obs(first)
                getattr(obs, conversion)()
                for x in rest:
                    obs(x)
            got, want = ours.state_dict(), theirs.state_dict()
            assert list(got) == list(want)
            assert all(_same(got[k], want[k]) for k in want), (qscheme, got, want)
            for g, w in zip(ours.calculate_qparams(), theirs.calculate_qparams()):
                assert _same(g, w), (qscheme, seed, g, w)


@pytest.mark.parametrize("conversion", ["half", "bfloat16", "double"])
def test_converted_histogram_observer_searches_in_float32(conversion):
    """The deliberate difference (docs/torch.md "Differences from torch.ao"): the buffers convert as torch's, but
    the search and the qparams stay float32: torch.ao's search of the same converted buffers' values cast
    to float32, bit for bit (torch.ao searches in the buffers' dtype and returns qparams in it)."""
    ours, theirs = ot.HistogramObserver(), tao.HistogramObserver()
    first, *rest = _batches(3)
    for obs in (ours, theirs):
        obs(first)
        getattr(obs, conversion)()
        for x in rest:
            obs(x)
    got, want = ours.state_dict(), theirs.state_dict()
    assert all(_same(got[k], want[k]) for k in want)
    float32_twin = copy.deepcopy(theirs).float()
    scale, zero_point = ours.calculate_qparams()
    want_scale, want_zero_point = float32_twin.calculate_qparams()
    assert _same(scale, want_scale) and _same(zero_point, want_zero_point)
    assert theirs.calculate_qparams()[0].dtype == getattr(torch, {"half": "float16"}.get(conversion, conversion))


@pytest.mark.parametrize("conversion", ["half", "bfloat16", "double"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_kl_accumulator_keeps_its_dtype_through_conversions(conversion, per_channel):
    """The accumulator's grid (origin, power-of-two width) stays float32 and the counts int64 under a
    dtype conversion (float16 crashed the compiled kernels, and would round the grid); it goes on equal to
    an unconverted twin's (a device move: the next test)."""
    kwargs = {"ch_axis": 0, "qscheme": torch.per_channel_symmetric} if per_channel else {}
    obs = ot.KLObserver(update_interval=2, **kwargs)
    first, *rest = _batches(7)
    obs(first)
    twin = copy.deepcopy(obs)
    dtypes = {name: buf.dtype for name, buf in obs.named_buffers() if name.startswith(("hist_", "seen_"))}
    getattr(obs, conversion)()
    for x in rest:
        obs(x)
        twin(x)
    converted = dict(obs.named_buffers())
    for name, dtype in dtypes.items():
        assert converted[name].dtype == dtype
        assert _same(converted[name], dict(twin.named_buffers())[name]), name
    expected = getattr(torch, {"half": "float16"}.get(conversion, conversion))
    assert obs.min_val.dtype == obs.eps.dtype == expected  # the persistent buffers convert as torch's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scale, _ = obs.calculate_qparams()
    assert torch.isfinite(scale).all()


@pytest.mark.gpu("torch-cuda")
def test_kl_accumulator_moves_with_the_module_to_cuda():
    """``.cuda()`` after the first batch moves the accumulator (a device move is not a dtype conversion);
    later GPU batches accumulate as the CPU twin does (counts, power-of-two grid and range are exact)."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    obs = ot.KLObserver(update_interval=2)
    first, *rest = _batches(11)
    obs(first)
    twin = copy.deepcopy(obs)
    obs.cuda()
    for x in rest:
        obs(x.cuda())
        twin(x)
    moved, expected = dict(obs.named_buffers()), dict(twin.named_buffers())
    for name in expected:
        if name.startswith(("hist_", "seen_")):
            assert moved[name].is_cuda and _same(moved[name].cpu(), expected[name]), name


def _ours():
    """One of each torch class of ours with statistics (torch's names, ours, Horizon's and Quark's)."""
    yield ot.MinMaxObserver()
    yield ot.PerChannelMinMaxObserver()
    yield ot.HistogramObserver()
    yield ot.KLObserver()
    yield ot.MixObserver()
    yield ot.PerGroupMinMaxObserver(group_size=4)
    yield ot.PerBlockMXObserver("mxfp4", block_size=8)
    yield horizon.MinMaxObserver()


def test_jit_script_refuses_our_observers_and_scripts_torchs():
    for obs in _ours():
        name = type(obs).__name__
        for target in (obs, torch.nn.Sequential(torch.nn.Linear(16, 16), obs)):
            with pytest.raises(TypeError, match=f"{name} cannot be compiled by torch.jit.script"):
                torch.jit.script(target)
    torch.jit.script(tao.MinMaxObserver())  # the difference is ours: torch.ao's observers script


INFERENCE_CASES = [
    ("MinMaxObserver", {}), ("PerChannelMinMaxObserver", {}), ("MovingAveragePerChannelMinMaxObserver", {}),
    ("HistogramObserver", {}), ("KLObserver", {}), ("KLObserver", {"ch_axis": 0, "qscheme": torch.per_channel_symmetric}),
    ("MSEObserver", {"ch_axis": 0, "qscheme": torch.per_channel_symmetric}), ("MixObserver", {}),
    ("PerGroupMinMaxObserver", {"group_size": 4}), ("FP8Observer", {}),
    ("PerBlockMXObserver", {"dtype": "mxfp4", "block_size": 8}), ("PerBlockBFPObserver", {}),
]


def _step(obs, step, x):
    if step == "forward":
        obs(x)
    elif step == "reset":
        if not isinstance(obs, ot.HistogramObserver):  # torch's HistogramObserver cannot reset
            obs.reset_min_max_vals()
    else:
        obs.load_state_dict(copy.deepcopy(obs.state_dict()))


@pytest.mark.parametrize("name,kwargs", INFERENCE_CASES, ids=[f"{n}-{len(k)}" for n, k in INFERENCE_CASES])
def test_buffers_written_under_inference_mode_keep_working_outside(name, kwargs):
    """Calibration under ``torch.inference_mode()`` makes every tensor it creates an inference tensor, which
    torch forbids updating in place once the mode is off. Whatever step ran inside (forward, reset,
    load_state_dict), the observer goes on outside exactly as a twin that never entered the mode (torch.ao's
    per-channel observers raise there after a reset: docs/torch.md "Differences from torch.ao")."""
    first, second, third = _batches(5)
    for inside in ("forward", "reset", "load"):
        for start_outside in (False, True):
            obs, twin = getattr(ot, name)(**kwargs), getattr(ot, name)(**kwargs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for o, mode in ((obs, torch.inference_mode()), (twin, torch.no_grad())):
                    if start_outside:
                        o(first)
                    with mode:
                        _step(o, inside, second)
                        o(second)
                    for step in ("forward", "load", "forward", "reset", "forward"):
                        _step(o, step, third)
                got, want = obs.state_dict(), twin.state_dict()
                assert all(_same(got[k], want[k]) for k in want), (inside, start_outside)
                for g, w in zip(obs.calculate_qparams(), twin.calculate_qparams()):
                    assert _same(g, w), (inside, start_outside)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_changes_nothing(device):
    """Observers under ``torch.autocast`` (bfloat16 on the CPU, float16 on CUDA) give the states and qparams
    they give outside it, dtypes included: no op of theirs is one autocast recasts."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    batches = [x.to(device) for x in _batches(9)]
    for name, kwargs in INFERENCE_CASES + [("PercentileObserver", {})]:
        inside, outside = getattr(ot, name)(**kwargs).to(device), getattr(ot, name)(**kwargs).to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device, dtype=dtype):
                for x in batches:
                    inside(x)
                got_qparams = inside.calculate_qparams()
            for x in batches:
                outside(x)
            want_qparams = outside.calculate_qparams()
        got, want = inside.state_dict(), outside.state_dict()
        assert all(_same(got[k], want[k]) for k in want), name
        assert all(_same(g, w) for g, w in zip(got_qparams, want_qparams)), name


@pytest.mark.parametrize("name", ["MinMaxObserver", "PerChannelMinMaxObserver", "HistogramObserver", "KLObserver"])
def test_range_attributes_changed_after_construction_are_checked(name):
    """torch's observers read ``quant_min``/``quant_max`` when computing qparams, so a later change counts
    (ours as torch.ao's, bit for bit, for a valid range); a float bound (torch.ao computes with it, giving a
    fractional zero point) is a ``TypeError``, a range whose zero points leave int32 (torch.ao: an overflow
    ``RuntimeError``) a ``ValueError``, each naming the attributes, and the buffers stay as they were."""
    x = _batches(2)[0]
    if name != "KLObserver":
        ours, theirs = getattr(ot, name)(), getattr(tao, name)()
        for obs in (ours, theirs):
            obs(x)
            obs.quant_min, obs.quant_max = 10, 200
        for g, w in zip(ours.calculate_qparams(), theirs.calculate_qparams()):
            assert _same(g, w)
    cases = [("quant_min", 1.5, TypeError, "quant_min must be an int"),
             ("quant_min", 300, ValueError, "quant_min=300 must be <= quant_max")]  # (it said: zero points int32)
    if name != "KLObserver":  # (KL's default is symmetric: its zero point stays 0 for any range)
        cases.append(("quant_max", 2**40, ValueError, "affine zero points are int32"))
    for attribute, value, error, match in cases:
        obs = getattr(ot, name)()
        obs(x)
        before = copy.deepcopy(obs.state_dict())
        setattr(obs, attribute, value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(error, match=match):
                obs.calculate_qparams()
        assert all(_same(v, before[k]) for k, v in obs.state_dict().items())


@pytest.mark.parametrize("name", ["MovingAverageMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"])
def test_averaging_constant_changed_after_construction(name):
    """torch.ao reads ``averaging_constant`` at each batch: a later number counts (ours as torch.ao's, bit for
    bit, also outside [0, 1], which torch.ao extrapolates with), and a value its arithmetic refuses
    (``None``, a string) is a ``TypeError`` with the buffers untouched (ours averaged with ``float("0.5")``,
    and ``None`` silently switched to the running range)."""
    first, second, third = _batches(5)
    for value in (0.25, 1, 2.0, True):
        ours, theirs = getattr(ot, name)(), getattr(tao, name)()
        for obs in (ours, theirs):
            obs(first)
            obs.averaging_constant = value
            obs(second)
        assert all(_same(ours.state_dict()[k], v) for k, v in theirs.state_dict().items()), value
    for value in (None, "0.5"):
        ours, theirs = getattr(ot, name)(), getattr(tao, name)()
        for obs in (ours, theirs):
            obs(first)
            obs.averaging_constant = value
        with pytest.raises(TypeError):
            theirs(second)
        before = copy.deepcopy(ours.state_dict())
        with pytest.raises(TypeError, match="averaging_constant must be a real number"):
            ours(second)
        assert all(_same(v, before[k]) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("name", ["MinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "HistogramObserver"])
def test_ignore_nonfinite_set_to_a_non_bool_is_refused_at_the_next_batch(name):
    """``ignore_nonfinite`` set after construction to anything but a bool: a ``TypeError`` naming it at the next
    batch, buffers untouched, on every class (the min/max classes took ``"yes"`` as ``True`` and ``0`` as ``False``)."""
    first, second, _ = _batches(5)
    for value in ("yes", 0, None):
        ours = getattr(ot, name)()
        ours(first)
        ours.ignore_nonfinite = value
        before = copy.deepcopy(ours.state_dict())
        with pytest.raises(TypeError, match="ignore_nonfinite must be a bool"):
            ours(second)
        assert all(_same(v, before[k]) for k, v in ours.state_dict().items())


def test_a_shared_memory_per_channel_observer_observes():
    """``share_memory()`` before the first batch: the empty per-channel buffers' shared storage cannot be
    resized (torch's ``resize_`` kills the process, torch.ao's observer with it): ours makes new buffers,
    with torch.ao's values. Run in a child process, so a crash fails the test instead of the run."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from observers_core.adapters.torch import PerChannelMinMaxObserver\n"
        "obs = PerChannelMinMaxObserver(); obs.share_memory()\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "obs(x)\n"
        "assert torch.equal(obs.min_val, torch.tensor([0.0, 4.0, 8.0])), obs.min_val\n"
        "assert torch.equal(obs.max_val, torch.tensor([3.0, 7.0, 11.0])), obs.max_val\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_histogram_buffers_that_require_grad_take_updates():
    """torch.ao's HistogramObserver observes with buffers a user marked ``requires_grad`` (it reassigns
    them); ours wrote them in place, which autograd refuses for a leaf: now the same state as torch.ao's."""
    ours, theirs = ot.HistogramObserver(), tao.HistogramObserver()
    first, second, _ = _batches(6)
    for obs in (ours, theirs):
        obs(first)
        for buffer in obs.buffers():
            buffer.requires_grad_()
        obs(second)
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v.detach()), k


@pytest.mark.parametrize("name", sorted({*MINMAX, "HistogramObserver"}))
def test_observers_build_on_the_meta_device(name):
    """Deferred initialisation (``with torch.device("meta")``, ``to_empty``, then a checkpoint's load), as
    for a large model: our observers build on the meta device (they read the ``eps`` buffer's value at
    construction before: ``Tensor.item() cannot be called on meta tensors``) with torch.ao's buffers
    (names, shapes, dtypes), and once materialised and loaded they go on as the checkpoint's observer."""
    checkpoint = getattr(ot, name)()
    first, second, _ = _batches(3)
    checkpoint(first)
    with torch.device("meta"):
        ours, theirs = getattr(ot, name)(), getattr(tao, name)()
    shapes = [{k: (v.device.type, v.shape, v.dtype) for k, v in obs.state_dict().items()} for obs in (ours, theirs)]
    assert shapes[0] == shapes[1] and all(device == "meta" for device, _, _ in shapes[0].values())
    ours = ours.to_empty(device="cpu")
    ours.load_state_dict(checkpoint.state_dict())
    for obs in (ours, checkpoint):
        obs(second)
    got, want = ours.state_dict(), checkpoint.state_dict()
    assert all(_same(got[k], want[k]) for k in want)
    for g, w in zip(ours.calculate_qparams(), checkpoint.calculate_qparams()):
        assert _same(g, w)


@pytest.mark.parametrize("name", ["KLObserver", "MSEObserver", "PercentileObserver", "MixObserver"])
def test_calibration_observers_load_on_the_meta_device(name):
    """A checkpoint loaded into a calibration observer built on the meta device: without ``assign`` the buffers
    stay meta, as torch.ao's observers' do (it raised ``Tensor.item() cannot be called on meta tensors``, reading
    the loaded ``eps``); with ``assign=True`` the observer goes on as the checkpoint's."""
    checkpoint = getattr(ot, name)()
    first, second, _ = _batches(3)
    checkpoint(first)
    with torch.device("meta"):
        stays, assigned = getattr(ot, name)(), getattr(ot, name)()
    stays.load_state_dict(checkpoint.state_dict())
    assert all(v.is_meta for v in stays.state_dict().values())
    assigned.load_state_dict(checkpoint.state_dict(), assign=True)
    for obs in (assigned, checkpoint):
        obs(second)
    got, want = assigned.state_dict(), checkpoint.state_dict()
    assert all(_same(got[k], want[k]) for k in want)
    for g, w in zip(assigned.calculate_qparams(), checkpoint.calculate_qparams()):
        assert _same(g, w)
