"""What the engine's loop itself costs per step: the tiny random test pair (verispec.testing), whose passes cost next
to nothing, so the milliseconds per step are the scheduler's Python (admission, the policy, proposing, verifying,
emitting), for plain decoding, the draft method and suffix drafting.

    python benchmarks/step_overhead.py                 # 300 tokens, median of 7 per method
    PYTHONPATH=/other/checkout/src python benchmarks/step_overhead.py   # another checkout's loop, to compare

A change to the step loop is measured with this before and after, alternated, in one sitting.
"""

from __future__ import annotations

import statistics
import sys
import time

from verispec.generator import SpeculativeGenerator
from verispec.testing import tiny_pair

TOKENS, REPEATS = 300, 7


def main() -> int:
    target, draft = tiny_pair()
    for label, model in (("plain", None), ("draft", draft), ("suffix", draft)):
        method = None if model is None else label
        generator = SpeculativeGenerator(target, model, max_seq_len=512, progress=False, speculative_method=method)
        generator.generate("hello world", max_tokens=20, ignore_eos=True)  # warm-up
        per_step = []
        for _ in range(REPEATS):
            begin = time.perf_counter()
            out = generator.generate("The quick brown fox", max_tokens=TOKENS, ignore_eos=True)
            per_step.append((time.perf_counter() - begin) / out.stats.target_passes)
        print(f"{label:>6}: {statistics.median(per_step) * 1e3:.3f} ms per step (median of {REPEATS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
