"""What verification costs beyond the target's pass: on the bundled pair, 8 sequences decoded together, each
drafting 3 tokens a step (4 rows each: the draft model, draft_policy "always"), the time of Scheduler._verify
less the time of its target pass, as a share of the whole step, greedy and sampled; and the part of it spent
drawing the sampled rows' keyed noise (decoding/noise.py: one Exp(1) draw per vocabulary entry for each position
not drawn before, by the draft model or an earlier pass).

    python benchmarks/verify_overhead.py [--sequences 8] [--k 3] [--tokens 64]

Run it with PYTHONPATH pointing at another checkout's src/ to compare two versions on one machine.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import verispec
from verispec.decoding.noise import KeyedNoise
from verispec.engine.requests import EngineRequest
from verispec.engine.scheduler import Scheduler, SchedulerConfig

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a hash table is in three sentences.",
    "Write a haiku about autumn rain.",
    "Write a Python class for a stack with push, pop and peek.",
    "What are the main causes of inflation? Answer briefly.",
    "Write a function that returns the n-th Fibonacci number iteratively.",
    "Translate to French: The weather is nice today and we are going to the park.",
    "Write a Python function that checks whether a string is a palindrome.",
]


class Timer:
    """Wraps a function, adding the seconds of each call made while `on` to the current step's."""

    def __init__(self, function) -> None:
        self.function, self.seconds = function, 0.0

    def __call__(self, *args, **kwargs):
        begin = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - begin


def measure(target, draft, args, temperature: float) -> tuple[float, float, float, float, int]:
    """Median per step of (step, verification without its pass, the pass, the noise drawn during verification)
    seconds, and the steps measured."""
    config = SchedulerConfig(
        max_num_seqs=args.sequences, max_model_len=1024, num_speculative_tokens=args.k, draft_policy="always"
    )
    scheduler = Scheduler(target, draft, config)
    # where the verify pass is run from: the verification room (newer checkouts) or the scheduler (older ones)
    room = getattr(scheduler, "verifier", scheduler)
    module = importlib.import_module(
        "verispec.engine.verification" if room is not scheduler else "verispec.engine.scheduler"
    )
    forward_name = next(name for name in ("pass_logits", "padded_logits", "padded_forward") if hasattr(module, name))
    forward = Timer(getattr(module, forward_name))
    verify_name = "verify" if room is not scheduler else "_verify"
    verify = Timer(getattr(room, verify_name))
    in_verify = [0.0]

    def verify_counting_noise(*a, **k):
        before = draws.seconds
        try:
            return verify(*a, **k)
        finally:
            in_verify[0] += draws.seconds - before

    # the noise's drawing method: log_exponentials (current), exponentials (older checkouts)
    draw_name = "log_exponentials" if hasattr(KeyedNoise, "log_exponentials") else "exponentials"
    original_draws = getattr(KeyedNoise, draw_name)
    draws = Timer(original_draws)
    setattr(KeyedNoise, draw_name, lambda self, position: draws(self, position))
    setattr(module, forward_name, forward)
    setattr(room, verify_name, verify_counting_noise)
    try:
        for i in range(args.sequences):
            prompt = PROMPTS[i % len(PROMPTS)]
            ids = target.tokenizer.encode_chat([{"role": "user", "content": prompt}])
            params = verispec.SamplingParams(temperature=temperature, seed=i if temperature else None)
            scheduler.submit(
                EngineRequest(
                    request_id=f"{i}",
                    prompt_ids=ids,
                    params=params,
                    max_tokens=args.tokens,
                    sink=lambda event: None,
                    ignore_eos=True,
                )
            )
        rows = []
        while True:
            forward.seconds = verify.seconds = in_verify[0] = 0.0
            begin = time.perf_counter()
            if not scheduler.step():
                break
            step = time.perf_counter() - begin
            # steps of the whole batch verifying (not prefill, not the batch draining)
            running = list(scheduler.running.values())
            if forward.seconds and len(running) == args.sequences and not any(s.prefilling for s in running):
                rows.append((step, verify.seconds - forward.seconds, forward.seconds, in_verify[0]))
    finally:
        setattr(module, forward_name, forward.function)
        setattr(KeyedNoise, draw_name, original_draws)
    return (*(statistics.median(r[j] for r in rows) for j in range(4)), len(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    target = verispec.load_model("target", quantization="gguf", progress=False)
    draft = verispec.load_model("draft", quantization="gguf", progress=False)
    print(f"{args.sequences} sequences x {args.k + 1} rows, {verispec.__file__}")
    print(f"{'decoding':<9} {'steps':>5} {'step ms':>8} {'pass ms':>8} {'verify-pass ms':>15} {'share':>6} "
          f"{'of it noise ms':>15} {'share less noise':>17}")  # fmt: skip
    for name, temperature in (("greedy", 0.0), ("sampled", 0.8)):
        step, overhead, forward, noise, steps = measure(target, draft, args, temperature)
        print(f"{name:<9} {steps:>5} {step * 1e3:>8.1f} {forward * 1e3:>8.1f} {overhead * 1e3:>15.2f} "
              f"{overhead / step:>6.1%} {noise * 1e3:>15.2f} {(overhead - noise) / step:>17.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
