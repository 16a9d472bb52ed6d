"""The torch CUDA path (what a torch observer runs on CUDA: the Triton kernels where a step has them, else
every branch computed with ``where``, no host shortcut, no compiled host kernel) run on CPU tensors must
give the host path's state bit for bit.

CUDA runs this path in the GPU tests only; this test covers it on every machine, inside
:func:`observers_core.testing.cuda_path_on_cpu` (the Triton kernels through Triton's interpreter); the
sequences exercise what the branch-free logic decides: the first batch, a
single-valued state (also at float32's maximum) and its move onto a wider range (the point mass),
growing and unchanged ranges, +/-inf, NaN, integer and float16 batches, and ranges near float32's limit;
a hypothesis test then draws random sequences of the adversarial batch kinds
(``OBSERVERS_CORE_FUZZ_EXAMPLES=N``: N random examples per observer instead of the 10 fixed ones).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from observers_core.adapters import torch as tobs  # noqa: E402
from observers_core.testing import cuda_path_on_cpu  # noqa: E402

from _adversarial_strategies import KINDS, make_batch  # noqa: E402
from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

_FUZZ_EXAMPLES = int(os.environ.get("OBSERVERS_CORE_FUZZ_EXAMPLES", "0") or 0)


def sequences() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape, scale=1.0: torch.randn(*shape, generator=g) * scale  # noqa: E731
    return {
        "growing": [randn(8, 64, scale=s) for s in (1.0, 3.0, 0.5, 10.0)],
        "point": [torch.full((8, 64), 0.75)],  # the single value binned on torch.histc's widened range
        "point_at_float32_max": [torch.full((8, 64), torch.finfo(torch.float32).max)],  # no wider range: nothing counted
        "point_then_wider": [torch.full((8, 64), 0.75), torch.full((8, 64), 0.75), randn(8, 64)],
        "point_then_one_other_value": [torch.full((8, 64), -2.0), torch.full((8, 64), 5.0), randn(8, 64)],
        "nonfinite": [randn(8, 64), torch.tensor([[float("inf"), -float("inf"), 1.0, 0.5] * 16] * 8), randn(8, 64)],
        "nan": [randn(8, 64), torch.tensor([[float("nan"), 2.0] * 32] * 8), randn(8, 64)],
        "huge": [randn(8, 64, scale=1e37), randn(8, 64, scale=3e38).clamp(-3.4e38, 3.4e38), randn(8, 64)],
        "int_and_half": [torch.randint(-50, 50, (8, 64), generator=g), randn(8, 64, scale=20).half()],
    }


def run(name: str, kwargs: dict, batches: list) -> dict[str, np.ndarray] | str:
    """The observer's state_dict after the batches, or the name of the exception one of them raised."""
    obs = getattr(tobs, name)(**kwargs)
    for x in batches:
        try:
            obs(x)
        except (ValueError, TypeError, RuntimeError) as err:
            return type(err).__name__
    return {key: value.detach().numpy().copy() for key, value in obs.state_dict().items()}


def assert_paths_agree(config, batches, kwargs, what: str) -> None:
    name = config[0]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = run(name, kwargs, batches)
        with cuda_path_on_cpu():
            device = run(name, kwargs, batches)
    if isinstance(host, str) or isinstance(device, str):
        assert host == device, f"{config_id(config)} {what}: host {host!r}, device {device!r}"
        return
    assert host.keys() == device.keys()
    for key in host:
        np.testing.assert_array_equal(device[key], host[key], err_msg=f"{config_id(config)} {what}: {key}")


@pytest.mark.parametrize("sequence", list(sequences()))
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_device_path_equals_host_path(config, sequence):
    name, kwargs = config
    kwargs = dict(kwargs, ignore_nonfinite=sequence != "nan") if "ignore_nonfinite" in kwargs else kwargs
    assert_paths_agree(config, sequences()[sequence], kwargs, sequence)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@settings(max_examples=_FUZZ_EXAMPLES or 10, derandomize=not _FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_device_path_equals_host_path_on_adversarial_batches(config, data):
    """Three to five batches of the adversarial kinds (tests/_adversarial_strategies.py: huge, subnormal,
    float32's limit, NaN, inf, constant, mixed...) in float32, float64, float16 or int8."""
    steps = data.draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**16),
                                         st.sampled_from(["float32", "float32", "float64", "float16", "int8"])),
                               min_size=3, max_size=5), label="batches")
    batches = [torch.from_numpy(make_batch(kind, seed, (4, 32), dtype, ch_axis=1)) for kind, seed, dtype in steps]
    assert_paths_agree(config, batches, config[1], str(steps))


def test_cuda_path_on_cpu_switches_the_one_predicate_and_restores_it():
    import array_api_compat.numpy as nxp
    import array_api_compat.torch as txp

    from observers_core._namespace import on_host, torch_cuda_path

    x = torch.ones(3)
    assert on_host(x, txp) and not torch_cuda_path(x)
    with cuda_path_on_cpu():
        assert torch_cuda_path(x) and not on_host(x, txp)
        assert on_host(np.ones(3), nxp)  # NumPy arrays stay on the host path
        with cuda_path_on_cpu():
            assert torch_cuda_path(x)
        assert torch_cuda_path(x)  # the inner block restored the outer state
    assert on_host(x, txp) and not torch_cuda_path(x)
    with pytest.raises(RuntimeError), cuda_path_on_cpu():
        raise RuntimeError("restored on errors too")
    assert not torch_cuda_path(x)
