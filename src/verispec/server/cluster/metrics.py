"""The replicas' metrics, merged for the ingress's /metrics: every series of every replica, labelled
replica="<id>" (sum them with `sum without (replica) (...)`), plus verispec_cluster_replica_info{replica, pid}.

They come from the replicas' routing statistics (replica.py's record_routing_stats), which Ray Serve sends to
this process's router every ROUTING_STATS_SECONDS; a replica that has not reported yet shows only its info.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from .shared import ROUTERS

ROUTING_STATS_SECONDS = 1.0


def replica_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(_replica_stats()))
    return generate_latest(registry)


def _replica_stats() -> dict[str, dict]:
    """Replica id -> its latest routing statistics, over this process's routers (one per handle): a router that
    has not heard from a replica yet never hides what another one has."""
    stats: dict[str, dict] = {}
    for router in ROUTERS:
        for replica_id, replica in router.curr_replicas.items():
            if replica.routing_stats or replica_id.unique_id not in stats:
                stats[replica_id.unique_id] = replica.routing_stats or {}
    return stats


class _Merged:
    def __init__(self, stats: dict[str, dict]) -> None:
        self.stats = stats

    def collect(self):
        about = "One per live engine replica: its id and process"
        info = GaugeMetricFamily("verispec_cluster_replica_info", about, labels=["replica", "pid"])
        families: dict[str, Metric] = {}
        for replica, stats in sorted(self.stats.items()):
            info.add_metric([replica, str(stats.get("pid", ""))], 1.0)
            for family in text_string_to_metric_families(stats.get("metrics", "")):
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    labels = {**sample.labels, "replica": replica}
                    merged.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        yield info
        yield from families.values()
