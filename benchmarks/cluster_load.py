"""`verispec serve --replicas 2` on the bundled pair: identity, prefix affinity, a replica killed under load.

    python benchmarks/cluster_load.py [--load-seconds 150] [--streams 16]

Real processes, the official openai client, HTTP on 127.0.0.1, the bundled target and draft, the default method.
What it measures, each against its target (docs/cluster.md):

1. Identity: the single-process `verispec serve --threads 2` answers 6 short chat prompts (code and prose),
   greedy, max_tokens 64, plain and streamed; it is stopped, then `verispec serve --replicas 2
   --cpus-per-replica 1` answers the same 12 requests. Mismatches between the two (target: 0). The servers run
   one after the other so that neither steals the other's cores (2-core machine).
2. Affinity: 12 chat requests sharing a system prompt of about 1,000 tokens (the first 4,000 characters of a
   standard-library module's source) with different short questions, max_tokens 8, one at a time. From the
   cluster's merged /metrics: the router's hit / miss / cold counts and hit rate, and the requests each replica
   finished and the prompt tokens whose prefill it reused (target: >= 90 % served by the replica holding it).
3. Fault under load: --streams workers each send streaming chat requests back to back (short prompts,
   max_tokens 48) for --load-seconds; at the middle one replica's process (its pid from
   verispec_cluster_replica_info) gets SIGKILL. Counts requests completed, streams ended by the SSE error event,
   HTTP status codes (target: no 5xx), hangs (no byte for --hang-seconds) and whether Ray brought the replica
   back (a new pid in /metrics).

Every server and Ray are stopped at the end, on errors and on Ctrl-C too (`ray stop --force` last). About 4
minutes on 2 cores with the defaults; --skip and fewer prompts or a shorter load for a quick try; --json keeps
the figures. Results: docs/cluster.md, "Measured".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import openai
from prometheus_client import parser as prometheus

STATS_LAG_SECONDS = 3.0  # replicas report their metrics to the ingress every second (cluster/metrics.py)
IDENTITY_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in two sentences what a hash table is.",
    "Write a SQL query that counts the orders per customer in a table orders(customer_id, id).",
    "Give three tips for writing clear commit messages.",
    "Write a JavaScript function that removes duplicates from an array.",
    "What is the difference between a process and a thread? Answer briefly.",
]
AFFINITY_QUESTIONS = [
    "What does this module do?",
    "Which function would I call to wrap a paragraph?",
    "Name one class defined here.",
    "Is there a function that removes common indentation?",
    "What does the width argument mean?",
    "Which regular expressions are used?",
    "How are tabs handled?",
    "Summarize the module in one line.",
    "Which function adds a prefix to lines?",
    "What is the default width?",
    "Does it handle long words?",
    "Which license applies to this code?",
]
LOAD_TOPICS = [
    "a binary search in Python",
    "why the sky is blue",
    "a haiku about autumn",
    "a bash loop over files",
    "the rules of chess in brief",
    "a Rust struct with two fields",
    "what TCP does",
    "a list comprehension example",
    "how to boil an egg",
    "a C function that swaps two ints",
    "what a compiler does",
    "a regex matching an email address",
    "the water cycle",
    "a Go hello world",
    "why tests matter",
    "a JSON object describing a book",
]


# ---- servers -----------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`python -m verispec serve ARGS` on a free port in a session of its own, waited for until /health answers."""

    def __init__(self, label: str, args: list[str], log_dir: Path, startup_timeout: float) -> None:
        self.label = label
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"cluster_load-{label}-{self.port}.log"
        command = [sys.executable, "-m", "verispec", "serve", "--port", str(self.port), *args]
        print(f"[{_clock()}] starting {label}: {' '.join(command[1:])} (log {self.log_path})", flush=True)
        self.log = open(self.log_path, "w")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_healthy(startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        started = time.monotonic()
        while time.monotonic() < started + timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.ready_seconds = time.monotonic() - started
                    print(f"[{_clock()}] {self.label} healthy after {self.ready_seconds:.0f} s", flush=True)
                    return
            time.sleep(1.0)
        raise RuntimeError(f"{self.label} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def client(self, timeout: float) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", timeout=timeout, max_retries=0)

    def model(self) -> str:
        return httpx.get(self.url + "/v1/models", timeout=30).json()["data"][0]["id"]

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return [
            (sample.name, sample.labels, sample.value)
            for family in prometheus.text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            print(f"[{_clock()}] stopping {self.label}", flush=True)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its session is left (Ray's helpers)
        self.log.close()


def ray_stop() -> None:
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120, check=False)


# ---- metrics -----------------------------------------------------------------------------------------------------
def value(samples, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items()))


def by_replica(samples, name: str) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for n, labels, v in samples:
        if n == name and "replica" in labels:
            out[labels["replica"]] += v
    return dict(out)


def replica_pids(server: Server) -> dict[str, int]:
    pids = {}
    for name, labels, _ in server.samples():
        if name == "verispec_cluster_replica_info" and labels.get("pid"):
            pids[labels["replica"]] = int(labels["pid"])
    return pids


def wait_until(predicate, timeout: float, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(step)


# ---- 1. identity -------------------------------------------------------------------------------------------------
def answers(server: Server, prompts: list[str], max_tokens: int) -> list[str]:
    client, model = server.client(300), server.model()
    texts = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        plain = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        texts += [plain.choices[0].message.content or "", streamed]
        print(f"[{_clock()}]   {server.label}: {prompt[:50]!r} -> {len(texts[-2])} chars", flush=True)
    return texts


# ---- 2. affinity -------------------------------------------------------------------------------------------------
def affinity(server: Server, count: int) -> dict:
    system = Path(textwrap.__file__).read_text()[:4000]
    client, model = server.client(300), server.model()
    wait_until(lambda: len(replica_pids(server)) >= 2, 60)
    time.sleep(STATS_LAG_SECONDS)  # the identity requests' counts reach /metrics first
    before = server.samples()
    times = []
    for i in range(count):
        question = AFFINITY_QUESTIONS[i % len(AFFINITY_QUESTIONS)]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        t0 = time.monotonic()
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
        times.append(time.monotonic() - t0)
        print(f"[{_clock()}]   affinity {i + 1}/{count}: {times[-1]:.1f} s, {reply.usage.prompt_tokens} prompt tokens")
    done_before = by_replica(before, "verispec_requests_total")

    def settled():
        now = server.samples()
        done = by_replica(now, "verispec_requests_total")
        grown = sum(v - done_before.get(r, 0.0) for r, v in done.items())
        return now if grown >= count else None

    wait_until(settled, 30)
    time.sleep(STATS_LAG_SECONDS)  # every replica's last report, not only the first to arrive
    after = server.samples()
    outcome = {o: value(after, "verispec_cluster_prefix_routed_total", outcome=o) for o in ("hit", "miss", "cold")}
    for o in outcome:
        outcome[o] -= value(before, "verispec_cluster_prefix_routed_total", outcome=o)
    served = {
        r: v - done_before.get(r, 0.0) for r, v in by_replica(after, "verispec_requests_total").items()
    }  # fmt: skip
    reuse_before = by_replica(before, "verispec_prefill_reused_tokens_total")
    reused = {
        r: v - reuse_before.get(r, 0.0) for r, v in by_replica(after, "verispec_prefill_reused_tokens_total").items()
    }
    judged = outcome["hit"] + outcome["miss"]
    return {
        "requests": count,
        "prompt_tokens": reply.usage.prompt_tokens,
        "outcome": outcome,
        "hit_rate": outcome["hit"] / judged if judged else float("nan"),
        "gauge": value(after, "verispec_cluster_prefix_hit_rate"),
        "served": served,
        "reused": reused,
        "first_seconds": times[0],
        "rest_median_seconds": statistics.median(times[1:]) if len(times) > 1 else float("nan"),
    }


# ---- 3. fault under load -----------------------------------------------------------------------------------------
class Load:
    def __init__(self, server: Server, streams: int, seconds: float, max_tokens: int, hang_seconds: float) -> None:
        self.server, self.streams, self.seconds = server, streams, seconds
        self.max_tokens, self.hang_seconds = max_tokens, hang_seconds
        self.model = server.model()
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.end = 0.0

    def worker(self, i: int) -> None:
        client = openai.OpenAI(
            base_url=self.server.url + "/v1", api_key="unused", timeout=httpx.Timeout(self.hang_seconds), max_retries=0
        )
        n = 0
        while time.monotonic() < self.end:
            topic = LOAD_TOPICS[(i + n) % len(LOAD_TOPICS)]
            messages = [{"role": "user", "content": f"Write briefly about {topic}. (worker {i}, request {n})"}]
            record = {"start": time.monotonic(), "status": None, "chunks": 0, "first": None}
            try:
                stream = client.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=0, stream=True
                )
                record["status"] = stream.response.status_code
                finish = None
                for chunk in stream:
                    if chunk.choices:
                        if chunk.choices[0].delta.content:
                            record["chunks"] += 1
                            record["first"] = record["first"] or time.monotonic()
                        finish = chunk.choices[0].finish_reason or finish
                record["outcome"] = "complete" if finish else "ended without finish_reason"
            except openai.APITimeoutError:
                record["outcome"] = "hang"
            except openai.APIStatusError as exc:
                record["status"], record["outcome"] = exc.status_code, f"HTTP {exc.status_code}"
            except openai.APIConnectionError as exc:
                record["outcome"] = f"connection error: {exc}"
            except openai.APIError as exc:  # an SSE error event in the stream
                code = exc.body.get("code") if isinstance(exc.body, dict) else None
                record["outcome"] = "error event" if code == "replica_failed" else f"error event {code}: {exc}"
            except Exception as exc:  # noqa: BLE001 (counted and shown, never hidden)
                record["outcome"] = f"other: {type(exc).__name__}: {exc}"
            record["done"] = time.monotonic()
            with self.lock:
                self.records.append(record)
            n += 1

    def run(self, recovery_seconds: float) -> dict:
        before = self.server.samples()
        pids = wait_until(lambda: (p := replica_pids(self.server)) and len(p) >= 2 and p, 60) or {}
        start = time.monotonic()
        self.end = start + self.seconds
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.streams)]
        for thread in threads:
            thread.start()
        time.sleep(self.seconds / 2)
        victim_replica, victim = sorted(pids.items())[0]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        print(
            f"[{_clock()}]   SIGKILL to replica {victim_replica} (pid {victim}) at t={killed - start:.0f} s", flush=True
        )
        back = None
        deadline = max(self.end, killed) + recovery_seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                now = replica_pids(self.server)
                if len(now) >= 2 and victim not in now.values():
                    back = (time.monotonic() - killed, now)
                    break
            time.sleep(2.0)
        print(f"[{_clock()}]   replica back: {back}", flush=True)
        # the load runs until self.end; its last requests, started before it, may take hang_seconds more
        join_deadline = max(self.end, time.monotonic()) + self.hang_seconds + 60
        for thread in threads:
            thread.join(max(0.0, join_deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in threads)
        time.sleep(STATS_LAG_SECONDS)
        after = self.server.samples()
        new_replicas = set(back[1]) - set(pids) if back else set()
        new_served = sum(by_replica(after, "verispec_requests_total").get(r, 0.0) for r in new_replicas)
        with self.lock:
            records = list(self.records)
        outcomes = collections.Counter(r["outcome"] for r in records)
        statuses = collections.Counter(r["status"] for r in records if r["status"] is not None)
        complete = [r for r in records if r["outcome"] == "complete"]
        at_kill = [r for r in records if r["start"] <= killed <= r["done"]]
        return {
            "victim": (victim_replica, victim),
            "kill_at": killed - start,
            "back_seconds": back[0] if back else None,
            "pids_after": back[1] if back else replica_pids(self.server),
            "new_replica_served": new_served,
            "requests": len(records),
            "outcomes": outcomes,
            "statuses": statuses,
            "server_errors": sum(n for s, n in statuses.items() if s >= 500),
            "hangs": outcomes.get("hang", 0) + stuck,
            "stuck_threads": stuck,
            "in_flight_at_kill": len(at_kill),
            "at_kill_outcomes": collections.Counter(r["outcome"] for r in at_kill),
            "chunks": sum(r["chunks"] for r in records),
            "wall": max((r["done"] for r in records), default=start) - start,
            "latency_median": statistics.median(r["done"] - r["start"] for r in complete) if complete else None,
            "latency_max": max((r["done"] - r["start"] for r in complete), default=None),
            "ttft_median": statistics.median(r["first"] - r["start"] for r in complete if r["first"])
            if complete
            else None,
            "retried": value(after, "verispec_cluster_retried_requests_total")
            - value(before, "verispec_cluster_retried_requests_total"),
            "broken": value(after, "verispec_cluster_broken_streams_total")
            - value(before, "verispec_cluster_broken_streams_total"),
        }


# ---- main --------------------------------------------------------------------------------------------------------
T0 = time.monotonic()


def _clock() -> str:
    return f"{time.monotonic() - T0:6.0f} s"


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=150.0, help="length of the load; the kill at its middle")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streaming workers during the load")
    parser.add_argument("--load-max-tokens", type=int, default=48)
    parser.add_argument("--hang-seconds", type=float, default=120.0, help="a request without a byte this long hangs")
    parser.add_argument("--recovery-seconds", type=float, default=180.0, help="wait after the load for the new pid")
    parser.add_argument("--identity-prompts", type=int, default=len(IDENTITY_PROMPTS))
    parser.add_argument("--identity-max-tokens", type=int, default=64)
    parser.add_argument("--affinity-requests", type=int, default=12)
    parser.add_argument("--skip", default="", help="comma-separated phases to leave out: identity, affinity, load")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--log-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    signal.signal(signal.SIGTERM, _interrupt)
    prompts = IDENTITY_PROMPTS[: args.identity_prompts]
    results: dict = {}
    servers: list[Server] = []
    try:
        if "identity" not in skip:
            servers.append(single := Server("single", ["--threads", "2"], args.log_dir, args.startup_timeout))
            results["single_ready_seconds"] = single.ready_seconds
            expected = answers(single, prompts, args.identity_max_tokens)
            single.stop()
        cluster_args = ["--replicas", "2", "--cpus-per-replica", "1"]
        servers.append(cluster := Server("cluster", cluster_args, args.log_dir, args.startup_timeout))
        results["cluster_ready_seconds"] = cluster.ready_seconds
        if "identity" not in skip:
            got = answers(cluster, prompts, args.identity_max_tokens)
            mismatches = [
                {"prompt": prompts[i // 2], "mode": ("plain", "stream")[i % 2], "single": e, "cluster": g}
                for i, (e, g) in enumerate(zip(expected, got, strict=True))
                if e != g
            ]
            results["identity"] = {
                "compared": len(expected),
                "mismatches": len(mismatches),
                "single_stream_vs_plain": sum(expected[i] != expected[i + 1] for i in range(0, len(expected), 2)),
                "empty": sum(not t for t in expected + got),
                "details": mismatches,
            }
        if "affinity" not in skip:
            print(f"[{_clock()}] affinity: {args.affinity_requests} requests sharing a system prompt", flush=True)
            results["affinity"] = affinity(cluster, args.affinity_requests)
        if "load" not in skip:
            print(f"[{_clock()}] load: {args.streams} streams for {args.load_seconds:.0f} s", flush=True)
            load = Load(cluster, args.streams, args.load_seconds, args.load_max_tokens, args.hang_seconds)
            results["load"] = load.run(args.recovery_seconds)
    finally:
        for server in reversed(servers):
            with contextlib.suppress(Exception):
                server.stop()
        ray_stop()
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def report(results: dict, args: argparse.Namespace) -> None:
    rows: list[tuple[str, str, str]] = []
    if "identity" in results:
        ident = results["identity"]
        rows.append(
            ("identity: greedy mismatches, cluster vs single", f"{ident['mismatches']} / {ident['compared']}", "0")
        )
        rows.append(("  (single's own stream vs plain differences)", str(ident["single_stream_vs_plain"]), ""))
        for m in ident["details"]:
            print(f"MISMATCH {m['mode']} {m['prompt']!r}:\n  single:  {m['single']!r}\n  cluster: {m['cluster']!r}")
    if "affinity" in results:
        aff = results["affinity"]
        o = aff["outcome"]
        rows.append(("affinity: router hit / miss / cold", f"{o['hit']:.0f} / {o['miss']:.0f} / {o['cold']:.0f}", ""))
        rows.append(("affinity: hit rate (hits / (hits + misses))", f"{aff['hit_rate']:.0%}", ">= 90 %"))
        held = max(aff["served"].values(), default=0)
        rows.append(("affinity: requests on the busiest replica", f"{held:.0f} / {aff['requests']}", ">= 90 %"))
        per = ", ".join(
            f"{r[-8:]}: {v:.0f} req, {aff['reused'].get(r, 0):.0f} reused tok" for r, v in aff["served"].items()
        )
        rows.append(("affinity: per replica", per, ""))
        latency = f"{aff['first_seconds']:.1f} s / {aff['rest_median_seconds']:.1f} s"
        rows.append(("affinity: latency first / median of the rest", latency, ""))
    if "load" in results:
        load = results["load"]
        outs = load["outcomes"]
        rows.append(("load: requests finished (any outcome)", str(load["requests"]), ""))
        rows.append(("load: completed", str(outs.get("complete", 0)), ""))
        rows.append(("load: ended by the SSE error event", str(outs.get("error event", 0)), ""))
        others = {k: v for k, v in outs.items() if k not in ("complete", "error event", "hang")}
        rows.append(("load: other outcomes", json.dumps(others) if others else "none", "none"))
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(load["statuses"].items()))
        rows.append(("load: HTTP statuses", statuses, "no 5xx"))
        rows.append(("load: 5xx", str(load["server_errors"]), "0"))
        rows.append(("load: hangs (no byte for --hang-seconds, or never ended)", str(load["hangs"]), "0"))
        rows.append(
            (
                "load: in flight at the kill, by outcome",
                f"{load['in_flight_at_kill']}: {dict(load['at_kill_outcomes'])}",
                "",
            )
        )
        rows.append(("load: ingress retried / broken streams", f"{load['retried']:.0f} / {load['broken']:.0f}", ""))
        back = load["back_seconds"]
        rows.append(
            ("load: killed replica back (new pid)", f"yes, {back:.0f} s after the kill" if back else "no", "yes")
        )
        rows.append(("load: requests the new replica finished", f"{load['new_replica_served']:.0f}", ""))
        rows.append(
            (
                "load: content chunks streamed (about a token each), wall",
                f"{load['chunks']} in {load['wall']:.0f} s",
                "",
            )
        )
        if load["latency_median"] is not None:
            lat = f"{load['latency_median']:.0f} s / {load['latency_max']:.0f} s / {load['ttft_median']:.0f} s"
            rows.append(("load: completed latency median / max, TTFT median", lat, ""))
    width = max((len(r[0]) for r in rows), default=10)
    print()
    print(f"{'measure':<{width}}  {'measured':<40}  target")
    for name, measured, target in rows:
        print(f"{name:<{width}}  {measured:<40}  {target}")


if __name__ == "__main__":
    sys.exit(main())
