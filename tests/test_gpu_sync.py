"""No host synchronisation inside a CUDA update: every torch observer's ``forward`` on a CUDA tensor, after
its first (which creates the state, and the first update on a device copies the core's constant tables
there once: powers of two, index tables), runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any call that waits for the GPU (a
``.item()``, a blocking device-to-host copy, ``nonzero``, a stream synchronise). ``calculate_qparams`` is
allowed to read the device (the searches stop once the error rises); how often it does, and what a NaN in
a batch costs, is printed by ``benchmarks/gpu_sync_report.py``. Skipped without a CUDA device.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device here", allow_module_level=True)

from observers_core.adapters import torch as tobs  # noqa: E402

from _torch_observer_configs import CONFIGS, config_id  # noqa: E402


def batches_on_cuda() -> list:
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(16, 64, device="cuda", generator=g) * scale for scale in (1.0, 3.0, 0.5)]


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_cuda_forward_never_synchronises(config):
    name, kwargs = config
    obs = getattr(tobs, name)(**kwargs).cuda()
    batches = batches_on_cuda()
    obs(batches[0])
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x in batches[1:]:
            assert obs(x) is x
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert next(obs.buffers()).is_cuda


def test_histogram_forward_with_torchs_warnings_reads_the_device_once():
    """HistogramObserver's default (``ignore_nonfinite=False``) warns, as torch does, when a batch held
    NaN or +/-inf: it reads the two counts it made while binning, one synchronisation per forward (torch's
    own HistogramObserver synchronises several times per forward)."""
    import warnings

    obs = tobs.HistogramObserver().cuda()
    batches = batches_on_cuda()
    obs(batches[0])
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            obs(batches[1])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert sum("called a synchronizing CUDA operation" in str(w.message) for w in caught) == 1, [str(w.message) for w in caught]

