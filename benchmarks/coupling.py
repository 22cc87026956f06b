"""What keyed sampling costs in acceptance: on the bundled pair, at every position of sampled chat answers, the
chance the draft model's token is accepted under Leviathan et al.'s rejection rule (sum over x of min(p, q), the
most any rule can accept) beside the chance its keyed draw equals the target's (both racing the same exponential
noise, decoding/noise.py), estimated over many noise draws.

    python benchmarks/coupling.py [--tokens 60] [--draws 100] [--temperature 0.8]

Both are computed on the same distributions (teacher-forced over the target's own sampled answers), so the
comparison is free of the noise of different texts that a bench run of each rule would carry.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import verispec
from verispec.decoding.sampling import SamplingParams, probs_from_logits

PROMPTS = [
    "Explain what a hash table is in three sentences.",
    "Write a haiku about autumn rain.",
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "What are the main causes of inflation? Answer briefly.",
    "Translate to French: The weather is nice today and we are going to the park.",
]


def _logits(model, tokens: list[int]) -> torch.Tensor:
    cache = model.model.new_cache(max_len=len(tokens) + 1)
    return model.model(torch.tensor([tokens]), cache, [0])[0].float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()
    target = verispec.load_model("target", quantization="gguf", progress=False)
    draft = verispec.load_model("draft", quantization="gguf", progress=False)
    vocab = target.model.config.vocab_size
    plain = verispec.SpeculativeGenerator(target, None, progress=False)
    params = SamplingParams(temperature=args.temperature)
    noise = np.random.default_rng(0)
    best_all, keyed_all = [], []
    print(f"{'prompt':<40} {'positions':>9} {'sum min(p,q)':>13} {'keyed match':>12}")
    for prompt in PROMPTS:
        ids = target.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        answer = plain.generate(ids, max_tokens=args.tokens, temperature=args.temperature, seed=1).token_ids
        tokens = ids + answer
        p_rows = _logits(target, tokens)[len(ids) - 1 : -1]
        q_rows = _logits(draft, tokens)[len(ids) - 1 : -1, :vocab]
        best, keyed = [], []
        for p_logits, q_logits in zip(p_rows, q_rows, strict=True):
            p, q = probs_from_logits(p_logits, params), probs_from_logits(q_logits, params)
            best.append(float(torch.minimum(p, q).sum()))
            hits = 0
            for _ in range(args.draws):
                race = torch.from_numpy(noise.standard_exponential(vocab, dtype=np.float32))
                hits += int((p / race).argmax()) == int((q / race).argmax())
            keyed.append(hits / args.draws)
        best_all += best
        keyed_all += keyed
        print(f"{prompt[:40]:<40} {len(best):>9} {np.mean(best):>13.3f} {np.mean(keyed):>12.3f}")
    print(f"{'all':<40} {len(best_all):>9} {np.mean(best_all):>13.3f} {np.mean(keyed_all):>12.3f}")


if __name__ == "__main__":
    main()
