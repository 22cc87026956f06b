"""Who is admitted next: requests (and sequences preempted to give their blocks back) wait per tenant, and the next
one admitted is the head of the tenant running the fewest sequences, so that one client's burst cannot hold another
client's single request behind it (max-min fairness over the engine's slots). Within a tenant, first in first out,
a preempted sequence ahead of the tenant's new requests.

A tenant is who is served fairly (EngineRequest.tenant: the server's API key, and the `user` field where sent);
requests of one tenant share nothing on that account (what they may share is their partition's business).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Waiting(Generic[T]):
    item: T
    tenant: str
    arrival: float


@dataclass
class WaitingQueue(Generic[T]):
    """Waiting items per tenant, in their order; `first` says whose turn it is."""

    queues: dict[str, deque[_Waiting[T]]] = field(default_factory=dict)
    size: int = 0

    def append(self, item: T, tenant: str, arrival: float) -> None:
        self.queues.setdefault(tenant, deque()).append(_Waiting(item, tenant, arrival))
        self.size += 1

    def appendleft(self, item: T, tenant: str, arrival: float) -> None:
        """`item` first of its tenant's (a preempted sequence resumes before the tenant's new requests)."""
        self.queues.setdefault(tenant, deque()).appendleft(_Waiting(item, tenant, arrival))
        self.size += 1

    def first(self, running: Mapping[str, int]) -> tuple[T, str] | None:
        """(the next item to admit, its tenant): the head of the tenant with the fewest sequences in `running`, the
        earliest arrival among those; None when nothing waits."""
        best = None
        for tenant, queue in self.queues.items():
            rank = (running.get(tenant, 0), queue[0].arrival)
            if best is None or rank < best[0]:
                best = (rank, queue[0])
        return None if best is None else (best[1].item, best[1].tenant)

    def remove(self, item: T) -> bool:
        """Take `item` out wherever it waits; False when it does not."""
        for tenant, queue in self.queues.items():
            for waiting in queue:
                if waiting.item is item:
                    queue.remove(waiting)
                    if not queue:
                        del self.queues[tenant]
                    self.size -= 1
                    return True
        return False

    def clear(self) -> None:
        self.queues.clear()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[T]:
        return (waiting.item for queue in self.queues.values() for waiting in queue)


def fairness_victim(waiting_tenant: str, running: Mapping[str, int]) -> str | None:
    """The tenant that gives a slot up so that `waiting_tenant` gets one, or None: the tenant running the most
    sequences, when it runs at least two more than `waiting_tenant` (so shares level out and no slot changes hands
    back and forth)."""
    if not running:
        return None
    richest = max(running, key=lambda tenant: (running[tenant], tenant))
    if richest == waiting_tenant or running[richest] < running.get(waiting_tenant, 0) + 2:
        return None
    return richest
