"""A hostile run against a real `verispec serve`: thousands of requests at once from several clients, mixing the
hostile cases of test_hostile.py, bodies schemathesis generates from the published schema (valid and
invalid), cut-off streams, and greedy probes whose answers must equal the one the server gave before the run.
Not a test (it runs for minutes): `python tests/hostile_run.py --requests 5000 -- [serve flags]`.

Counts what a server must never do: a crash (the process gone), a 5xx, an empty 200 standing in for a failed
grammar (a non-streamed answer with structured output and no tokens), a probe whose answer changed, a stream
that hangs. Answers that are empty because the model's first token was its end token are counted apart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from test_hostile import HOSTILE, ROUTES  # noqa: E402

from serving import ServerProcess  # noqa: E402

PROBE = {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0, "ignore_eos": True}


def generated_bodies(url: str, count: int, seed: int) -> list[tuple[str, object]]:
    """`count` bodies drawn from the schema of the POST routes, half valid and half not (schemathesis)."""
    import hypothesis
    import schemathesis
    from schemathesis.generation import GenerationMode

    warnings.simplefilter("ignore")
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    bodies: list[tuple[str, object]] = []
    share = count // 4  # per route and mode
    for operation in [op for op in operations if op.method.upper() == "POST"]:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.settings(
                max_examples=share,
                database=None,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(hypothesis.HealthCheck),
                phases=[hypothesis.Phase.generate],
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def collect(case) -> None:
                body = case.body
                valid = case.meta.generation.mode == GenerationMode.POSITIVE
                if isinstance(body, dict) and valid:  # short answers: the run is about refusals and survival
                    body = {**body, "max_tokens": min(body.get("max_tokens") or 8, 8)}
                bodies.append(("chat" if "chat" in case.operation.path else "completion", body))

            collect()
    random.Random(seed).shuffle(bodies)
    return bodies


def _constrained(body: dict) -> bool:
    """Whether a request asks for structured output (the grammars a generated body may name)."""
    fields = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
    return any(body.get(name) is not None for name in fields) or isinstance(body.get("response_format"), dict) and \
        body["response_format"].get("type") in ("json_object", "json_schema")  # fmt: skip


class Run:
    def __init__(self, url: str, probe: str):
        self.url, self.probe = url, probe
        self.statuses: Counter[str] = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def note(self, kind: str, status: int | str, detail: str = "") -> None:
        with self.lock:
            self.statuses[f"{kind} {status}"] += 1
            if detail:
                self.failures.append(f"{kind} {status}: {detail[:300]}")

    def send(self, kind: str, route: str, body) -> None:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        try:
            reply = httpx.post(self.url + ROUTES[route], content=content, headers=headers, timeout=300)
        except httpx.HTTPError as exc:
            self.note(kind, "transport-error", repr(exc))
            return
        detail = reply.text if reply.status_code >= 500 else ""
        if reply.status_code == 200 and isinstance(body, dict) and not body.get("stream"):
            answer = reply.json()
            choice = answer["choices"][0] if answer.get("choices") else None
            empty = (
                choice is not None and answer["usage"]["completion_tokens"] == 0 and choice["finish_reason"] != "length"
            )
            if empty and _constrained(body):  # a grammar's failure once answered as an empty "stop"
                detail = "empty 200 under a grammar: " + json.dumps(body)[:200]
            elif empty:  # the model's own end token first: an answer, counted apart
                kind = f"{kind} (empty: the model ended at once)"
            if kind == "probe" and choice["text"] != self.probe:
                detail = f"probe changed: {choice['text']!r}"
        self.note(kind, reply.status_code, detail)

    def cut_stream(self, body: dict) -> None:
        """A stream read for a few events, then dropped (the client goes away)."""
        try:
            with httpx.stream("POST", self.url + ROUTES["completion"], json={**body, "stream": True}, timeout=60) as r:
                for _ in itertools.islice(r.iter_lines(), 3):
                    pass
            self.note("cut-stream", r.status_code)
        except httpx.HTTPError as exc:
            self.note("cut-stream", "transport-error", repr(exc))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("serve_args", nargs="*", help="flags of `verispec serve` (after --)")
    args = parser.parse_args()
    server = ServerProcess(*(args.serve_args or ["--model", "tiny", "--speculative-model", "tiny"]))
    try:
        probe = httpx.post(server.url + ROUTES["completion"], json=PROBE, timeout=300).json()["choices"][0]["text"]
        run = Run(server.url, probe)
        generated = generated_bodies(server.url, args.requests // 2, args.seed)
        rng = random.Random(args.seed)
        jobs = []
        for i in range(args.requests):
            pick = rng.random()
            if pick < 0.45:
                route, body = generated[i % len(generated)]
                jobs.append(("generated", route, body))
            elif pick < 0.85:
                case = HOSTILE[rng.randrange(len(HOSTILE))]
                jobs.append((case[0], case[1], case[2]))
            elif pick < 0.95:
                jobs.append(("probe", "completion", PROBE))
            else:
                jobs.append(("cut-stream", "completion", {"prompt": "A stream", "max_tokens": 64}))
        began = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            for kind, route, body in jobs:
                if kind == "cut-stream":
                    pool.submit(run.cut_stream, body)
                else:
                    pool.submit(run.send, kind if kind in ("probe", "generated") else "hostile", route, body)
        seconds = time.monotonic() - began
        alive = server.proc.poll() is None and httpx.get(server.url + "/health", timeout=10).status_code == 200
        final = httpx.post(server.url + ROUTES["completion"], json=PROBE, timeout=300).json()["choices"][0]["text"]
    finally:
        server.stop()
    fives = sum(n for key, n in run.statuses.items() if key.split()[-1].startswith("5"))
    print(f"{sum(run.statuses.values())} requests in {seconds:.0f} s, concurrency {args.concurrency}")
    for key, count in sorted(run.statuses.items()):
        print(f"  {key}: {count}")
    print(f"server alive after the run: {alive}; probe unchanged: {final == probe}; 5xx: {fives}; "
          f"failures: {len(run.failures)}")  # fmt: skip
    for failure in run.failures[:20]:
        print("  " + failure)
    return 0 if alive and final == probe and not run.failures else 1


if __name__ == "__main__":
    sys.exit(main())
