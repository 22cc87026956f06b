"""How far lookup drafting can go on a dataset: the engine's lookups replayed on a greedy bench run's answers,
beside an oracle that always picks the right earlier continuation.

    python benchmarks/lookup_bound.py BENCH_OUTPUT_DIR [--first 10]

Reads a `verispec bench` output (greedy, with `plain`): every speculative answer is plain decoding's, so the
lookups a suffix-only engine would draft can be replayed token by token on the plain answers, in the dataset's
order (each request's own trie over its prompt and answer so far, the index over earlier answers), with no model
run. Two ways of drafting are priced alike:

    lookups   the engine's own rule (engine/suffix.py best_lookup, with each request's lookup alpha as it goes)
    oracle    at each pass, the longest piece (<= 15 tokens) of the true answer that occurs anywhere in the
              request's prompt, its answer so far or an earlier answer: every lookup drafter's ceiling, since
              it knows which of the earlier continuations the target will take

A pass drafting d tokens costs T(1) x (1 + slope x d), with T(1) the request's plain decode time per token and
the slope fitted to the run's measured T(4)/T(1) and T(8)/T(1); prefill is the plain run's. The figures are
estimates of the verify passes alone (no draft model, no grammar): use them for the ceiling and for the gap, and
the bench for speed.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from verispec.bench.datasets import load_requests
from verispec.engine.suffix import DEPTH, LOOKUP_MAX, SuffixIndex, best_lookup, estimated_alpha
from verispec.kernels.suffix import SuffixTrie
from verispec.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=pathlib.Path, help="a `verispec bench --output` folder")
    parser.add_argument("--first", type=int, default=1, help="totals count requests from this one (1-based)")
    args = parser.parse_args()
    result = json.loads((args.output / "results.json").read_text())
    config = result["config"]
    if config["temperature"] != 0.0:
        raise SystemExit("the replay needs a greedy run (its answers are plain decoding's)")
    plain = {run["prompt"]: run for run in result["runs"] if run["method"] == "plain"}
    prompts = _prompt_ids(config, result["prompts"])
    slope = _slope(result["costs"]["pass_ratio"])
    index, totals = SuffixIndex(), {"plain": 0.0, "lookups": 0.0, "oracle": 0.0}
    print(f"pass cost T(1) x (1 + {slope:.3f} x drafted)")
    print("request  tokens  lookups: tokens/pass speedup   oracle: tokens/pass speedup")
    for number, prompt in enumerate(prompts):
        run = plain[number]
        answer = run["output_ids"]
        step = (run["wall_s"] - run["time_prefill"]) / max(len(answer), 1)
        replayed = _replay(prompt, answer, index, slope)
        ceiling = _oracle(prompt, answer, index, slope)
        index.add(answer)
        times = {name: run["time_prefill"] + step * cost for name, (_, cost) in
                 (("lookups", replayed), ("oracle", ceiling))}  # fmt: skip
        print(f"{number + 1:7d}  {len(answer):6d}  {len(answer) / replayed[0]:19.2f} "
              f"{run['wall_s'] / times['lookups']:7.2f}x  {len(answer) / ceiling[0]:18.2f} "
              f"{run['wall_s'] / times['oracle']:7.2f}x")  # fmt: skip
        if number + 1 >= args.first:
            totals["plain"] += run["wall_s"]
            totals["lookups"] += times["lookups"]
            totals["oracle"] += times["oracle"]
    print(f"requests {args.first}-{len(prompts)}: lookups {totals['plain'] / totals['lookups']:.2f}x, "
          f"oracle {totals['plain'] / totals['oracle']:.2f}x own plain (estimated)")  # fmt: skip


def _prompt_ids(config: dict, prompts: list[dict]) -> list[list[int]]:
    """The run's prompts as token ids, rebuilt from its dataset with the target's tokenizer."""
    tokenizer = load_model(config["model"], config["dtype"], config["device"], False, config["quantization"]).tokenizer
    requests = {request.id: request for request in load_requests(config["dataset"], config["chat"])}
    out = []
    for prompt in prompts:
        request = requests[prompt["id"]]
        out.append(tokenizer.encode_chat(request.prompt) if request.is_chat else tokenizer.encode(request.prompt))
    return out


def _slope(pass_ratio: dict[str, float]) -> float:
    """The least-squares slope of T(n)/T(1) - 1 over n - 1, through the origin."""
    points = [(int(n) - 1, ratio - 1) for n, ratio in pass_ratio.items()]
    return sum(x * y for x, y in points) / sum(x * x for x, _ in points)


def _replay(prompt: list[int], answer: list[int], index: SuffixIndex, slope: float) -> tuple[int, float]:
    """(passes, cost in plain steps) of the engine's lookups on `answer`."""
    own = SuffixTrie(DEPTH)
    own.extend(prompt)
    context, at, passes, cost, accepted, rejected = list(prompt), 0, 0, 0.0, 0, 0
    while at < len(answer):
        most = min(LOOKUP_MAX, len(answer) - at - 1)
        lookup = best_lookup([own, index.trie()], context, most, estimated_alpha(accepted, rejected))
        drafted = lookup.tokens if lookup is not None else []
        taken = 0
        while taken < len(drafted) and drafted[taken] == answer[at + taken]:
            taken += 1
        if drafted:
            accepted, rejected = accepted + taken, rejected + (taken < len(drafted))
        emitted = answer[at : at + taken + 1]
        own.extend(emitted)
        context += emitted
        at += len(emitted)
        passes, cost = passes + 1, cost + 1 + slope * len(drafted)
    return passes, cost


def _oracle(prompt: list[int], answer: list[int], index: SuffixIndex, slope: float) -> tuple[int, float]:
    """(passes, cost in plain steps) when each pass drafts the longest next piece of `answer` seen anywhere."""
    seen = set()
    for sequence in [prompt, *index.sequences]:
        _add_pieces(seen, sequence, 0)
    at, passes, cost = 0, 0, 0.0
    while at < len(answer):
        _add_pieces(seen, answer[:at], max(0, at - LOOKUP_MAX))
        most, drafted = min(LOOKUP_MAX, len(answer) - at - 1), 0
        while drafted < most and tuple(answer[at : at + drafted + 1]) in seen:
            drafted += 1
        at += drafted + 1
        passes, cost = passes + 1, cost + 1 + slope * drafted
    return passes, cost


def _add_pieces(seen: set, sequence: list[int], start: int) -> None:
    """Every piece of up to LOOKUP_MAX tokens of `sequence` that ends after `start`."""
    for end in range(start + 1, len(sequence) + 1):
        for length in range(1, min(LOOKUP_MAX, end) + 1):
            seen.add(tuple(sequence[end - length : end]))


if __name__ == "__main__":
    main()
