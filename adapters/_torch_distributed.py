"""Distributed calibration on ``torch.distributed`` (gloo on CPU, NCCL on GPU): the torch
:class:`observers_core.Collective`, the per-batch ``sync`` opt-in of every torch observer of ours and
:func:`sync_observers`, which merges observers across ranks after calibration.

Per batch (``sync=True``, or Horizon's ``is_sync_quantize=True``): ``forward`` hands a
:class:`TorchCollective` to the core update, so every rank ends each batch with the state one process
reaches on the concatenation of all ranks' batches (an empty batch still takes part). After the fact
(:func:`sync_observers`): every rank's states are gathered (one ``all_gather`` per buffer dtype) and
merged in rank order with the family merges, so every rank computes the same result.
"""

from __future__ import annotations

from functools import partial, reduce

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from observers_core import MinMaxState, minmax_merge
from observers_core._validate import INF, check_bool

__all__ = ["GroupCollective", "SyncMixin", "sync_observers"]


def _check_group(process_group: Any) -> Any:
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"process_group must be None (the default group) or a torch.distributed.ProcessGroup, "
            f"got {type(process_group).__name__}"
        )
    return process_group


def _check_initialized(owner: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{owner} needs torch.distributed initialised: call torch.distributed.init_process_group first"
        )


class GroupCollective:
    """:class:`observers_core.Collective` over ``torch.distributed.all_reduce`` on ``process_group``
    (``None``: the default group). Takes torch tensors or NumPy arrays (reduced through a tensor copy)
    and returns the same kind, shape and dtype; the input is never modified.

    ``min``/``max``: NaN wins (an entry NaN on any rank is NaN everywhere), made explicit because gloo's
    MIN/MAX with NaN depends on the order: one all-reduce MIN of twice the size, the values with NaN
    replaced by ``+inf`` next to a ``-1`` flag for NaN (``max(x)`` is ``-min(-x)``, exact). ``min_max(lo,
    hi)``: both in one all-reduce (for a core that asks for them together). ``sum``: one all-reduce
    (integers exactly).
    """

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = _check_group(process_group)

    def min(self, x: Any, /) -> Any:
        t, back = _as_tensor(x)
        return back(self._min(t))

    def max(self, x: Any, /) -> Any:
        t, back = _as_tensor(x)
        if t.is_floating_point():
            return back(-self._min(-t))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.process_group)
        return back(t)

    def min_max(self, lo: Any, hi: Any, /) -> tuple[Any, Any]:
        """``(min(lo), max(hi))`` in one all-reduce when both are floating of one dtype (else two)."""
        a, back_a = _as_tensor(lo)
        b, back_b = _as_tensor(hi)
        if not (a.is_floating_point() and a.dtype == b.dtype):
            return self.min(lo), self.max(hi)
        both = self._min(torch.cat([a.reshape(-1), -b.reshape(-1)]))
        return back_a(both[:a.numel()].reshape(a.shape)), back_b((-both[a.numel():]).reshape(b.shape))

    def sum(self, x: Any, /) -> Any:
        t, back = _as_tensor(x)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.process_group)
        return back(t)

    def _min(self, t: torch.Tensor) -> torch.Tensor:
        """The group's elementwise minimum of ``t`` (a fresh tensor: reduced in place), NaN winning."""
        if not t.is_floating_point():
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.process_group)
            return t
        nan = torch.isnan(t).reshape(-1)
        packed = torch.cat([torch.where(nan, INF, t.reshape(-1)), -nan.to(t.dtype)])
        dist.all_reduce(packed, op=dist.ReduceOp.MIN, group=self.process_group)
        n = t.numel()
        return torch.where(packed[n:] < 0, float("nan"), packed[:n]).reshape(t.shape)


def _as_tensor(x: Any) -> tuple[torch.Tensor, Any]:
    """A contiguous tensor copy of ``x`` (all_reduce works in place) and the function that turns the
    result back into ``x``'s kind."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone(memory_format=torch.contiguous_format), lambda t: t
    if isinstance(x, (np.ndarray, np.generic)):
        return torch.from_numpy(np.array(x, copy=True, order="C", ndmin=0)), lambda t: t.numpy()
    raise TypeError(f"x must be a torch.Tensor or a NumPy array, got {type(x).__name__}")


class _GroupRef:
    """A process group across ``copy.deepcopy`` (the same group: copies live in the same run) and
    pickling (dropped: a group belongs to one run; the unpickled observer uses the default group)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def __deepcopy__(self, memo: dict) -> "_GroupRef":
        return self

    def __reduce__(self) -> tuple:
        return (_GroupRef, (None,))


