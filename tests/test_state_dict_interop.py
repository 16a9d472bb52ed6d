"""State dicts of the min/max observers across frameworks, and one set of checks for all of them
(issue 11, items 5, 6 and 14).

- A torch, NumPy or JAX observer's ``state_dict()`` loads into the same class of every other framework
  as it is (no conversion by hand), and the qparams then agree.
- The torch adapter refuses what the NumPy/JAX adapters refuse (NaN, zero, negative or subnormal ``eps``,
  ``min_val > max_val`` but on the moving averages, bool/complex entries, wrong shapes), with the same
  exception type, buffers untouched.
- A subnormal ``eps`` is refused by every constructor (XLA would flush it to zero: scale 0 on JAX only).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

from observers_core.adapters import _array_observers as numpy_observers  # noqa: E402
from observers_core.adapters import jax as jax_observers  # noqa: E402
from observers_core.adapters import torch as torch_observers  # noqa: E402

from conftest import to_numpy  # noqa: E402

CLASSES = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
           "MovingAveragePerChannelMinMaxObserver"]
FRAMEWORKS = {
    "torch": (torch_observers, lambda a: torch.from_numpy(a)),
    "numpy": (numpy_observers, lambda a: a),
    "jax": (jax_observers, jnp.asarray),
}


def _observer(framework: str, name: str, batches):
    module, asarray = FRAMEWORKS[framework]
    if framework == "numpy" and name == "HistogramObserver":
        from observers_core.adapters import _array_histogram as module
    obs = getattr(module, name)()
    for b in batches:
        obs(asarray(b))
    return obs


def _entries(obs) -> dict:
    return {k: to_numpy(v) for k, v in obs.state_dict().items()}


def _qparams(obs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [to_numpy(v).astype(np.float64) for v in obs.calculate_qparams()]


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("source", list(FRAMEWORKS))
@pytest.mark.parametrize("target", list(FRAMEWORKS))
def test_state_dicts_load_in_every_direction(name, source, target):
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((6, 5)).astype(np.float32) * s for s in (1.0, 4.0)]
    src = _observer(source, name, batches)
    dst = _observer(target, name, [np.zeros((6, 5), np.float32)])  # some other state first
    dst.load_state_dict(src.state_dict())
    for key, value in _entries(src).items():
        np.testing.assert_array_equal(_entries(dst)[key], value)
    for a, b in zip(_qparams(dst), _qparams(src)):
        np.testing.assert_array_equal(a, b)


def _corruptions(per_channel: bool):
    """(description, key, bad value as numpy) — each must be refused by every adapter."""
    shape = (5,) if per_channel else ()
    wrong_shape = (3,) if per_channel else (2,)
    return [
        ("nan eps", "eps", np.array([np.nan], np.float32)),
        ("zero eps", "eps", np.array([0.0], np.float32)),
        ("negative eps", "eps", np.array([-1.0], np.float32)),
        ("subnormal eps", "eps", np.array([1e-40], np.float32)),
        ("min > max", "min_val", np.full(shape, 1e30, np.float32)),
        ("bool entry", "max_val", np.ones(shape, bool)),
        ("complex entry", "max_val", np.ones(shape, np.complex64)),
        ("wrong shape", "max_val", np.ones(wrong_shape, np.float32)),
    ]


@pytest.mark.parametrize("name", [*CLASSES, "HistogramObserver"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_corrupted_state_dicts_are_refused_alike(name, framework):
    """(The moving averages load ``min_val > max_val``: they reach it themselves, see the next test.) The
    array HistogramObserver took a subnormal ``eps`` the torch one refuses: one load for every family now."""
    per_channel = "PerChannel" in name
    rng = np.random.default_rng(1)
    obs = _observer(framework, name, [rng.standard_normal((6, 5)).astype(np.float32)])
    good = _entries(obs)
    kinds = {}
    corruptions = [c for c in _corruptions(per_channel) if not (name.startswith("MovingAverage") and c[0] == "min > max")]
    for description, key, bad in corruptions:
        state_dict = dict(good)
        state_dict[key] = bad if framework != "torch" or bad.dtype != np.complex64 else torch.from_numpy(bad)
        with pytest.raises((ValueError, TypeError)) as info:
            obs.load_state_dict(state_dict)
        kinds[description] = type(info.value)
        for k, v in _entries(obs).items():  # untouched
            np.testing.assert_array_equal(v, good[k])
    expected = {d: (TypeError if d in ("bool entry", "complex entry") else ValueError) for d, _, _ in corruptions}
    assert kinds == expected


@pytest.mark.parametrize("name", ["MinMaxObserver", "MovingAverageMinMaxObserver"])
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_one_element_per_tensor_entry_loads_as_its_value(name, framework):
    """``nn.Module``'s loader turns a one-element ``(1,)`` entry into the 0-d buffer, so torch.ao's per-tensor
    observers load ``min_val=[v]``: every framework's does too (they refused it), with torch.ao's state and
    qparams after one more batch; ``(2,)`` stays refused (test above)."""
    x = np.linspace(-3.0, 5.0, 12, dtype=np.float32).reshape(3, 4)
    loaded = {"eps": np.array([np.finfo(np.float32).eps], np.float32), "min_val": np.array([-1.0], np.float32),
              "max_val": np.array([2.0], np.float32)}
    tao = getattr(torch.ao.quantization.observer, name)()
    tao.load_state_dict({k: torch.from_numpy(v) for k, v in loaded.items()})
    tao(torch.from_numpy(x))
    module, asarray = FRAMEWORKS[framework]
    obs = getattr(module, name)()
    obs.load_state_dict(loaded)
    assert _entries(obs)["min_val"].shape == ()
    obs(asarray(x))
    for key, value in tao.state_dict().items():
        np.testing.assert_array_equal(_entries(obs)[key], value.numpy())
    for a, b in zip(_qparams(obs), _qparams(tao)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["MovingAverageMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"])
@pytest.mark.parametrize("source", list(FRAMEWORKS))
def test_a_moving_average_that_overflowed_saves_and_loads_everywhere(name, source):
    """torch's ``x + c (t - x)`` overflows float32 for finite ranges of opposite signs beyond 8.5e37 and leaves
    ``min_val > max_val`` (here ``min_val = +inf`` and a finite ``max_val``; docs/torch.md, Differences from torch.ao).
    Every framework's observer reaches that state, as torch.ao's does, and its ``state_dict`` loads into the
    same class of every framework (found by the adversarial machine: the checks refused it as corrupted)."""
    batches = [np.array([[-3.0e38, 1.0], [2.0, 3.0]], np.float32), np.full((2, 2), 3.0e38, np.float32)]
    kwargs = dict(ch_axis=1) if "PerChannel" in name else {}
    tao = getattr(torch.ao.quantization.observer, name)(averaging_constant=0.5, **kwargs)
    for b in batches:
        tao(torch.from_numpy(b))
    module, asarray = FRAMEWORKS[source]
    src = getattr(module, name)(averaging_constant=0.5, **kwargs)
    for b in batches:
        src(asarray(b))
    saved = _entries(src)
    for key in ("min_val", "max_val"):
        np.testing.assert_array_equal(saved[key], tao.state_dict()[key].numpy())  # torch.ao's state, bit for bit
    assert np.any(saved["min_val"] > saved["max_val"]) and np.any(saved["min_val"] == np.inf)
    for target in FRAMEWORKS:
        dst = _observer(target, name, [np.zeros((2, 2), np.float32)])
        dst.load_state_dict(src.state_dict())
        for key, value in saved.items():
            np.testing.assert_array_equal(_entries(dst)[key], value)


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
@pytest.mark.parametrize("name", ["MinMaxObserver", "PerChannelMinMaxObserver", "HistogramObserver"])
def test_subnormal_eps_is_refused_everywhere(framework, name):
    module, _ = FRAMEWORKS[framework]
    if framework == "numpy" and name == "HistogramObserver":
        from observers_core.adapters import _array_histogram as module
    with pytest.raises(ValueError, match="eps=1e-40"):
        getattr(module, name)(eps=1e-40)
    getattr(module, name)(eps=2.0**-126)  # float32's smallest normal is fine


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_symmetric_zero_point_beyond_int32_is_refused_everywhere(framework):
    """Issue 11 item 11: quint8 symmetric with quant_max = 2**32 has zero point 2**31, which wrapped to
    -2**31 on JAX (int32 without x64) and not elsewhere; every backend now refuses it."""
    module, _ = FRAMEWORKS[framework]
    dtype, qscheme = ("quint8", "per_tensor_symmetric") if framework != "torch" else (torch.quint8, torch.per_tensor_symmetric)
    with pytest.raises(ValueError, match="symmetric zero point"):
        module.MinMaxObserver(dtype=dtype, qscheme=qscheme, quant_min=0, quant_max=2**32)
    module.MinMaxObserver(dtype=dtype, qscheme=qscheme, quant_min=0, quant_max=2**31)  # zero point 2**30 fits


@pytest.mark.parametrize("name, kwargs", [
    ("MinMaxObserver", {}), ("MovingAveragePerChannelMinMaxObserver", dict(ch_axis=0)), ("HistogramObserver", {}),
    ("KLObserver", {}), ("MixObserver", {}), ("PerGroupMinMaxObserver", dict(group_size=4)),
    ("FixedQParamsObserver", dict(scale=0.1, zero_point=0)),
])
def test_a_state_dict_missing_or_adding_a_key_changes_nothing(name, kwargs):
    """torch's strict ``load_state_dict`` copies the entries present before it raises for a missing or an
    unexpected one (torch.ao's observers end half loaded); ours raise the same RuntimeError with every
    buffer as it was (found by the adversarial machine: a PerGroupMinMaxObserver took another state's
    min_val; for an extra key, a PerBlockMXObserver's NaN statistics took NumPy's NaN bits)."""
    import torch

    from observers_core.adapters import torch as tobs

    observer, other = getattr(tobs, name)(**kwargs), getattr(tobs, name)(**kwargs)
    observer(torch.randn(3, 8))
    other(torch.randn(3, 8) * 5 + 1)
    before = {k: v.clone() for k, v in observer.state_dict().items()}
    for missing in other.state_dict():
        partial = other.state_dict()  # (with its version metadata: a version-1 dict may lack eps)
        del partial[missing]
        with pytest.raises(RuntimeError, match="Missing key"):
            observer.load_state_dict(partial)
        after = observer.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), f"missing {missing!r} changed the state"
    if name == "MovingAveragePerChannelMinMaxObserver":  # (the docs/torch.md row: torch.ao's loads it silently)
        import torch.ao.quantization.observer as tao

        theirs, partial = getattr(tao, name)(**kwargs), other.state_dict()
        del partial["eps"]
        assert theirs.load_state_dict(partial).missing_keys == []
    extra = other.state_dict()
    extra["stray"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        observer.load_state_dict(extra)
    after = observer.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "an unexpected key let the other state in"


@pytest.mark.parametrize("name, kwargs", [
    ("MinMaxObserver", {}), ("MovingAveragePerChannelMinMaxObserver", dict(ch_axis=0)), ("HistogramObserver", {}),
    ("KLObserver", {}), ("MixObserver", {}), ("PerGroupMinMaxObserver", dict(group_size=4)),
    ("FixedQParamsObserver", dict(scale=0.1, zero_point=0)),
])
def test_a_non_strict_load_copies_the_entries_present(name, kwargs):
    """``load_state_dict(strict=False)`` copies the entries present and keeps the buffers of the missing
    one, which it reports, as torch's does, bit for bit as torch.ao's class where there is one (torch passes
    ``strict=True`` to every module's own load, so the strict guard above had restored everything: such a
    load changed nothing). A partial load whose entries make, with the buffers kept, a state that a whole
    load refuses (``min_val > max_val``) raises ``ValueError`` with the buffers as they were."""
    import torch.ao.quantization.observer as tao

    from observers_core.adapters import torch as tobs

    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 8, generator=g) * 2 - 1  # kept entries in [-1, 1]; every group, row and tensor of the
    y = (torch.rand(3, 8, generator=g) * 5 + 5) * torch.tensor([1.0, -1.0] * 4)  # loaded ones spans [-5, 5]
    libraries = [tobs] + ([tao] if hasattr(tao, name) else [])
    for missing in getattr(tobs, name)(**kwargs).state_dict():
        ends = []
        for library in libraries:
            observer, other = getattr(library, name)(**kwargs), getattr(library, name)(**kwargs)
            observer(x)
            other(y)
            before = {k: v.clone() for k, v in observer.state_dict().items()}
            partial = other.state_dict()
            del partial[missing]
            result = observer.load_state_dict(partial, strict=False)
            after = observer.state_dict()
            assert all(torch.equal(after[k], partial[k] if k in partial else before[k]) for k in before), missing
            ends.append(after)
            if library is tobs:
                assert result.missing_keys == [missing] and result.unexpected_keys == []
        assert all(torch.equal(ends[0][k], ends[-1][k]) for k in ends[0]), f"differs from torch.ao's ({missing})"
    if "max_val" in getattr(tobs, name)(**kwargs).state_dict() and "MovingAverage" not in name:
        observer, other = getattr(tobs, name)(**kwargs), getattr(tobs, name)(**kwargs)
        observer(x)
        other(x + 100)  # its min_val with the kept max_val: min > max
        before = {k: v.clone() for k, v in observer.state_dict().items()}
        partial = other.state_dict()
        del partial["max_val"]
        with pytest.raises(ValueError, match="min_val"):
            observer.load_state_dict(partial, strict=False)
        after = observer.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), "a refused partial load changed the state"
