"""What a verify pass costs on gpt-oss's mixture of experts: a pass of n rows reads the union of its rows' experts, so
T(n)/T(1) grows with the experts the rows pick, unlike a dense model's (random weights, PyTorch float32: the shape of
the cost, not gpt-oss's speed; no native kernel takes its experts yet).

    python benchmarks/moe_costs.py [--layers 2] [--reps 5]

Shape: gpt-oss-20b's layer (hidden 2880, 64 query heads and 8 KV heads of 64, 32 experts of 2880, 4 per token, sinks,
biases, the clamped SwiGLU, alternating sliding layers of 128), a few layers of it and a small vocabulary (the head
is not what is measured). The routers are random, so rows pick experts independently: the union of n rows' picks is
about 32 (1 - (1 - 4/32)^n) experts (4 for one row, 13 for four, 20 for eight).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.models.config import ModelConfig
from verispec.models.model import Transformer
from verispec.models.rope import RopeScaling


def shape(layers: int) -> ModelConfig:
    return ModelConfig(vocab_size=4096, hidden_size=2880, num_layers=layers, num_heads=64, num_kv_heads=8,
                       intermediate_size=2880, head_dim=64, qkv_bias=True, max_position_embeddings=4096,
                       layer_windows=tuple(128 if i % 2 == 0 else 0 for i in range(layers)),
                       rope_theta=150000.0, rope_scaling=RopeScaling("yarn", factor=32.0,
                                                                     original_max_position_embeddings=4096,
                                                                     attention_factor=1.3466),
                       num_experts=32, experts_per_token=4, expert_intermediate_size=2880, attn_sinks=True,
                       o_bias=True, moe_biases=True, router_softmax_topk=True, activation="swiglu_oai",
                       swiglu_alpha=1.702, swiglu_limit=7.0)  # fmt: skip


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Transformer(shape(args.layers)).eval()
    for p in model.parameters():
        p.normal_(0.0, 0.02)
    cache = model.new_cache(1, max_len=args.context + 16)
    ids = torch.randint(0, 4096, (1, args.context + 16), generator=torch.Generator().manual_seed(1))
    model(ids[:, : args.context], cache, [0], num_logits=1, invariant=False)
    seen: dict[int, float] = {}
    for rows in (1, 2, 4, 8):
        times = []
        for rep in range(args.reps + 1):
            begin = time.perf_counter()
            model(ids[:, args.context : args.context + rows], cache, [0])
            if rep:
                times.append(time.perf_counter() - begin)
            cache.set_length(0, args.context)
        seen[rows] = statistics.median(times)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"gpt-oss-20b's layer x {args.layers} ({params:.2f} B parameters, float32 PyTorch, "
          f"{torch.get_num_threads()} threads), context {args.context}, median of {args.reps}")  # fmt: skip
    for rows, seconds in seen.items():
        experts = 32 * (1 - (1 - 4 / 32) ** rows)
        print(f"  T({rows}) {seconds * 1e3:8.1f} ms   T({rows})/T(1) {seconds / seen[1]:.2f}   "
              f"experts read per layer (expected) {experts:4.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