#: Attributes that make up an observer's configuration in the cross-rank check.
_CONFIG_ATTRS = ("dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "averaging_constant", "bins",
                 "upsample_rate", "ignore_nonfinite", "is_dynamic", "config", "spec")  # fmt: skip


class SyncMixin:
    """What every statistical torch observer of ours shares for distributed calibration: the keyword-only
    ``sync`` / ``process_group`` arguments (:meth:`_init_sync`), the collective ``forward`` passes to the
    core, and the hooks of :func:`sync_observers` (state buffers, merge, load), which families override.
    ``is_sync_quantize`` is Horizon's name for ``sync``."""

    #: The buffers :func:`sync_observers` merges (an empty buffer means "nothing seen" on that rank).
    _SYNC_BUFFERS: tuple[str, ...] = ("min_val", "max_val")

    def _init_sync(self, sync: Any, process_group: Any) -> None:
        self.sync = check_bool(sync, "sync")
        self.process_group = _check_group(process_group)
        self._sync_checked = False

    @property
    def is_sync_quantize(self) -> bool:
        return self.sync

    @is_sync_quantize.setter
    def is_sync_quantize(self, value: Any) -> None:
        self.sync = check_bool(value, "is_sync_quantize")

    def _collective(self) -> GroupCollective | None:
        """``None`` without ``sync``; otherwise the group's collective, after a one-time check (the first
        synced batch) that every rank's observer has this configuration: ``ValueError`` on every rank."""
        if not self.__dict__.get("sync", False):
            return None
        _check_initialized(f"{type(self).__name__}(sync=True, alias is_sync_quantize=True)")
        if not self._sync_checked:
            _check_same_everywhere([("observer", self._sync_fingerprint())], self.process_group, "sync=True")
            self._sync_checked = True
        return GroupCollective(self.process_group)

    def _sync_fingerprint(self) -> tuple:
        eps = self._buffers.get("eps")
        return (type(self).__qualname__, *(repr(getattr(self, a, None)) for a in _CONFIG_ATTRS),
                None if eps is None else eps.tolist())  # fmt: skip

    def _sync_state(self) -> dict[str, torch.Tensor]:
        """The non-empty state buffers by name."""
        return {name: self._buffers[name] for name in self._SYNC_BUFFERS if self._buffers[name].numel()}

    #: How the ranks' ``(min_val, max_val)`` merge: a function of the list of states in rank order.
    _REPLICA_MERGE = staticmethod(partial(reduce, minmax_merge))  # left to right, in rank order

    def _merge_replicas(self, states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The ranks' states (rank order; a rank that saw nothing lacks the keys) merged into one:
        ``_REPLICA_MERGE`` of ``min_val``/``max_val``."""
        return merge_keys(states, ("min_val", "max_val"), self._REPLICA_MERGE)

    def _load_synced(self, merged: dict[str, torch.Tensor]) -> None:
        for name, value in merged.items():
            buf = self._buffers[name]
            if buf.shape == value.shape:
                buf.copy_(value)
            else:  # the first data this rank holds: the shape and dtype of the ranks that saw data
                self._buffers[name] = value.to(device=buf.device)

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state["process_group"] = _GroupRef(state.get("process_group"))
        return state

    def __setstate__(self, state: dict) -> None:
        ref = state.get("process_group")
        state = {**state, "process_group": ref.group if isinstance(ref, _GroupRef) else ref, "_sync_checked": False}
        state.setdefault("sync", False)
        super().__setstate__(state)


def merge_keys(states: list[dict], keys: tuple[str, ...], merge: Any, wrap: Any = MinMaxState) -> dict:
    """``merge`` (a function of a list of states) of the ranks that hold every key of ``keys``, each state
    built as ``wrap(*values)``; the result flattened back to ``{key: value}`` (``{}`` when no rank does)."""
    present = [wrap(*(s[k] for k in keys)) for s in states if all(k in s for k in keys)]
    return dict(zip(keys, _flat(merge(present)))) if present else {}


def _flat(tree: Any) -> list:
    return [leaf for t in tree for leaf in _flat(t)] if isinstance(tree, tuple) else [tree]


def _check_same_everywhere(fingerprints: list, group: Any, what: str) -> list:
    """All ranks' ``fingerprints`` (all_gather_object); ``ValueError`` on every rank, naming the first
    difference, unless every rank has the same observers with the same configuration."""
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, fingerprints, group=group)
    for rank, theirs in enumerate(gathered[1:], 1):
        if len(theirs) != len(gathered[0]):
            raise ValueError(f"{what}: rank 0 has {len(gathered[0])} observers of ours but rank {rank} has "
                             f"{len(theirs)}; every rank must hold the same observers")  # fmt: skip
        for mine, other in zip(gathered[0], theirs):
            if mine[:2] != other[:2]:
                raise ValueError(f"{what}: observer {mine[0]!r} differs between rank 0 and rank {rank}: "
                                 f"{mine[1]} vs {other[1]}; every rank must hold the same observers with the "
                                 "same configuration")  # fmt: skip
    return gathered


def _layout_of(gathered: list, index: int, name: str) -> dict:
    """The agreed ``{key: (shape, dtype)}`` of observer ``index`` (union over the ranks that saw data);
    ``ValueError`` when two ranks hold a key with different shapes or dtypes."""
    layout: dict = {}
    for rank, entries in enumerate(gathered):
        for key, spec in entries[index][2].items():
            if layout.setdefault(key, (spec, rank))[0] != spec:
                raise ValueError(f"sync_observers: {name}.{key} has shape/dtype {spec} on rank {rank} but "
                                 f"{layout[key][0]} on rank {layout[key][1]}; every rank must observe "
                                 "tensors of the same shape")  # fmt: skip
    return {key: spec for key, (spec, _) in layout.items()}


def sync_observers(model: torch.nn.Module, process_group: Any = None) -> int:
    """Merges every observer of ours in ``model`` (eager ``prepare``, FX or PT2E prepared) across the
    ranks of ``process_group`` (``None``: the default group) after each rank calibrated on its own
    shard; returns the number of observers. Every rank ends with the same state:

    - MinMax / PerChannelMinMax / low-bit: ``minmax_merge`` (exact: the range of all shards);
    - MovingAverage(PerChannel)MinMax, Horizon's MinMax and the calibration observers' averaged range:
      the mean of the replicas (:func:`observers_core._minmax.mean_of_replicas`, a tree of
      ``moving_average_merge``; exact mean for 1, 2, 4, 8... ranks that saw data);
    - HistogramObserver: the family ``merge`` folded in rank order (torch's re-binning; exact when the
      ranges agree, else within the bound of :mod:`observers_core.families.histogram`);
    - KLObserver's accumulated histogram and range: ``kl_merge`` (exact); ``num_steps`` stays per rank.

    A rank that saw nothing contributes nothing. Observers with ``sync=True`` are left alone (every rank
    holds the same state already; merging it again would count histograms once per rank). One
    ``all_gather_object`` of a fingerprint (class, configuration, state shapes) checks the ranks agree
    (``ValueError`` on every rank otherwise), then one ``all_gather`` per buffer dtype, on the device of
    the observers' buffers (CUDA for NCCL)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_group(process_group)
    _check_initialized("sync_observers")
    observers = [(name, m) for name, m in model.named_modules() if isinstance(m, SyncMixin) and not m.sync]
    states = [m._sync_state() for _, m in observers]
    fingerprints = [(name, m._sync_fingerprint(), {k: (tuple(v.shape), str(v.dtype)) for k, v in s.items()})
                    for (name, m), s in zip(observers, states)]  # fmt: skip
    gathered = _check_same_everywhere(fingerprints, process_group, "sync_observers")
    layouts = [_layout_of(gathered, i, name) for i, (name, _) in enumerate(observers)]
    world = len(gathered)
    replicas: list[list[dict]] = [[{} for _ in range(world)] for _ in observers]
    by_dtype: dict[str, list] = {}
    for i, layout in enumerate(layouts):
        for key, (shape, dtype) in layout.items():
            by_dtype.setdefault(dtype, []).append((i, key, shape))
    device = next((b.device for _, m in observers for b in m.buffers()), torch.device("cpu"))
    for dtype_name, slots in sorted(by_dtype.items()):
        dtype = getattr(torch, dtype_name.removeprefix("torch."))
        local = torch.cat([states[i][key].reshape(-1).to(device=device, dtype=dtype) if key in states[i]
                           else torch.zeros(int(np.prod(shape)), dtype=dtype, device=device)
                           for i, key, shape in slots])  # fmt: skip
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local, group=process_group)
        for rank, flat in enumerate(out):
            for (i, key, shape), piece in zip(slots, flat.split([int(np.prod(s)) for _, _, s in slots])):
                if key in gathered[rank][i][2]:  # that rank saw data
                    replicas[i][rank][key] = piece.reshape(shape)
    for (_, m), states_i in zip(observers, replicas):
        m._load_synced(m._merge_replicas(states_i))
    return len(observers)
