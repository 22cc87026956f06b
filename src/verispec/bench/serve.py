"""`verispec bench-serve`: throughput and latency of the server at several concurrencies, speculation on vs off.

It starts `verispec serve` with the given model flags on a free loopback port (or uses --url), then for each
concurrency C warms up (two waves of C requests of different lengths), then runs the same C greedy chat
requests at once (one run), with `"speculative": false` and with speculation on, `--repeats` such pairs of runs, and
prints a Markdown table: total generated tokens/s, per-request latency p50/p95/p99, mean accepted length, the
share of scheduler steps that drafted (the draft policy's decisions), each proposer's accepted / drafted tokens
(from the answers) and the started server's peak RSS during each mode's runs; then on / off per level: the
median of the pairs' ratios, each pair's, and the ratio of the totals. A shared machine slows by up to
1.5x for a minute at a time; the two runs of a pair are seconds apart, so the median of the pairs' ratios
is what compares the modes (the totals take every spell whole). Off runs first in every pair: an order
that alternated (off on, on off, ...) put the same mode on both sides of a pair boundary, and one spell
there hit it in two pairs. Each level ends with a verdict: faster or slower only where a distribution-free
interval of the median ratio (the sign test's, >= 90 % where the pairs allow; 87.5 % from 4 pairs) lies wholly
above or below 1, level within the noise otherwise (docs/server.md, "How never slower is judged").

The requests are chat requests from `--dataset` (default `mixed`: short code questions, HumanEval problems, code
edits and second turns of conversations, interleaved). Every request carries a `cache_salt` of its own, so it
meets the server as a fresh one would: nothing an earlier request wrote (the suffix index) or prefilled is reused,
in either mode, though every pair runs the same prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

from ..arguments import add_draft_arguments, add_model_arguments
from ..engine.policy import POLICIES
from ..errors import VerispecError
from .datasets import load_requests

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that reverses a singly linked list.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that computes the factorial of n recursively.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python function that checks whether a string is a palindrome.",
]
STARTUP_TIMEOUT = 900.0
MIXED = ("code-edit", "multi-turn", "humaneval")  # interleaved with PROMPTS by --dataset mixed


@dataclass
class LevelResult:
    concurrency: int
    speculative: bool
    requests: int
    tokens: int
    seconds: float
    tokens_per_second: float
    latency_p50: float
    latency_p95: float
    mean_accepted_length: float
    draft_step_share: float
    run_tokens_per_second: list[float]  # each run's, in the order of the pairs
    # per proposer ("model", "lookup"), summed over the answers' `verispec` objects
    drafted_by_proposer: dict[str, int] = field(default_factory=dict)
    accepted_by_proposer: dict[str, int] = field(default_factory=dict)
    latency_p99: float = 0.0
    peak_rss_mib: float | None = None  # the started server's, during this mode's runs (None with --url)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_draft_arguments(parser)
    parser.add_argument("--url", default=None, help="bench a running server instead of starting one")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated concurrency levels")
    parser.add_argument(
        "--dataset", default="mixed",
        help="the requests: mixed (short code questions, HumanEval, code edits, second turns, interleaved), "
        "code (the short code questions alone), or a `verispec bench` dataset",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=0, help="requests per run (default: C, one wave)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=4, help="pairs of runs (off, on) per level")
    parser.add_argument("--draft-policy", default="auto", choices=POLICIES, help="the started server's policy")
    parser.add_argument("--output", default=None, help="also write the results as JSON here")


def run_bench(args: argparse.Namespace) -> int:
    levels = _levels(args.concurrency)
    if args.repeats < 1 or args.requests < 0 or args.max_tokens < 1:
        raise VerispecError("need --repeats >= 1, --requests >= 0 (0: C per run) and --max-tokens >= 1")
    prompts = bench_prompts(args.dataset)
    with _server(args, max(levels)) as (url, pid):
        results, costs = asyncio.run(_bench(url, pid, levels, prompts=prompts, args=args))
    print(format_table(results))
    print()
    print(format_costs(costs))
    if args.output:
        with open(args.output, "w") as out:
            json.dump([asdict(r) for r in results], out, indent=1)
    return 0


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise VerispecError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise VerispecError("--concurrency needs levels >= 1")
    return levels


@contextlib.contextmanager
def _server(args: argparse.Namespace, slots: int):
    if args.url:
        yield args.url.rstrip("/"), None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "verispec", "serve", "--port", str(port), "--model", args.model,
        "--speculative-model", args.speculative_model, "--num-speculative-tokens", str(args.num_speculative_tokens),
        "--device", args.device, "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", str(slots), "--draft-policy", args.draft_policy, "--log-level", "warning",
        "--quantization", args.quantization,
        "--draft-vocab", str(args.draft_vocab), "--draft-window", str(args.draft_window),
    ]  # fmt: skip
    if args.speculative_method:
        command += ["--speculative-method", args.speculative_method]
    if args.dtype:
        command += ["--dtype", args.dtype]
    if args.speculative_quantization:
        command += ["--speculative-quantization", args.speculative_quantization]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.kv_cache_memory:
        command += ["--kv-cache-memory", str(args.kv_cache_memory)]
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise VerispecError(f"the server exited with status {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise VerispecError(f"the server did not become healthy in {STARTUP_TIMEOUT:.0f} s")


def bench_prompts(dataset: str) -> list[list[dict]]:
    """The chat requests of `dataset` (see --dataset), as message lists; requests that need a grammar or tools
    are left out."""
    if dataset == "code":
        return [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    if dataset != "mixed":
        return [r.prompt for r in load_requests(dataset, chat=True) if r.grammar is None and r.chat is None]
    sources = [[[{"role": "user", "content": prompt}] for prompt in PROMPTS]]
    sources += [[r.prompt for r in load_requests(name, chat=True) if r.grammar is None] for name in MIXED]
    return [source[i] for i in range(max(map(len, sources))) for source in sources if i < len(source)]


async def _bench(
    url: str, pid: int | None, levels: list[int], prompts: list[list[dict]], args: argparse.Namespace
) -> tuple[list[LevelResult], dict[tuple[str, int, int], float]]:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0)) as client:
        for speculative in (True, False):  # warm up both modes
            await _one(client, prompts[0], 8, speculative)
        results = []
        for concurrency in levels:
            count = args.requests or concurrency
            await _warm_up(client, concurrency, prompts)
            runs: dict[bool, list[_Run]] = {True: [], False: []}
            for _ in range(args.repeats):
                for speculative in (False, True):
                    _reset_peak_rss(pid)
                    run = await _run(
                        client, concurrency, prompts[:count], max_tokens=args.max_tokens, speculative=speculative
                    )
                    runs[speculative].append(replace(run, peak_rss_mib=_peak_rss_mib(pid)))
            for speculative in (True, False):
                results.append(_summarize(concurrency, speculative, runs[speculative]))
                print(_row(results[-1]), file=sys.stderr, flush=True)
        return results, await _policy_costs(client)


async def _warm_up(client, concurrency: int, prompts: list[list[dict]]) -> None:
    """Two waves of C requests of different lengths, so the draft policy has measured every batch size from C
    down to 1 (a long-running server has; the benchmark should not charge that one-time exploration to one
    mode). Each batch size lasts at least 16 steps: enough for its plain steps and the draft lengths it tries.
    Two waves, because a batch size's guesses for short drafts scale the costs of the smaller batch sizes,
    which the first wave measures only after it (two sequences tried k = 1 in the first measured run)."""
    for _ in range(2):
        await asyncio.gather(
            *(_one(client, prompts[-1 - i % len(prompts)], 16 * (i + 1), True) for i in range(concurrency))
        )


@dataclass
class _Run:
    seconds: float
    latencies: list[float]
    tokens: int
    target_passes: int
    steps: dict[str, float]  # scheduler steps by mode during the run
    drafted: Counter[str]  # drafted tokens by proposer
    accepted: Counter[str]  # accepted tokens by proposer
    peak_rss_mib: float | None = None


def _reset_peak_rss(pid: int | None) -> None:
    """Start the server's peak RSS (VmHWM) afresh (Linux: clear_refs 5); nothing without a started server."""
    if pid is not None:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")


