"""An in-process :class:`observers_core.Collective` for tests: ``n`` threads, one per member, meet at a
barrier for every reduction (NaN wins in min/max, as the real collectives must do)."""

from __future__ import annotations

import threading
from typing import Any, Callable

import array_api_compat


class ThreadGroup:
    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list[Any] = [None] * n

    def member(self, rank: int) -> "ThreadMember":
        return ThreadMember(self, rank)


def _nan_wins(op: Callable) -> Callable:
    def reduce(a: Any, b: Any, xp: Any) -> Any:
        if not xp.isdtype(a.dtype, "real floating"):
            return op(a, b, xp)
        return xp.where(xp.isnan(a) | xp.isnan(b), a + b, op(a, b, xp))

    return reduce


class ThreadMember:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def _reduce(self, name: str, x: Any, op: Callable) -> Any:
        self.calls.append((name, tuple(x.shape)))
        group = self.group
        group.slots[self.rank] = x
        group.barrier.wait()
        values = list(group.slots)
        group.barrier.wait()
        xp = array_api_compat.array_namespace(x)
        out = values[0]
        for v in values[1:]:
            if tuple(v.shape) != tuple(x.shape) or v.dtype != x.dtype:
                raise ValueError(f"members disagree: {v.shape}/{v.dtype} vs {x.shape}/{x.dtype}")
            out = op(out, v, xp)
        return out

    def min(self, x: Any) -> Any:
        return self._reduce("min", x, _nan_wins(lambda a, b, xp: xp.minimum(a, b)))

    def max(self, x: Any) -> Any:
        return self._reduce("max", x, _nan_wins(lambda a, b, xp: xp.maximum(a, b)))

    def sum(self, x: Any) -> Any:
        return self._reduce("sum", x, lambda a, b, xp: a + b)


def run_members(n: int, fn: Callable[[int, ThreadMember], Any]) -> list[Any]:
    """``[fn(rank, member) for rank in range(n)]``, each in its own thread; the first error is raised."""
    group = ThreadGroup(n)
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            out[rank] = fn(rank, group.member(rank))
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
