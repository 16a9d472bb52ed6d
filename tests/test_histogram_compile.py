"""Issue 11 item 1: torch's ``HistogramObserver`` (ours) inside ``torch.compile`` matches eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from observers_core.adapters.torch import HistogramObserver  # noqa: E402

pytestmark = pytest.mark.slow  # torch.compile: minutes of compiling


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_histogram_observer_under_torch_compile_equals_eager(backend):
    torch._dynamo.reset()
    compiled_obs, eager_obs = HistogramObserver(bins=128), HistogramObserver(bins=128)
    step = torch.compile(lambda x: compiled_obs(x) * 2, backend=backend)
    qparams = torch.compile(lambda: compiled_obs.calculate_qparams(), backend=backend)
    gen = torch.Generator().manual_seed(0)
    for i in range(5):
        x = torch.randn(8, 16, generator=gen) * (i + 1) + (i - 2)
        assert torch.equal(step(x), x * 2)
        eager_obs(x)
        for name in ("histogram", "min_val", "max_val"):
            assert torch.equal(getattr(compiled_obs, name), getattr(eager_obs, name)), name
    scale, zero_point = qparams()
    ref_scale, ref_zero_point = eager_obs.calculate_qparams()
    assert torch.equal(scale, ref_scale) and torch.equal(zero_point, ref_zero_point)
    assert compiled_obs.histogram.sum() == 5 * 8 * 16
