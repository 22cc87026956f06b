"""What one client's load costs another through `verispec serve`: a bystander's latency alone and beside the load,
and the server's memory before and after it.

    python benchmarks/tenants.py unbounded [--repeats 3] [-- SERVE FLAGS]
    python benchmarks/tenants.py burst [--long 12] [--users] [-- SERVE FLAGS]
    python benchmarks/tenants.py prefill [--prompt-tokens 3500] [--repeats 3] [-- SERVE FLAGS]
    python benchmarks/tenants.py flood [--requests 10000] [--concurrency 8] [-- SERVE FLAGS]

unbounded  a chat request without max_tokens (its default is the rest of the context) beside a 16-token bystander;
           run it with a small budget (-- --kv-cache-memory 256MiB --max-model-len 8192) to see whether the long
           one takes every block.
burst      key A sends --long long prompts at once (with --users, each under a `user` of its own); key B then
           sends one short request.
prefill    key A sends one long prompt (about --prompt-tokens tokens) and nothing else; while it prefills, key B sends
           its short request --repeats times, one after another.
flood      key A sends --requests short requests, each with a new cache_salt (a partition of its own, as
           `bench-serve` sends them); key B's prompt, sent twice before (so it is cached), is timed before and after,
           and the server's resident memory (RSS) is read before and after.

Each prints the bystander's median seconds alone and beside the load, their ratio, and (flood) RSS growth. The
server runs with two API keys (A and B) and its defaults plus SERVE FLAGS (default: the bundled pair).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
import uuid

import httpx
from served import ServedProcess

KEYS = {"A": "tenant-a", "B": "tenant-b"}
BYSTANDER = {"messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 16, "temperature": 0}
REPORT = "The quarter went well; sales rose and costs fell. "  # 12 tokens of the bundled tokenizer
ESSAY = {"messages": [{"role": "user", "content": "Write a 300-word essay about rivers."}], "temperature": 0}
CACHED = {"messages": [{"role": "user", "content": "Summarize the rules of chess in a paragraph. " * 8}],
          "max_tokens": 16, "temperature": 0}  # fmt: skip


class Server(ServedProcess):
    def __init__(self, flags: list[str]) -> None:
        super().__init__([arg for key in KEYS.values() for arg in ("--api-key", key)] + flags)

    def chat(self, tenant: str, body: dict, timeout: float = 900) -> float:
        """Seconds the answer took (raises on a non-200)."""
        begin = time.perf_counter()
        reply = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=timeout,
                           headers={"Authorization": f"Bearer {KEYS[tenant]}"})  # fmt: skip
        reply.raise_for_status()
        return time.perf_counter() - begin


def _salted(body: dict) -> dict:
    return {**body, "cache_salt": uuid.uuid4().hex}  # each bystander meets the server as the first would


def _alone(server: Server, repeats: int) -> float:
    return statistics.median(server.chat("B", _salted(BYSTANDER)) for _ in range(repeats))


def _beside(server: Server, load, repeats: int, settle: float) -> tuple[float, float]:
    """The bystander's median seconds while `load()` runs in threads, and the load's own seconds."""
    done: dict[str, float] = {}
    thread = threading.Thread(target=lambda: done.update(load=load()))
    thread.start()
    time.sleep(settle)  # the load is admitted and running
    seconds = statistics.median(server.chat("B", _salted(BYSTANDER)) for _ in range(repeats))
    thread.join()
    return seconds, done["load"]


def unbounded(server: Server, args: argparse.Namespace) -> None:
    alone = _alone(server, args.repeats)
    beside, load = _beside(server, lambda: server.chat("A", _salted(ESSAY)), args.repeats, 3.0)
    print(f"bystander alone {alone:.2f} s, beside a request without max_tokens {beside:.2f} s: {beside / alone:.2f}x"
          f" (the long request took {load:.1f} s)")  # fmt: skip


def burst(server: Server, args: argparse.Namespace) -> None:
    alone = _alone(server, args.repeats)
    long_prompt = "Here is a long report to summarize. " + REPORT * 120

    def load() -> float:
        body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 64, "temperature": 0}
        users = [{"user": f"u{i}"} if args.users else {} for i in range(args.long)]
        with concurrent.futures.ThreadPoolExecutor(args.long) as pool:
            begin = time.perf_counter()
            list(pool.map(lambda extra: server.chat("A", _salted(body | extra)), users))
        return time.perf_counter() - begin

    beside, took = _beside(server, load, 1, 5.0)
    named = ", each with a user of its own" if args.users else ""
    print(
        f"bystander alone {alone:.2f} s, beside {args.long} long prompts of another key{named} {beside:.2f} s: "
        f"{beside / alone:.2f}x (the burst took {took:.1f} s)"
    )


def prefill(server: Server, args: argparse.Namespace) -> None:
    alone = _alone(server, args.repeats)
    long_prompt = "Here is a long report to summarize. " + REPORT * (args.prompt_tokens // 12)
    body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 8, "temperature": 0}
    beside, took = _beside(server, lambda: server.chat("A", _salted(body)), args.repeats, 1.0)
    print(
        f"bystander alone {alone:.2f} s, beside another key's {args.prompt_tokens}-token prompt {beside:.2f} s: "
        f"{beside / alone:.2f}x (the long prompt took {took:.1f} s)"
    )


def flood(server: Server, args: argparse.Namespace) -> None:
    for _ in range(2):
        server.chat("B", CACHED)  # cached, and a partition requests come back to
    before = statistics.median(server.chat("B", CACHED) for _ in range(args.repeats))
    rss = server.rss_mib()
    bodies = [{"messages": [{"role": "user", "content": f"Say the number {i}."}], "max_tokens": 8,
               "temperature": 0, "cache_salt": uuid.uuid4().hex} for i in range(args.requests)]  # fmt: skip
    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        for i, _ in enumerate(pool.map(lambda body: server.chat("A", body), bodies)):
            if (i + 1) % 1000 == 0:
                print(f"  {i + 1} requests, {time.perf_counter() - begin:.0f} s, RSS {server.rss_mib():.0f} MiB",
                      file=sys.stderr, flush=True)  # fmt: skip
    grown = server.rss_mib() - rss
    after = statistics.median(server.chat("B", CACHED) for _ in range(args.repeats))
    print(
        f"{args.requests} requests with new cache_salts: RSS +{grown:.0f} MiB; the cached tenant's prompt "
        f"{before:.2f} s before, {after:.2f} s after ({after / before:.2f}x)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=("unbounded", "burst", "prefill", "flood"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=int, default=12)
    parser.add_argument("--users", action="store_true", help="burst: each long prompt under a user of its own")
    parser.add_argument("--prompt-tokens", type=int, default=3500)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    argv = sys.argv[1:]
    serve = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    server = Server(serve)
    try:
        {"unbounded": unbounded, "burst": burst, "prefill": prefill, "flood": flood}[args.scenario](server, args)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