def _peak_rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


async def _run(client, concurrency: int, prompts: list[list[dict]], max_tokens: int, speculative: bool) -> _Run:
    before = await _steps(client)
    gate = asyncio.Semaphore(concurrency)

    async def limited(messages: list[dict]) -> tuple[float, dict]:
        async with gate:
            return await _one(client, messages, max_tokens, speculative)

    begin = time.perf_counter()
    answers = await asyncio.gather(*(limited(messages) for messages in prompts))
    seconds = time.perf_counter() - begin
    after = await _steps(client)
    return _Run(
        seconds=seconds,
        latencies=[latency for latency, _ in answers],
        tokens=sum(body["usage"]["completion_tokens"] for _, body in answers),
        target_passes=sum(body["verispec"]["target_passes"] for _, body in answers),
        steps={mode: after.get(mode, 0) - before.get(mode, 0) for mode in ("draft", "plain")},
        drafted=sum((Counter(body["verispec"]["drafted_by_proposer"]) for _, body in answers), Counter()),
        accepted=sum((Counter(body["verispec"]["accepted_by_proposer"]) for _, body in answers), Counter()),
    )


def _summarize(concurrency: int, speculative: bool, runs: list[_Run]) -> LevelResult:
    latencies = sorted(latency for run in runs for latency in run.latencies)
    seconds, tokens = sum(run.seconds for run in runs), sum(run.tokens for run in runs)
    passes = sum(run.target_passes for run in runs)
    draft, plain = (sum(run.steps[mode] for run in runs) for mode in ("draft", "plain"))
    return LevelResult(
        concurrency=concurrency, speculative=speculative, requests=len(latencies), tokens=tokens, seconds=seconds,
        tokens_per_second=tokens / seconds, latency_p50=statistics.median(latencies),
        latency_p95=_percentile(latencies, 0.95), latency_p99=_percentile(latencies, 0.99),
        mean_accepted_length=tokens / passes if passes else 0.0,
        draft_step_share=draft / max(1, draft + plain),
        run_tokens_per_second=[run.tokens / run.seconds for run in runs],
        drafted_by_proposer=dict(sum((run.drafted for run in runs), Counter())),
        accepted_by_proposer=dict(sum((run.accepted for run in runs), Counter())),
        peak_rss_mib=max((run.peak_rss_mib for run in runs if run.peak_rss_mib is not None), default=None),
    )  # fmt: skip


