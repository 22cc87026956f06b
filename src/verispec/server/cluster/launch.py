"""Start (or join) Ray, deploy the ingress and the engine replicas on Ray Serve, serve until SIGINT/SIGTERM.

Rules: without --ray-address a local Ray instance is started on this machine (and stopped at the end); with
one, the cluster at that address is joined and only this application is removed at the end. A replica
reserves --cpus-per-replica CPUs (and one GPU when --device is cuda) and runs PyTorch on that many threads
unless --threads says otherwise; a local instance offers at least as many CPUs as the replicas reserve, so
two replicas on a 2-core machine start and share its cores.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import threading

from ...errors import VerispecError

APP_NAME = "verispec"
INSTALL_HINT = 'pip install "verispec[cluster]" (or: pip install -e ".[cluster]" in a checkout)'
HEALTH_CHECK_SECONDS = 2.0
CONNECT_SECONDS = 5.0
log = logging.getLogger("verispec.server")


def check_cluster_arguments(args: argparse.Namespace) -> None:
    """One line for each mistake, before Ray or any model starts."""
    if args.replicas is None:
        for flag in ("ray_address", "min_replicas", "max_replicas", "cpus_per_replica"):
            if getattr(args, flag) is not None:
                raise VerispecError(f"--{flag.replace('_', '-')} needs --replicas N (a Ray Serve cluster)")
        return
    if args.replicas < 1:
        raise VerispecError(f"--replicas must be >= 1, got {args.replicas}")
    if args.cpus_per_replica is not None and not (math.isfinite(args.cpus_per_replica) and args.cpus_per_replica > 0):
        raise VerispecError(f"--cpus-per-replica must be > 0, got {args.cpus_per_replica}")
    low, high = args.min_replicas, args.max_replicas
    if (low is None) != (high is None):
        raise VerispecError("--min-replicas and --max-replicas go together (Ray Serve's autoscaling range)")
    if low is not None and not 0 <= low <= args.replicas <= high:
        given = f"{low}, {args.replicas}, {high}"
        raise VerispecError(f"need 0 <= --min-replicas <= --replicas <= --max-replicas, got {given}")
    if args.ray_address is not None and not args.ray_address.strip():
        raise VerispecError("--ray-address is empty: give 'auto', HOST:PORT or ray://HOST:PORT, or leave it out")


def serve_cluster(args: argparse.Namespace, model_name: str, allowed_hosts: frozenset[str] | None) -> int:
    try:
        import ray
        from ray import serve
    except ModuleNotFoundError:
        message = f"verispec serve --replicas needs Ray Serve (package 'ray'), not installed; fix: {INSTALL_HINT}"
        raise VerispecError(message) from None
    _init_ray(ray, args)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_application(args, model_name, allowed_hosts), name=APP_NAME, route_prefix="/")
        log.info(
            "serving %s on http://%s:%d with %d replicas (Ray Serve)", model_name, args.host, args.port, args.replicas
        )
        _wait_for_stop_signal()
    finally:
        if args.ray_address is None:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
        ray.shutdown()
    return 0


def build_application(args: argparse.Namespace, model_name: str, allowed_hosts: frozenset[str] | None):
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ingress import Ingress, IngressConfig
    from .metrics import ROUTING_STATS_SECONDS
    from .replica import EngineReplica
    from .router import PrefixAffinityRouter

    cpus = args.cpus_per_replica or 1.0
    if args.threads is None:  # each replica's copy of the arguments; the caller's stay as given
        args = argparse.Namespace(**{**vars(args), "threads": max(1, int(cpus))})
    capacity = args.max_num_seqs + args.max_queue  # a replica never gets more than its slots and queue hold
    router = RequestRouterConfig(
        request_router_class=PrefixAffinityRouter,
        request_router_kwargs={"spill_margin": args.max_num_seqs},
        request_routing_stats_period_s=ROUTING_STATS_SECONDS,
    )
    scale: dict = {"num_replicas": args.replicas}
    if args.min_replicas is not None:
        scale = {"autoscaling_config": {
            "min_replicas": args.min_replicas, "max_replicas": args.max_replicas, "initial_replicas": args.replicas,
            "target_ongoing_requests": args.max_num_seqs,  # one full batch per replica, the queue empty
        }}  # fmt: skip
    engine = serve.deployment(
        EngineReplica, name="engine", max_ongoing_requests=capacity, max_queued_requests=-1,  # the ingress admits
        request_router_config=router, health_check_period_s=HEALTH_CHECK_SECONDS,
        graceful_shutdown_timeout_s=args.drain_timeout,
        ray_actor_options={"num_cpus": cpus, "num_gpus": 1 if args.device.startswith("cuda") else 0}, **scale,
    )  # fmt: skip
    most = args.max_replicas or args.replicas
    ingress = serve.deployment(
        serve.ingress()(Ingress), name="ingress", ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=capacity * most + args.max_queue + 64,  # +64: /health and /metrics stay answered
    )  # fmt: skip
    config = IngressConfig(
        args.api_key, allowed_hosts, max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
        replica_capacity=capacity, max_queue=args.max_queue, replicas=args.replicas,
        metrics_key=args.metrics_key,
    )  # fmt: skip
    return ingress.bind(engine.bind(args, model_name, allowed_hosts), config)


def _init_ray(ray, args: argparse.Namespace) -> None:
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
    if args.ray_address is None:
        most = args.max_replicas or args.replicas
        cpus = max(os.cpu_count() or 1, math.ceil(most * (args.cpus_per_replica or 1.0)))
        ray.init(address="local", num_cpus=cpus, **quiet)
        return
    _check_reachable(args.ray_address)
    try:
        ray.init(address=args.ray_address, **quiet)
    except Exception as exc:  # ConnectionError, ValueError, TimeoutError...: all mean "not reachable as given"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VerispecError(f"cannot join the Ray cluster at {args.ray_address!r}: {first}") from None


def _check_reachable(address: str) -> None:
    """HOST:PORT must accept a connection: Ray itself retries an unreachable address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and the like: ray.init says at once when no cluster runs
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise VerispecError(f"cannot join the Ray cluster at {address!r}: {exc.strerror or exc}") from None


def _wait_for_stop_signal() -> None:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
