"""Replay the `agent-runs` dataset's recorded steps through llama.cpp's own `llama-server`, plain and with each of
its speculative settings, beside a `verispec bench --dataset agent-runs` run's figures for the same steps.

    verispec bench --dataset agent-runs --num-prompts 84 --max-tokens 512 --methods plain,auto-suffix --k 3 \\
        --output /tmp/agent-runs
    python benchmarks/llama_server_agent_runs.py --verispec-results /tmp/agent-runs/results.json

Each recorded run meets a fresh server (started per run, its load not timed), which keeps the run's earlier steps
in its slot (llama-server's prompt cache) as verispec's bench keeps a session's; one slot, 2 threads, greedy.
Every step is sent to `/completion` as the token ids verispec's server renders for it (the model's own template
with the tools; llama-server's `--jinja` rendering has the same length) followed by the first token verispec's
plain decoding wrote, asking for as many more as it wrote (`n_predict`, `ignore_eos`): both sides decode the same
prompt to the same length, and the tokens before the first difference are counted. The first token is given
because verispec's tool grammar forces it (`<tool_call>`) and llama-server here cannot: through its chat endpoint
with `tool_choice: "required"` this model writes JSON code blocks until max_tokens (checked on the first step:
512 tokens, no call parsed). It counts as written, as a prefill's last row writes the first token. A step's time
is the client's wall time for the request, prefill included. llama.cpp's numerics differ from verispec's (and its
greedy text changes with what its cache held), so its text parts from verispec's after a while: each side's
drafts are verified against its own text.

llama-server is built with `cmake --build <llama.cpp>/build --target llama-server` in the llama.cpp tree that
`../shared/tools/llamacpp-native build` unpacks (docs/bench.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
from importlib import resources
from pathlib import Path

import httpx

from verispec.bench.llamacpp_native import binaries
from verispec.bench.peer_tools import PeerUnavailableError
from verispec.models.bundled import bundled_path
from verispec.models.tokenizer import Tokenizer
from verispec.server.tools import request_prompt

SETTINGS = {
    "plain": [],
    "draft-simple": ["--spec-type", "draft-simple", "-md", "{draft}"],
    "draft-simple-n8": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", "8"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}


def _runs(results: dict, sessions: int) -> list[list[tuple[list[int], list[int]]]]:
    """Each recorded run's steps as (prompt ids, verispec's plain output ids), from the bench's results."""
    path = resources.files("verispec.bench") / "data" / "agent_runs.jsonl"
    rows = {json.loads(line)["id"]: json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line}
    tokenizer = Tokenizer.from_gguf(bundled_path("target"))
    outputs = {r["prompt"]: r["output_ids"] for r in results["runs"] if r["method"] == "plain"}
    runs: dict[str, list] = {}
    for prompt in results["prompts"]:
        row = rows[prompt["id"]]
        ids, _ = request_prompt(row["request"], tokenizer)
        runs.setdefault(row["session"], []).append((ids, outputs[prompt["index"]]))
    return list(runs.values())[:sessions]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server() -> Path:
    """llama-server beside llama.cpp's other programs, or exit naming how to build it."""
    try:
        server = binaries() / "llama-server"
    except PeerUnavailableError as exc:
        raise SystemExit(str(exc)) from None
    if not os.access(server, os.X_OK):
        raise SystemExit(f"no llama-server in {server.parent}: build it with `cmake --build <llama.cpp>/build --target "
                         "llama-server` (docs/bench.md)")  # fmt: skip
    return server


def _start(setting: list[str], target: Path, draft: Path, port: int, log) -> subprocess.Popen:
    server = str(_server())
    args = [a.replace("{draft}", str(draft)) for a in setting]
    command = [server, "-m", str(target), "-t", "2", "-tb", "2", "-c", "8192", "-np", "1", "--port", str(port),
               "--jinja", "--no-webui", *args]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"llama-server exited ({process.returncode}): {' '.join(command)}")
        time.sleep(0.5)
    process.kill()
    raise SystemExit("llama-server did not become healthy in 120 s")


