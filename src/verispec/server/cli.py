"""`verispec serve` and `verispec bench-serve` (the client, bench/serve.py), offered to verispec.cli."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal

from ..arguments import DRAFT_ARGUMENTS, add_draft_arguments, add_model_arguments, non_negative_int
from ..engine.methods import method_options
from ..engine.policy import POLICIES
from ..errors import VerispecError
from .cluster.launch import check_cluster_arguments
from .engine_from_args import build_scheduler, drafter_card, model_id
from .limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_GRAMMAR_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    KEEP_ALIVE_SECONDS,
    MAX_HEAD_BYTES,
)
from .partitions import SHARING


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    # a server meets agents' long prompts (Codex sends 6k tokens before the first word): the models' own context,
    # its blocks taken as requests write them
    parser.set_defaults(max_model_len=None)
    add_draft_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="model id clients use (default: from --model)")
    _engine_arguments(parser)
    _tenancy_arguments(parser)
    _http_arguments(parser)
    _cluster_arguments(parser)


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Batching, caches and drafting."""
    parser.add_argument("--max-num-seqs", type=int, default=8, help="requests decoded together (cache slots)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests waiting for a slot before 429")
    parser.add_argument(
        "--prefill-chunk", type=int, default=128, help="prompt tokens prefilled per scheduler step (chunked prefill)"
    )
    for option in method_options().values():  # the methods' own options (engine/methods.py), each its flag
        if option.name not in DRAFT_ARGUMENTS:
            parser.add_argument(option.flag, type=non_negative_int, default=option.default, help=option.help)
    parser.add_argument(
        "--token-trees",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="--speculative-method suffix: lookups after text that forked propose token trees, verified in one "
        "pass (default off: measured not to pay on our datasets; docs/repetition.md)",
    )
    parser.add_argument(
        "--answer-reuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the KV blocks of what the model wrote for the next turn of its conversation (default on; "
        "--no-answer-reuse: prompts only, as before)",
    )
    parser.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before serving, run one short request through every path (then forget it), so that the first "
        "client does not pay for faulting the weights in (default on)",
    )
    parser.add_argument(
        "--draft-policy", default="auto", choices=POLICIES, help="auto: draft only while it pays (docs/server.md)"
    )


def _tenancy_arguments(parser: argparse.ArgumentParser) -> None:
    """Who may use the server, and what requests may share."""
    parser.add_argument(
        "--api-key",
        action="append",
        help="require 'Authorization: Bearer <key>' on every /v1/ route and /metrics; repeat it for several keys, "
        "each a tenant of its own under --cache-sharing key (default: $VERISPEC_API_KEY, comma-separated; none: open)",
    )
    parser.add_argument(
        "--metrics-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on /metrics (server-wide figures: they show one tenant's traffic "
        "to another). Default: with one --api-key or none, that key; with several, /metrics is closed until this is "
        "set (default: $VERISPEC_METRICS_KEY)",
    )
    parser.add_argument(
        "--responses-store",
        default=None,
        metavar="PATH",
        help="an SQLite file keeping the Responses API's stored responses across restarts (default: kept in memory)",
    )
    parser.add_argument(
        "--responses-store-limits",
        default=None,
        metavar="COUNT,BYTES,DAYS",
        help="the most responses kept, their bytes and the days each is kept (default 10000,256MiB,30); past a bound "
        "the writer's own oldest go first while it holds more than its fair share, then the largest holder's",
    )
    parser.add_argument(
        "--cache-sharing",
        default="key",
        choices=SHARING,
        help="which requests may draft from each other's outputs and reuse each other's prefilled prompts: global "
        "(all), key (those sent with the same API key; default), user (and the same OpenAI 'user' field; requests "
        "without one share nothing), none (nothing). A request's 'cache_salt' narrows it further (docs/server.md)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default=None,
        help="comma-separated names the Host header may carry ('*' = any; default: the --host address and the "
        "loopback names, or any when --host is 0.0.0.0 or ::)",
    )


