"""State of this process's request routers that the ingress reads: the affinity counters and the routers
themselves. Ray Serve ships router.py by value (a copy of its globals travels with the class), so shared
objects live here, in a module both import by name."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()  # the ingress's /metrics renders it beside the replicas' metrics
ROUTED = Counter(
    "verispec_cluster_prefix_routed",
    "Requests with a prompt prefix of at least one block, by outcome: hit (a replica holding it served it), "
    "miss (one held it, another served it), cold (none held it)",
    ["outcome"],
    registry=REGISTRY,
)
HIT_RATE = Gauge(
    "verispec_cluster_prefix_hit_rate", "hits / (hits + misses) since start (prefix affinity)", registry=REGISTRY
)
ROUTERS: list = []  # this process's routers (one per handle), for the ingress's /metrics
