"""Kernel launches per observer step on the torch CUDA path, counted on the CPU (issue 36's limits), with
the counting of benchmarks/device_path_ops.py (:func:`observers_core.testing.count_launches` inside
:func:`observers_core.testing.cuda_path_on_cpu`: aten operations that launch a kernel plus Triton
launches; views and allocations are not launches; host synchronisations counted apart).

Held here: HistogramObserver.forward <= 8 and no sync; HistogramObserver.calculate_qparams <= 20 and one
sync; PercentileObserver.forward, KLObserver.forward and MSEObserver.forward (per tensor and per channel)
<= 12, no sync; MixObserver.forward <= 20, no sync; every torch.ao MinMax-family class no more than
torch.ao's own forward.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from device_path_ops import anchor_count, batches_of, count, qparams_after  # noqa: E402
from _torch_observer_configs import PER_CHANNEL  # noqa: E402

from observers_core.testing import count_launches, cuda_path_on_cpu  # noqa: E402

BATCHES = batches_of((64, 512))
#: Per-channel batches: 8 channels (the Triton interpreter runs every channel's rows one after another; (64, 512)
#: has 512, up to minutes on the CPU). The launches do not depend on the channel count.
SMALL_CHANNELS = batches_of((64, 8))
MINMAX = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
          "MovingAveragePerChannelMinMaxObserver"]


@pytest.fixture(autouse=True)
def _triton_on():
    if os.environ.get("OBSERVERS_CORE_NO_TRITON", "") not in ("", "0"):
        pytest.skip("OBSERVERS_CORE_NO_TRITON is set: the array code runs, whose counts are not held")


def test_histogram_forward_launches_at_most_8_and_never_syncs():
    counted = count(("HistogramObserver", dict(ignore_nonfinite=True)), BATCHES)
    assert counted.launches <= 8, counted
    assert counted.syncs == 0, counted
    assert sum(counted.triton.values()) == 3, counted  # the kernels ran (not the array code)


def test_histogram_forward_default_reads_two_counts_once():
    """The default (ignore_nonfinite=False) reads the NaN/inf counts for torch's warnings: one sync."""
    counted = count(("HistogramObserver", {}), BATCHES)
    assert counted.launches <= 8, counted
    assert counted.syncs <= 1, counted


@pytest.mark.parametrize("kwargs", [dict(ignore_nonfinite=True), {}], ids=["ignore_nonfinite", "default"])
def test_histogram_calculate_qparams_launches_at_most_20_and_syncs_once(kwargs):
    """The L2 search and the qparams in one kernel; one host read (the checks and torch's warnings)."""
    counted = count(("HistogramObserver", kwargs), BATCHES, qparams_after)
    assert counted.launches <= 20, counted
    assert counted.syncs <= 1, counted
    assert counted.triton["_l2_search_kernel"] == 1, counted  # the kernel ran (not the array code)


@pytest.mark.parametrize("kwargs", [{}, PER_CHANNEL], ids=["per_tensor", "per_channel"])
def test_percentile_forward_launches_at_most_12(kwargs):
    counted = count(("PercentileObserver", kwargs), SMALL_CHANNELS if kwargs else BATCHES)
    assert counted.launches <= 12, counted
    assert counted.syncs == 0, counted


KL_KERNELS = {"_rows_range_kernel", "_kl_accumulate_kernel", "_kl_prefix_kernel", "_kl_curve_kernel",
              "_kl_pick_kernel", "_clip_average_kernel"}


@pytest.mark.parametrize("kwargs", [{}, PER_CHANNEL], ids=["per_tensor", "per_channel"])
def test_kl_forward_launches_at_most_12_and_never_syncs(kwargs):
    """The accumulator update, the KL search and the clipped average all run the Triton kernels (the third
    forward: the accumulator's grid and the KL update both run)."""
    counted = count(("KLObserver", kwargs), SMALL_CHANNELS if kwargs else BATCHES)
    assert counted.launches <= 12, counted
    assert counted.syncs == 0, counted
    assert set(counted.triton) == KL_KERNELS and sum(counted.triton.values()) == len(KL_KERNELS), counted


MSE_KERNELS = ("_mse_prepare_kernel", "_mse_errors_kernel", "_mse_pick_kernel")


@pytest.mark.parametrize("kwargs", [{}, PER_CHANNEL], ids=["per_tensor", "per_channel"])
def test_mse_forward_launches_at_most_12_and_never_syncs(kwargs):
    counted = count(("MSEObserver", kwargs), SMALL_CHANNELS if kwargs else BATCHES)
    assert counted.launches <= 12, counted
    assert counted.syncs == 0, counted
    assert all(counted.triton[k] == 1 for k in MSE_KERNELS), counted


MIX_KERNELS = {"_rows_range_kernel", "_abs_histogram_kernel", "_percentile_kernel", "_kl_prefix_kernel",
               "_kl_curve_kernel", "_kl_pick_kernel", *MSE_KERNELS, "_mix_errors_kernel", "_mix_pick_kernel",
               "_clip_average_kernel"}


@pytest.mark.parametrize("kwargs", [{}, PER_CHANNEL], ids=["per_tensor", "per_channel"])
def test_mix_forward_launches_at_most_20_and_never_syncs(kwargs):
    """Every candidate's search (percentile, KL, MSE), the candidates' errors and the pick run the Triton
    kernels, each once."""
    counted = count(("MixObserver", kwargs), SMALL_CHANNELS if kwargs else BATCHES)
    assert counted.launches <= 20, counted
    assert counted.syncs == 0, counted
    assert set(counted.triton) == MIX_KERNELS and sum(counted.triton.values()) == len(MIX_KERNELS), counted


@pytest.mark.parametrize("name", MINMAX)
def test_minmax_family_forward_no_more_launches_than_torch_ao(name):
    ours, theirs = count((name, {}), BATCHES), anchor_count((name, {}), BATCHES)
    assert ours.launches <= theirs.launches, (ours, theirs)
    assert ours.syncs == 0, ours


def test_counting_sees_views_as_free_and_triton_launches():
    x = torch.randn(8, 8)
    with cuda_path_on_cpu(), count_launches() as counted:
        y = x.view(64)[:10]
        (y + 1).sum()
    assert dict(counted.aten) == {"add": 1, "sum": 1}, counted
    assert counted.syncs == 0
    with count_launches() as counted:
        float(x.sum())
    assert counted.syncs == 1 and counted.launches == 1, counted


def test_counting_sees_undispatched_reads_on_the_cuda_path():
    """tolist/cpu/numpy of a CPU tensor dispatch no aten read; on the CUDA path they are one sync each."""
    x = torch.randn(4)
    original = torch.Tensor.tolist
    with cuda_path_on_cpu(), count_launches() as counted:
        x.tolist()
        x.cpu()
        x.numpy()
    assert counted.syncs == 3 and counted.launches == 0, counted
    with count_launches() as counted:  # plain CPU tensors: host data, no sync
        x.tolist()
    assert counted.syncs == 0, counted
    assert torch.Tensor.tolist is original  # restored
