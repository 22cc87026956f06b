"""Who is admitted next: requests (and sequences preempted to give their blocks back) wait per tenant, and the next
one admitted is the head of the tenant running the fewest sequences, so that one client's burst cannot hold another
client's single request behind it (max-min fairness over the engine's slots). Within a tenant, its members take turns
the same way (the member running the fewest first); within a member, first in first out, a preempted sequence ahead of
the member's new requests.

A tenant is who is served fairly (EngineRequest.tenant: the server's API key). A member is who a tenant serves
(EngineRequest.member: the OpenAI `user` field): it divides its tenant's share, never multiplies it, so a client that
names a new `user` on every request gets no more of the engine than one that names none. Requests of one tenant
share nothing on that account (what they may share is their partition's business).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


Owner = tuple[str, str]  # (tenant, member)


def per_tenant(running: Mapping[Owner, int]) -> Counter[str]:
    """Sequences running per tenant, from those running per (tenant, member)."""
    tenants: Counter[str] = Counter()
    for (tenant, _), count in running.items():
        tenants[tenant] += count
    return tenants


@dataclass
class _Waiting(Generic[T]):
    item: T
    owner: Owner
    arrival: float


@dataclass
class WaitingQueue(Generic[T]):
    """Waiting items per (tenant, member), in their order; `first` says whose turn it is."""

    queues: dict[Owner, deque[_Waiting[T]]] = field(default_factory=dict)
    size: int = 0

    def append(self, item: T, owner: Owner, arrival: float) -> None:
        self.queues.setdefault(owner, deque()).append(_Waiting(item, owner, arrival))
        self.size += 1

    def appendleft(self, item: T, owner: Owner, arrival: float) -> None:
        """`item` first of its member's (a preempted sequence resumes before the member's new requests)."""
        self.queues.setdefault(owner, deque()).appendleft(_Waiting(item, owner, arrival))
        self.size += 1

    def first(self, running: Mapping[Owner, int]) -> tuple[T, str] | None:
        """(the next item to admit, its tenant): the head of the tenant with the fewest sequences in `running` (counted
        per (tenant, member)), within it of the member with the fewest, the earliest arrival among those; None when
        nothing waits."""
        tenants = per_tenant(running)
        best = None
        for owner, queue in self.queues.items():
            rank = (tenants[owner[0]], running.get(owner, 0), queue[0].arrival)
            if best is None or rank < best[0]:
                best = (rank, queue[0])
        return None if best is None else (best[1].item, best[1].owner[0])

    def remove(self, item: T) -> bool:
        """Take `item` out wherever it waits; False when it does not."""
        for owner, queue in self.queues.items():
            for waiting in queue:
                if waiting.item is item:
                    queue.remove(waiting)
                    if not queue:
                        del self.queues[owner]
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


def fairness_victim(waiting_tenant: str, running: Mapping[Owner, int]) -> str | None:
    """The tenant that gives a slot up so that `waiting_tenant` gets one, or None: the tenant running the most
    sequences (however many members they are spread over), when it runs at least two more than `waiting_tenant` (so
    shares level out and no slot changes hands back and forth)."""
    tenants = per_tenant(running)
    if not tenants:
        return None
    richest = max(tenants, key=lambda tenant: (tenants[tenant], tenant))
    if richest == waiting_tenant or tenants[richest] < tenants[waiting_tenant] + 2:
        return None
    return richest
