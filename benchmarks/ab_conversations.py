"""Second turns of conversations through two servers, speculative (the defaults, plus --spec-flags) and plain
(--speculative-model none), timed as a user meets them, in two ways:

- continued: each server answers the first turn itself (not timed; greedy, so both write the same answer), then
  the second turn is timed: each server has the conversation's start cached, as one serving the whole chat would;
- fresh: the second turn (after the plain server's first answer) is sent with a new `cache_salt` to each server:
  nothing is cached on either side.

(`../shared/tools/ab-servers --second-turn` times a third way: the plain server answers the first turn, so its prefix
cache holds the conversation's start, and the speculative server meets the second turn fresh: its prefill counts on
one side only.)

    python benchmarks/ab_conversations.py --questions turns.jsonl [--per-category 2] [--skip 0]
        [--categories a,b] [--max-tokens 128] [--spec-flags "--speculative-quantization gguf"]

turns.jsonl: one {"category": ..., "turns": [first, second]} per line (lines with one turn are skipped).
Prints a table per way and a last line per way: mismatches and the speedup over all prompts (total times).
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import openai


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "verispec", "serve", "--port", str(port), *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, f"http://127.0.0.1:{port}"


def wait_healthy(process: subprocess.Popen, url: str) -> None:
    for _ in range(900):
        if process.poll() is not None:
            raise SystemExit(f"the server at {url} exited")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the server at {url} did not start")


def picked(args: argparse.Namespace) -> list[dict]:
    wanted = set(filter(None, args.categories.split(",")))
    seen: collections.Counter = collections.Counter()
    out = []
    with open(args.questions) as lines:
        questions = [json.loads(line) for line in lines]
    for question in questions:
        if len(question["turns"]) < 2 or (wanted and question["category"] not in wanted):
            continue
        seen[question["category"]] += 1
        if args.skip < seen[question["category"]] <= args.skip + args.per_category:
            out.append(question)
    return out


MODEL = {}  # client -> its server's model name


def ask(client: openai.OpenAI, messages: list[dict], max_tokens: int, salt: str | None) -> tuple[str, float, int]:
    extra = {"cache_salt": salt} if salt else None
    begin = time.perf_counter()
    answer = client.chat.completions.create(
        model=MODEL[id(client)], messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra
    )
    return answer.choices[0].message.content or "", time.perf_counter() - begin, answer.usage.completion_tokens


def run(questions: list[dict], spec: openai.OpenAI, plain: openai.OpenAI, max_tokens: int) -> dict[str, dict]:
    rows = {way: collections.defaultdict(lambda: [0, 0, 0.0, 0.0, 0]) for way in ("continued", "fresh")}
    for question in questions:
        first = [{"role": "user", "content": question["turns"][0]}]
        answers = [ask(client, first, max_tokens, None)[0] for client in (plain, spec)]
        for way in ("continued", "fresh"):
            timed = []
            for client, answer in zip((plain, spec), answers, strict=True):
                answer = answer if way == "continued" else answers[0]
                second = [
                    *first,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": question["turns"][1]},
                ]
                timed.append(ask(client, second, max_tokens, None if way == "continued" else uuid.uuid4().hex))
            (plain_text, plain_s, tokens), (spec_text, spec_s, _) = timed
            row = rows[way][question["category"]]
            for i, value in enumerate((1, plain_text != spec_text, plain_s, spec_s, tokens)):
                row[i] += value
    return rows


def report(way: str, rows: dict) -> None:
    print(f"\n{way}:\n\n| category | prompts | mismatches | plain tok/s | spec tok/s | speedup |")
    print("|---|---|---|---|---|---|")
    total = [0, 0, 0.0, 0.0, 0]
    for category, (n, mismatches, plain_s, spec_s, tokens) in sorted(rows.items()):
        rates = f"{tokens / plain_s:.2f} | {tokens / spec_s:.2f} | {plain_s / spec_s:.2f}x"
        print(f"| {category} | {n} | {mismatches} | {rates} |")
        total = [a + b for a, b in zip(total, (n, mismatches, plain_s, spec_s, tokens), strict=True)]
    worst = min(plain_s / spec_s for _, _, plain_s, spec_s, _ in rows.values())
    print(f"{way}: {total[1]} mismatches of {total[0]}; speedup {total[2] / total[3]:.2f}x "
          f"({total[4] / total[2]:.2f} -> {total[4] / total[3]:.2f} tok/s); worst category {worst:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--categories", default="")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--spec-flags", default="")
    args = parser.parse_args()
    servers = [start(shlex.split(args.spec_flags)), start(["--speculative-model", "none"])]
    try:
        for process, url in servers:
            wait_healthy(process, url)
        spec, plain = (openai.OpenAI(base_url=url + "/v1", api_key="ab", timeout=900) for _, url in servers)
        for client in (spec, plain):
            MODEL[id(client)] = client.models.list().data[0].id
        rows = run(picked(args), spec, plain, args.max_tokens)
        for way, table in rows.items():
            report(way, table)
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
