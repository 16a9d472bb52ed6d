"""``cuda_graph_forward``: an observer's forward recorded as a CUDA graph updates the observer exactly as
eager forwards do (CUDA tests, skipped without a device); its refusals (run everywhere)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from observers_core.adapters import torch as tobs  # noqa: E402
from observers_core.adapters._torch_cuda_graph import buffer_addresses  # noqa: E402
from observers_core.adapters.torch import cuda_graph_forward  # noqa: E402

from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

needs_cuda = pytest.mark.gpu("torch-cuda")  # not collected without one (tests/conftest.py)
#: what cuda_graph_forward refuses, and why (its ValueError says so)
REFUSED = {"KLObserver": "Python step count"}


def same_tensor(a, b) -> bool:
    """Equal shape, dtype and values, NaN equal to NaN."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(torch.isnan(a), torch.isnan(b))) \
        and bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))


@needs_cuda
@pytest.mark.parametrize("config", [c for c in CONFIGS if c[0] not in REFUSED], ids=config_id)
def test_cuda_graph_replay_equals_eager_forwards(config):
    """Same buffers, bit for bit, after a sequence of batches: eager forwards against one eager forward,
    the recording (which observes its example once) and replays."""
    name, kwargs = config
    eager, replayed = (getattr(tobs, name)(**kwargs).cuda() for _ in range(2))
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randn(16, 64, device="cuda", generator=g) * scale for scale in (1.0, 3.0, 0.5, 8.0, 0.1)]
    for x in batches:
        eager(x)
    replayed(batches[0])
    step = cuda_graph_forward(replayed, batches[1])
    for x in batches[2:]:
        assert torch.equal(step(x), x)  # an observer's output is its input
    torch.cuda.synchronize()
    mine, theirs = dict(replayed.named_buffers()), dict(eager.named_buffers())
    assert mine.keys() == theirs.keys()
    different = [key for key in mine if not same_tensor(mine[key], theirs[key])]
    assert not different, f"{name}: buffers {different} differ after graph replays"
    assert same_tensor(torch.stack(replayed.calculate_qparams()[:1]), torch.stack(eager.calculate_qparams()[:1]))


@needs_cuda
def test_cuda_graph_step_refuses_a_batch_unlike_the_recorded_one():
    obs = tobs.MinMaxObserver().cuda()
    step = cuda_graph_forward(obs, torch.randn(4, 8, device="cuda"))
    before = obs.min_val.clone(), obs.max_val.clone()
    for bad in (torch.randn(4, 9, device="cuda"), torch.randn(4, 8, device="cuda", dtype=torch.float64),
                torch.randn(4, 8)):
        with pytest.raises(ValueError, match="must match the recorded batch"):
            step(bad * 100)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        step([1.0])
    torch.cuda.synchronize()
    assert same_tensor(obs.min_val, before[0]) and same_tensor(obs.max_val, before[1])


@pytest.mark.parametrize("name, kwargs, match", [
    ("KLObserver", {}, "step count"),
    ("HistogramObserver", {}, "ignore_nonfinite=True"),
    ("MinMaxObserver", dict(sync=True), "sync=False"),
    ("HistogramObserver", dict(reduce_range=True), "at '1'"),
])
def test_cuda_graph_forward_refuses_observers_a_graph_cannot_replay(name, kwargs, match):
    """Alone, or inside a model (the message then names where)."""
    obs = getattr(tobs, name)(**kwargs)
    module = torch.nn.Sequential(torch.nn.Identity(), obs) if match.startswith("at ") else obs
    with pytest.raises(ValueError, match=match):
        cuda_graph_forward(module, torch.randn(4, 8))


def test_cuda_graph_forward_argument_errors():
    with pytest.raises(TypeError, match="module must be a torch observer or model"):
        cuda_graph_forward(object(), torch.randn(3))
    with pytest.raises(TypeError, match="example must be a torch.Tensor"):
        cuda_graph_forward(tobs.MinMaxObserver(), [1.0, 2.0])
    with pytest.raises(ValueError, match="example must be a CUDA tensor, got one on cpu"):
        cuda_graph_forward(tobs.MinMaxObserver(), torch.randn(3))


@needs_cuda
def test_cuda_graph_forward_refuses_an_observer_on_another_device():
    with pytest.raises(ValueError, match=r"move it first"):
        cuda_graph_forward(tobs.MinMaxObserver(), torch.randn(3, device="cuda"))


def test_buffer_addresses_change_when_a_buffer_is_replaced():
    """What ``step`` compares with the recording: a per-tensor reset fills the buffers in place (the graph
    stays valid), a per-channel reset replaces them (``step`` must refuse)."""
    per_tensor, per_channel = tobs.MinMaxObserver(), tobs.PerChannelMinMaxObserver(ch_axis=0)
    for obs in (per_tensor, per_channel):
        obs(torch.randn(4, 8))
    before = buffer_addresses(per_tensor), buffer_addresses(per_channel)
    per_tensor.reset_min_max_vals()
    per_channel.reset_min_max_vals()
    assert buffer_addresses(per_tensor) == before[0]
    assert buffer_addresses(per_channel) != before[1]


@needs_cuda
def test_cuda_graph_step_refuses_replaced_buffers():
    obs = tobs.PerChannelMinMaxObserver(ch_axis=0).cuda()
    step = cuda_graph_forward(obs, torch.randn(4, 8, device="cuda"))
    obs.reset_min_max_vals()
    with pytest.raises(ValueError, match="record again"):
        step(torch.randn(4, 8, device="cuda"))
