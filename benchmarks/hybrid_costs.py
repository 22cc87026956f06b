"""What speculation costs on Qwen3.5's hybrid layers, on random checkpoints (acceptance is meaningless on random
weights; cost is not): a verify pass of 1, 4, 8 rows against one decode step, the rollback of a rejected draft, and
the MTP layer's draft step against a target step (c), with the full head and with the head restricted to its first
--restricted rows (what --draft-vocab keeps: engine/mtp.py).

    python benchmarks/hybrid_costs.py                 # both shapes
    python benchmarks/hybrid_costs.py --shape small   # the tiny-but-not-trivial one only

Shapes (float32 on PyTorch: Qwen3.5 does not run on the native kernels):
- small: hidden 512, 8 layers (6 Gated DeltaNet, 2 gated attention), 8 heads of 64 (2 KV), DeltaNet 4 key heads and
  8 value heads of 64, MLP 1408, vocab 32000, its own head, one MTP layer: 62 M parameters.
- 0.8b: Qwen3.5-0.8B's published text config: hidden 1024, 24 layers (18 DeltaNet, 6 attention), 8 heads of 256
  (2 KV), DeltaNet 16 key and 16 value heads of 128, MLP 3584, vocab 248320 (tied head), one MTP layer: 773 M
  parameters.

Each figure is the median of --reps timed runs after a warm-up, on a context of --context tokens prefilled once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from verispec.models.config import ModelConfig
from verispec.models.mtp import transformer

SHAPES = {
    "small": ModelConfig(vocab_size=32000, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2,
                         intermediate_size=1408, head_dim=64, qk_norm=True, norm_offset=1.0, rotary_dim=16,
                         attn_output_gate=True, linear_layers=(0, 1, 2, 4, 5, 6), linear_key_heads=4,
                         linear_key_dim=64, linear_value_heads=8, linear_value_dim=64, linear_conv_kernel=4,
                         mtp_layers=1, max_position_embeddings=4096),
    "0.8b": ModelConfig(vocab_size=248320, hidden_size=1024, num_layers=24, num_heads=8, num_kv_heads=2,
                        intermediate_size=3584, head_dim=256, qk_norm=True, norm_offset=1.0, rotary_dim=64,
                        attn_output_gate=True, linear_layers=tuple(i for i in range(24) if (i + 1) % 4),
                        linear_key_heads=16, linear_key_dim=128, linear_value_heads=16, linear_value_dim=128,
                        linear_conv_kernel=4, tie_word_embeddings=True, mtp_layers=1, max_position_embeddings=4096),
}  # fmt: skip


def _median(run, reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


@torch.inference_mode()
def measure(name: str, config: ModelConfig, context: int, reps: int, restricted: int) -> None:
    torch.manual_seed(0)
    model = transformer(config).eval()
    params = sum(p.numel() for p in model.parameters())
    cache = model.new_cache(1, max_len=context + 32)
    ids = torch.randint(0, config.vocab_size, (1, context + 16))
    model(ids[:, :context], cache, [0], num_logits=1, invariant=False)

    def verify(rows: int):
        def run():
            model(ids[:, context : context + rows], cache, [0])
            cache.set_length(0, context)

        return run

    steps = {rows: _median(verify(rows), reps) for rows in (1, 4, 8)}

    def rollback():  # a verify pass of 5 rows of which 1 is kept: the set_length alone is timed
        model(ids[:, context : context + 5], cache, [0])
        begin = time.perf_counter()
        cache.set_length(0, context + 1)
        seconds.append(time.perf_counter() - begin)
        cache.set_length(0, context)

    seconds: list[float] = []
    for _ in range(reps + 1):
        rollback()
    back = statistics.median(seconds[1:])
    mtp = model.mtp
    mtp_cache = mtp.new_cache(1, max_len=context + 32)
    hidden = torch.randn(1, context, config.hidden_size)
    mtp.draft(model, ids[:, 1 : context + 1], hidden, mtp_cache, [0])
    head_rows = model.head_logits  # full head
    restricted_weight = (model.embed.weight if model.lm_head is None else model.lm_head.weight)[:restricted]

    def mtp_step(restrict: bool):
        def run():
            normed = mtp.draft(model, ids[:, context : context + 1], hidden[:, -1:], mtp_cache, [0])
            if restrict:
                torch.nn.functional.linear(normed[:, -1], restricted_weight)
            else:
                head_rows(normed[:, -1])
            mtp_cache.set_length(0, context)

        return run

    full, small = _median(mtp_step(False), reps), _median(mtp_step(True), reps)
    state_mb = len(config.linear_layers) * config.linear_value_heads * config.linear_key_dim * config.linear_value_dim
    state_mb = state_mb * 4 / 2**20
    print(f"\n{name}: {params / 1e6:.0f} M parameters, context {context}, float32 PyTorch, "
          f"{torch.get_num_threads()} threads; median of {reps}")  # fmt: skip
    print(f"  decode step T(1)        {steps[1] * 1e3:8.1f} ms")
    for rows in (4, 8):
        print(
            f"  verify pass T({rows})        {steps[rows] * 1e3:8.1f} ms   T({rows})/T(1) {steps[rows] / steps[1]:.2f}"
        )
    print(f"  rollback (set_length)   {back * 1e6:8.1f} us   {back / steps[4]:.2e} of T(4); "
          f"states kept per verify row {state_mb:.1f} MiB")  # fmt: skip
    print(f"  MTP draft step, full head ({config.vocab_size} rows)   {full * 1e3:7.1f} ms   c = {full / steps[1]:.3f}")
    print(f"  MTP draft step, head of {restricted} rows            {small * 1e3:7.1f} ms   c = {small / steps[1]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--restricted", type=int, default=16384, help="rows of the restricted MTP head")
    args = parser.parse_args()
    for name, config in SHAPES.items():
        if args.shape in (name, "all"):
            measure(name, replace(config), args.context, args.reps, args.restricted)


if __name__ == "__main__":
    main()