def _http_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP front's limits and the log."""
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds SIGTERM waits for requests")
    parser.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body read (413 beyond; default {DEFAULT_MAX_BODY_BYTES})",
    )  # fmt: skip
    parser.add_argument(
        "--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
        help=f"seconds a request body may take to arrive (408 beyond; default {DEFAULT_BODY_TIMEOUT:g})",
    )  # fmt: skip
    parser.add_argument(
        "--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
        help="seconds a connection may take to send a request's line and headers, from its start or its previous "
        f"answer; then it is closed (default {DEFAULT_HEADER_TIMEOUT:g})",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
        help=f"connections open at once; more are closed as they arrive (default {DEFAULT_MAX_CONNECTIONS})",
    )  # fmt: skip
    parser.add_argument(
        "--grammar-timeout", type=float, default=DEFAULT_GRAMMAR_TIMEOUT,
        help=f"seconds a new structured-output grammar may take to compile (400 beyond; {DEFAULT_GRAMMAR_TIMEOUT:g})",
    )  # fmt: skip
    parser.add_argument(
        "--grammar-workers", type=int, default=1, help="processes that check new grammars, so none can crash the server"
    )
    parser.add_argument(
        "--parse-special", action="store_true",
        help="let chat message contents spell control tokens such as <|im_start|> (off: they are text, so a user "
        "cannot write a system turn)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group('cluster (Ray Serve; pip install "verispec[cluster]"; docs/cluster.md)')
    cluster.add_argument("--replicas", type=int, default=None, help="engine replicas behind one address")
    cluster.add_argument(
        "--ray-address", default=None, help="join this Ray cluster ('auto' or HOST:PORT; default: start one here)"
    )
    cluster.add_argument(
        "--cpus-per-replica", type=float, default=None, help="CPUs each replica reserves, and its threads (default 1)"
    )
    cluster.add_argument("--min-replicas", type=int, default=None, help="autoscaling on ongoing requests: at least")
    cluster.add_argument("--max-replicas", type=int, default=None, help="autoscaling on ongoing requests: at most")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerState, create_app
    from .guard import allowed_hosts_for
    from .http import bounded_protocol
    from .responses_store import ResponseStore

    hosts = _access_arguments(args)  # before the models load: a mistake here costs no wait
    _check_limits(args)
    check_cluster_arguments(args)
    name = args.served_model_name or model_id(args.model)
    if args.replicas is not None:
        from .cluster.launch import serve_cluster

        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
        return serve_cluster(args, name, allowed_hosts_for(args.host, hosts))
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    scheduler = build_scheduler(args)
    state = ServerState(
        scheduler, name, api_keys=args.api_key, cache_sharing=args.cache_sharing, metrics_key=args.metrics_key,
        responses=ResponseStore(args.responses_store, args.responses_store_limits),
        allowed_hosts=allowed_hosts_for(args.host, hosts),
        max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout, grammar_timeout=args.grammar_timeout,
        grammar_processes=args.grammar_workers, parse_special=args.parse_special, drafter=drafter_card(args),
    )  # fmt: skip
    target_bytes, draft_bytes = scheduler.kv_cache_bytes()
    drafter = state.drafter or {}
    logging.getLogger("verispec.server").info(
        "model %s (draft: %s, k=%d, policy %s) | %d slots x %d tokens | KV cache up to %.0f MiB target + %.0f MiB "
        "draft (%d blocks of %d tokens each, taken as used)",
        name, drafter.get("model") or drafter.get("method") or "none", args.num_speculative_tokens, args.draft_policy,
        args.max_num_seqs, scheduler.max_model_len, target_bytes / 2**20, draft_bytes / 2**20,
        scheduler.cache.num_blocks, scheduler.cache.block_size,
    )  # fmt: skip
    if state.tool_format is None:
        logging.getLogger("verispec.server").info(
            "tool calls: none (the chat template shows no tool-call format verispec parses; tools get a 400)"
        )
    else:
        logging.getLogger("verispec.server").info("tool calls: %s format", state.tool_format.name)
    if state.api_keys:
        logging.getLogger("verispec.server").info("/v1/ routes need the API key (Authorization: Bearer ...)")
    config = uvicorn.Config(
        create_app(state), host=args.host, port=args.port, log_level=args.log_level,
        timeout_graceful_shutdown=args.drain_timeout, access_log=False,
        http=bounded_protocol(args.max_connections, args.header_timeout),  # limits of its own: http.py
        h11_max_incomplete_event_size=MAX_HEAD_BYTES, timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )  # fmt: skip
    server = _draining_server(config, state)
    quiet = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()  # uvicorn re-raises the stop signal afterwards; the quiet handlers make that a clean exit
    finally:
        for sig, handler in quiet.items():
            signal.signal(sig, handler)
    return 0


def _access_arguments(args: argparse.Namespace) -> list[str] | None:
    """Checks --api-key and --allowed-hosts; returns the allowed names given (None: the default)."""
    given = args.api_key if args.api_key is not None else os.environ.get("VERISPEC_API_KEY", "").split(",")
    keys = [key.strip() for key in given if key.strip()]
    if args.api_key is not None and len(keys) < len(args.api_key):
        raise VerispecError("--api-key is empty: give the key, or leave the flag out for an open server")
    args.api_key = tuple(keys)  # what the app and a cluster's replicas take
    if args.metrics_key is not None and not args.metrics_key.strip():
        raise VerispecError("--metrics-key is empty: give the key, or leave the flag out")
    if args.metrics_key is None:
        args.metrics_key = os.environ.get("VERISPEC_METRICS_KEY", "").strip() or None
    args.responses_store_limits = _store_limits(args.responses_store_limits)
    _check_store(args.responses_store)
    if args.allowed_hosts is None:
        return None
    hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    if not hosts:
        raise VerispecError("--allowed-hosts names no host: give names (comma-separated), or '*' for any")
    return hosts


def _check_store(path: str | None) -> None:
    """--responses-store opens (or makes) its SQLite file now: a path it cannot use is one line before any model
    loads."""
    if path is None:
        return
    import sqlite3

    from .responses_store import ResponseStore

    try:
        ResponseStore(path).close()
    except sqlite3.Error as exc:
        raise VerispecError(f"--responses-store {path}: {exc} (a file SQLite can open and write)") from None


def _store_limits(text: str | None):
    """--responses-store-limits COUNT,BYTES,DAYS (each may be left empty: its default)."""
    from ..engine.budget import parse_memory
    from .responses_store import StoreLimits

    if text is None:
        return StoreLimits()
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3:
        raise VerispecError(f"--responses-store-limits is COUNT,BYTES,DAYS (e.g. 10000,256MiB,30), got {text!r}")
    default = StoreLimits()
    try:
        count = int(parts[0]) if parts[0] else default.max_count
        size = parse_memory(parts[1]) if parts[1] else default.max_bytes
        days = float(parts[2]) if parts[2] else default.max_age / 86400
    except ValueError as exc:
        raise VerispecError(f"--responses-store-limits: {exc}") from None
    if count < 1 or not (math.isfinite(days) and days > 0):
        raise VerispecError(f"--responses-store-limits: a count of at least 1 and a finite number of days above 0, "
                            f"got {text!r}")  # fmt: skip
    return StoreLimits(count, size, days * 86400)


def _check_limits(args: argparse.Namespace) -> None:
    """Each numeric flag within what it means (finite, positive where 0 means nothing), in one line."""
    if not 0 <= args.port <= 65535:
        raise VerispecError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_body_bytes < 1024:
        raise VerispecError(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    for flag in ("grammar_timeout", "body_timeout", "header_timeout"):
        if not (math.isfinite(getattr(args, flag)) and getattr(args, flag) > 0):
            raise VerispecError(f"--{flag.replace('_', '-')} must be a finite number > 0, got {getattr(args, flag)}")
    if not (math.isfinite(args.drain_timeout) and args.drain_timeout >= 0):
        raise VerispecError(f"--drain-timeout must be a finite number >= 0, got {args.drain_timeout}")
    if args.max_connections < 1:
        raise VerispecError(f"--max-connections must be >= 1, got {args.max_connections}")
    if args.grammar_workers < 1:
        raise VerispecError(f"--grammar-workers must be >= 1, got {args.grammar_workers}")


def _draining_server(config, state):
    """A uvicorn.Server that marks the app as draining on SIGTERM/SIGINT (new requests then get 503).

    uvicorn itself then stops accepting connections, waits for the open ones to finish (up to
    --drain-timeout) and runs the app's shutdown, which stops the scheduler thread.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            state.draining = True
            super().handle_exit(sig, frame)

    return DrainingServer(config)


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    from ..bench.serve import add_bench_arguments

    add_bench_arguments(parser)


def _bench(args: argparse.Namespace) -> int:
    from ..bench.serve import run_bench

    return run_bench(args)


COMMANDS = {"serve": (_serve_arguments, _serve), "bench-serve": (_bench_arguments, _bench)}
