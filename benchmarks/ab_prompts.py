"""Write `verispec bench` datasets as the prompt file of ../shared/tools/ab-servers (one {"category", "turns"} line
per request: the user turns; a conversation's assistant turns are the plain server's own answers there).

    python benchmarks/ab_prompts.py OUT.jsonl [--datasets multi-turn,code-edit,long] [--per-dataset 12]

Categories: a dataset's name, or for `long` each kind (long-summary, long-extract, long-rag). Run the second turns
of multi-turn with ab-servers' --second-turn, the rest without it.
"""

from __future__ import annotations

import argparse
import json

from verispec.bench.datasets import load_requests


def category(dataset: str, request_id: str) -> str:
    if dataset != "long":
        return dataset
    return "-".join(request_id.split("-")[:2])  # long-summary-statistics-3600 -> long-summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output")
    parser.add_argument("--datasets", default="multi-turn,code-edit,long")
    parser.add_argument("--per-dataset", type=int, default=12)
    args = parser.parse_args()
    lines = []
    for dataset in args.datasets.split(","):
        requests = [r for r in load_requests(dataset, chat=True) if r.grammar is None and r.chat is None]
        for request in requests[: args.per_dataset]:
            turns = [m["content"] for m in request.prompt if m["role"] == "user"]
            lines.append({"category": category(dataset, request.id), "turns": turns})
    with open(args.output, "w") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)
    print(f"wrote {len(lines)} prompts to {args.output}")


if __name__ == "__main__":
    main()