def replay(name: str, runs: list, target: Path, draft: Path, log) -> list[dict]:
    """Every step of every run through a fresh server per run: its tokens, wall time, whether its output equals
    verispec's, and llama.cpp's own timings."""
    results = []
    for number, steps in enumerate(runs):
        port = _free_port()
        process = _start(SETTINGS[name], target, draft, port, log)
        try:
            for step, (prompt, expected) in enumerate(steps):
                # the first token comes with the prompt: verispec's tool grammar forces it (`<tool_call>`), which
                # llama-server cannot; it counts as written, as a prefill's last row writes the first token
                body = {"prompt": prompt + expected[:1], "n_predict": len(expected) - 1, "ignore_eos": True,
                        "temperature": 0, "cache_prompt": True, "return_tokens": True, "seed": 0}  # fmt: skip
                start = time.perf_counter()
                reply = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=900).json()
                wall = time.perf_counter() - start
                if "tokens" not in reply:
                    raise SystemExit(f"{name} run {number} step {step}: {reply}")
                timings, written = reply.get("timings", {}), expected[:1] + reply["tokens"]
                differs = [i for i, (a, b) in enumerate(zip(written, expected, strict=False)) if a != b]
                results.append({
                    "setting": name, "run": number, "step": step, "wall_s": wall, "tokens": len(written),
                    "same_as_verispec": written == expected,
                    "common_prefix": differs[0] if differs else min(len(written), len(expected)),
                    "prompt_ms": timings.get("prompt_ms"), "predicted_ms": timings.get("predicted_ms"),
                    "draft_n": timings.get("draft_n"), "draft_accepted": timings.get("draft_n_accepted"),
                })  # fmt: skip
        finally:
            process.terminate()
            process.wait(timeout=30)
    return results


def _rate(rows: list[dict]) -> float:
    return sum(r["tokens"] for r in rows) / max(sum(r["wall_s"] for r in rows), 1e-9)


GROUPS = {"steps 1-4": lambda s: s < 4, "steps 5-6": lambda s: 4 <= s < 6, "step 7": lambda s: s == 6,
          "all": lambda s: True}  # fmt: skip


def summarize(results: list[dict], verispec: dict) -> None:
    """tokens/s per group of steps (prefill counted) for verispec's methods and each llama-server setting."""
    step_of = {p["index"]: int(p["id"].rsplit("-", 1)[1]) for p in verispec["prompts"]}
    table = {}
    for method in dict.fromkeys(r["method"] for r in verispec["runs"]):
        table[f"verispec {method}"] = [
            {"step": step_of[r["prompt"]], "tokens": r["new_tokens"], "wall_s": r["wall_s"]}
            for r in verispec["runs"] if r["method"] == method
        ]  # fmt: skip
    for name in dict.fromkeys(r["setting"] for r in results):
        table[f"llama-server {name}"] = [r for r in results if r["setting"] == name]
    print(
        f"{'':<30}" + "".join(f"{g:>11}" for g in GROUPS) + "   tokens/s, prefill counted; outputs = verispec's,"
        " tokens before the first difference"
    )
    for name, rows in table.items():
        rates = [_rate([r for r in rows if keep(r["step"])]) for keep in GROUPS.values()]
        same = sum(r.get("same_as_verispec", True) for r in rows)
        prefix = sum(r.get("common_prefix", r["tokens"]) for r in rows) / max(sum(r["tokens"] for r in rows), 1)
        print(f"{name:<30}" + "".join(f"{rate:11.1f}" for rate in rates) + f"   {same}/{len(rows)}, {prefix:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verispec-results", type=Path, required=True, help="results.json of the agent-runs bench")
    parser.add_argument("--sessions", type=int, default=12, help="replay the first N recorded runs")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    parser.add_argument("--output", type=Path, help="JSON file of every step's figures")
    args = parser.parse_args()
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings {', '.join(sorted(unknown))} (use {', '.join(SETTINGS)})")
    if not args.verispec_results.is_file():
        parser.error(f"no such file: {args.verispec_results}")
    verispec = json.loads(args.verispec_results.read_text())
    if not str(verispec.get("command", "")).count("agent-runs"):
        parser.error(f"{args.verispec_results} is not the results of `verispec bench --dataset agent-runs`")
    _server()
    target, draft = bundled_path("target"), bundled_path("draft")
    runs = _runs(verispec, args.sessions)
    replayed = {p["index"] for p in verispec["prompts"][: sum(len(steps) for steps in runs)]}
    verispec["runs"] = [r for r in verispec["runs"] if r["prompt"] in replayed]
    results = []
    with open(os.devnull, "w") as log:
        for name in args.settings.split(","):
            results += replay(name, runs, target, draft, log)
            print(f"{name}: {len([r for r in results if r['setting'] == name])} steps", flush=True)
            if args.output:
                args.output.write_text(json.dumps(results, indent=1))
    summarize(results, verispec)


if __name__ == "__main__":
    main()
