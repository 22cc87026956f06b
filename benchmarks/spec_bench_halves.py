"""Split Spec-Bench's questions into a tuning half and a held-back half, as the prompt files of
`benchmarks/ab_conversations.py` and `../shared/tools/ab-servers` ({"category", "turns"} lines).

    python benchmarks/spec_bench_halves.py question.jsonl OUT_DIR

question.jsonl: `data/spec_bench/question.jsonl` of github.com/hemingkx/Spec-Bench (fd2c1cd was used; not shipped
here: its texts come from datasets under their own licenses). Within each category the questions at even positions
(0, 2, ...) go to OUT_DIR/tune.jsonl, those at odd positions to OUT_DIR/heldout.jsonl: tune on the first, report on
the second. MT-Bench's questions (ids 81-160) keep both turns; the others keep their first (the only one they use).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

MT_BENCH_IDS = range(81, 161)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("questions")
    parser.add_argument("output")
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    halves: dict[str, list[str]] = {"tune": [], "heldout": []}
    seen: collections.Counter = collections.Counter()
    with open(args.questions) as lines:
        for line in lines:
            question = json.loads(line)
            turns = question["turns"] if question["question_id"] in MT_BENCH_IDS else question["turns"][:1]
            half = "tune" if seen[question["category"]] % 2 == 0 else "heldout"
            seen[question["category"]] += 1
            halves[half].append(json.dumps({"category": question["category"], "turns": turns}))
    for half, rows in halves.items():
        (out / f"{half}.jsonl").write_text("".join(row + "\n" for row in rows))
        print(f"wrote {len(rows)} questions to {out / f'{half}.jsonl'}")


if __name__ == "__main__":
    main()
