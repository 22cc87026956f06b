"""PrefixAffinityRouter: Ray Serve's request router for the engine replicas.

Rules, per request (its prefix keys come from prefix.py, computed by the ingress):
1. The replicas known to hold the longest of its prefixes (they served a request with that prefix) come
   first, so the engine's prefill reuse and the suffix drafter's index hit; among them the least loaded.
2. A holder whose queue is `spill_margin` requests longer than the least loaded replica's is passed over:
   waiting behind a full batch costs more than recomputing a prefix. The replica that then serves the request
   becomes a holder too, so a hot prefix spreads as its load needs.
3. Otherwise (or when every holder is full) the less loaded of two random replicas, as Ray Serve's default.
The table of holders lives in this process (one ingress); it forgets the oldest prefixes beyond `max_prefixes`.
Ray Serve copies this module by value into the process that routes; what the ingress must see (the counters,
the routers) is in shared.py, which is imported by name.
Each routed request with a prefix counts as a hit (a holder served it), a miss (a holder existed but was
passed over or full) or cold (no replica held it): the affinity hit rate is hits / (hits + misses).
"""

from __future__ import annotations

import random
from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import shared
from .protocol import Forwarded

MAX_HOLDERS = 4  # replicas remembered per prefix, most recent last
MAX_PENDING = 10_000  # decisions kept for requests not routed yet (a cancelled one never is)


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, spill_margin: int = 8, max_prefixes: int = 100_000) -> None:
        self.spill_margin = spill_margin
        self.max_prefixes = max_prefixes
        self.holders: OrderedDict[int, list[ReplicaID]] = OrderedDict()
        self.pending: OrderedDict[str, frozenset[ReplicaID] | None] = OrderedDict()
        self.counts = {"hit": 0, "miss": 0, "cold": 0}
        shared.ROUTERS.append(self)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        forwarded = _forwarded(pending_request)
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # all ranks tried: wait before the next round
        holders = self._holders(forwarded.prefix) if forwarded is not None else None
        if pending_request is not None and forwarded is not None and forwarded.prefix:
            self._remember_decision(pending_request.metadata.internal_request_id, holders)
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        if not holders:
            return [two]
        least = min(self._load(r.replica_id) for r in candidate_replicas)
        near = [r for r in candidate_replicas if r.replica_id in holders]
        near = [r for r in near if self._load(r.replica_id) < least + self.spill_margin]
        return [near, two] if near else [two]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        forwarded = _forwarded(pending_request)
        if forwarded is None or not forwarded.prefix:
            return
        holders = self.pending.pop(pending_request.metadata.internal_request_id, None)
        outcome = "cold" if not holders else "hit" if replica_id in holders else "miss"
        self.counts[outcome] += 1
        shared.ROUTED.labels(outcome=outcome).inc()
        judged = self.counts["hit"] + self.counts["miss"]
        shared.HIT_RATE.set(self.counts["hit"] / judged if judged else 0.0)
        self._record(forwarded.prefix, replica_id)

    def _holders(self, prefix: tuple[int, ...]) -> frozenset[ReplicaID] | None:
        """The live replicas holding the longest known prefix of `prefix` (None: no replica holds any)."""
        for key in reversed(prefix):
            alive = [r for r in self.holders.get(key, ()) if r in self._replicas]
            if alive:
                return frozenset(alive)
        return None

    def _record(self, prefix: tuple[int, ...], replica_id: ReplicaID) -> None:
        for key in prefix:
            holders = [r for r in self.holders.pop(key, []) if r != replica_id and r in self._replicas]
            self.holders[key] = [*holders[-(MAX_HOLDERS - 1) :], replica_id]
        while len(self.holders) > self.max_prefixes:
            self.holders.popitem(last=False)

    def _remember_decision(self, request_id: str, holders: frozenset[ReplicaID] | None) -> None:
        self.pending[request_id] = holders
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)

    def _load(self, replica_id: ReplicaID) -> int:
        """Requests the replica runs or queues, as last seen by this router (0 before any probe)."""
        return self.replica_queue_len_cache.get(replica_id) or 0


def _forwarded(pending_request: PendingRequest | None) -> Forwarded | None:
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    return first if isinstance(first, Forwarded) else None