async def _one(client, messages: list[dict], max_tokens: int, speculative: bool) -> tuple[float, dict]:
    body = {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "speculative": speculative,
        "cache_salt": uuid.uuid4().hex,  # as a fresh server would meet it (see the module's docstring)
    }  # fmt: skip
    begin = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise VerispecError(f"the server answered {response.status_code}: {response.text[:300]}")
    return time.perf_counter() - begin, response.json()


async def _samples(client, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get("/metrics")).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


async def _steps(client) -> dict[str, float]:
    steps: dict[str, float] = {}
    for sample in await _samples(client, "verispec_scheduler_steps_total"):
        steps[sample.labels["mode"]] = steps.get(sample.labels["mode"], 0.0) + sample.value
    return steps


async def _policy_costs(client) -> dict[tuple[str, int, int], float]:
    samples = await _samples(client, "verispec_draft_policy_seconds")
    return {(s.labels["phase"], int(s.labels["batch_size"]), int(s.labels["k"])): s.value for s in samples}


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, min(len(sorted_values), round(q * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


HEADER = (
    "| concurrency | speculation | requests | tokens | wall s | tokens/s | p50 latency s | p95 latency s "
    "| p99 latency s | mean accepted length | drafting steps | accepted / drafted by proposer | peak RSS MiB |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _row(r: LevelResult) -> str:
    return (
        f"| {r.concurrency} | {'on' if r.speculative else 'off'} | {r.requests} | {r.tokens} | {r.seconds:.1f} "
        f"| {r.tokens_per_second:.2f} | {r.latency_p50:.2f} | {r.latency_p95:.2f} | {r.latency_p99:.2f} "
        f"| {r.mean_accepted_length:.2f} | {r.draft_step_share:.0%} | {_by_proposer(r)} "
        f"| {'—' if r.peak_rss_mib is None else f'{r.peak_rss_mib:.0f}'} |"
    )


def _by_proposer(r: LevelResult) -> str:
    """e.g. `model 61/80 (76%) · lookup 120/200 (60%)`; a dash when nothing was drafted."""
    parts = [
        f"{name} {r.accepted_by_proposer.get(name, 0)}/{drafted} ({r.accepted_by_proposer.get(name, 0) / drafted:.0%})"
        for name, drafted in sorted(r.drafted_by_proposer.items())
        if drafted
    ]
    return " · ".join(parts) or "—"


def median_interval(values: list[float], coverage: float = 0.90) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median (the sign test's): [v(j), v(n+1-j)] of the sorted
    values for the largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at least `coverage` (j = 1 when
    none reaches it). Returns (low, high, the interval's coverage). Free of any assumption on the noise's shape,
    which on a shared machine comes in spells, not in a bell."""
    ordered, n = sorted(values), len(values)

    def covered(j: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n

    j = 1
    while 2 * (j + 1) <= n + 1 and covered(j + 1) >= coverage:
        j += 1
    return ordered[j - 1], ordered[n - j], covered(j)


MIN_PAIRS_FOR_VERDICT = 4


def verdict(on: LevelResult, ratios: list[float]) -> str:
    """Faster or slower only when the interval of the pairs' ratios excludes 1; level otherwise."""
    if len(ratios) < MIN_PAIRS_FOR_VERDICT:
        return f"no verdict from {len(ratios)} pair(s) (--repeats {MIN_PAIRS_FOR_VERDICT} or more gives one)"
    low, high, coverage = median_interval(ratios)
    if low > 1:
        said = "FASTER"
    elif high < 1:
        said = "SLOWER"
    else:
        said = "level within the noise"
    same_work = "; on ran plain steps only, the same work as off" if on.draft_step_share == 0 else ""
    return f"{said} ({coverage:.0%} interval of the median {low:.2f}-{high:.2f}{same_work})"


def format_table(results: list[LevelResult]) -> str:
    lines = [HEADER, *(_row(r) for r in results), ""]
    for on in (r for r in results if r.speculative):
        off = next((r for r in results if not r.speculative and r.concurrency == on.concurrency), None)
        if off is not None and off.tokens_per_second:
            pairs = [a / b for a, b in zip(on.run_tokens_per_second, off.run_tokens_per_second, strict=True)]
            listed = ", ".join(f"{r:.2f}" for r in pairs)
            totals = on.tokens_per_second / off.tokens_per_second
            lines.append(
                f"concurrency {on.concurrency}: speculation on / off = {statistics.median(pairs):.2f}x tokens/s "
                f"(median of {len(pairs)} pair(s) of runs: {listed}; totals {totals:.2f}x): {verdict(on, pairs)}"
            )
    return "\n".join(lines)


def format_costs(costs: dict[tuple[str, int, int], float]) -> str:
    """The draft policy's measured step times per batch size B and draft length k (all B rows drafting).

    (draft + verify) / plain is what a drafting step must yield per row, in tokens, to beat plain decoding."""
    lines = [
        "| batch size B | k | draft(B, k) s | verify(B, k) s | verify / plain | (draft + verify) / plain |",
        "|---|---|---|---|---|---|",
    ]
    for batch, k in sorted({(b, k) for phase, b, k in costs if phase == "verify"}):
        plain, verify = costs.get(("verify", batch, 0)), costs[("verify", batch, k)]
        draft = costs.get(("draft", batch, k), 0.0) if k else 0.0
        if plain is None or (k and ("draft", batch, k) not in costs):
            continue
        ratios = f"{verify / plain:.2f} | {(draft + verify) / plain:.2f}"
        lines.append(f"| {batch} | {k} | {draft:.3f} | {verify:.3f} | {ratios} |")
    return "\n".join(lines)
