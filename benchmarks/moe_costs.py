"""What a verify pass costs on gpt-oss's mixture of experts: a pass of n rows reads the union of its rows' experts, so
T(n)/T(1) grows with the experts the rows pick, unlike a dense model's (random weights, PyTorch float32: the shape of
the cost, not gpt-oss's speed; no native kernel takes its experts yet).

    python benchmarks/moe_costs.py [--layers 2] [--reps 5]
    python benchmarks/moe_costs.py --gguf MXFP4_MOE
        # the layers as a random file made by llama.cpp's converter and llama-quantize (its experts MXFP4, as the
        # published gpt-oss GGUF files have them; cached): on the native kernels, then dequantized on PyTorch

Shape: gpt-oss-20b's layer (hidden 2880, 64 query heads and 8 KV heads of 64, 32 experts of 2880, 4 per token, sinks,
biases, the clamped SwiGLU, alternating sliding layers of 128), a few layers of it and a small vocabulary (the head
is not what is measured). The routers are random, so rows pick experts independently: the union of n rows' picks is
about 32 (1 - (1 - 4/32)^n) experts (4 for one row, 13 for four, 20 for eight).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from random_gguf import random_gguf as made_gguf  # beside this script

from verispec import load_model
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


def random_gguf(layers: int, quant: str) -> Path:
    """The layers of `shape` as a GGUF file in `quant`, from a random bfloat16 checkpoint made by transformers
    (random_gguf.py: made once, cached)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(vocab_size=4096, hidden_size=2880, num_hidden_layers=layers, num_attention_heads=64,
                  num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=32,
                  num_experts_per_tok=4, sliding_window=128, max_position_embeddings=4096,
                  layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
                  rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                   "rope_theta": 150000.0, "original_max_position_embeddings": 4096,
                                   "truncate": True})  # fmt: skip

    def save(folder: Path) -> None:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_oss", **fields), dtype=torch.bfloat16)
        model.save_pretrained(folder)

    return made_gguf(f"gpt-oss-20b-{layers}-layers", quant, save, vocab=4096)


def measure(label: str, model, args) -> None:
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
    print(f"{label}, context {args.context}, median of {args.reps}")
    for rows, seconds in seen.items():
        experts = 32 * (1 - (1 - 4 / 32) ** rows)
        print(f"  T({rows}) {seconds * 1e3:8.1f} ms   T({rows})/T(1) {seconds / seen[1]:.2f}   "
              f"experts read per layer (expected) {experts:4.1f}")  # fmt: skip


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gguf", metavar="TYPE", help="the layers as a random file in this llama-quantize type")
    args = parser.parse_args()
    if args.gguf:
        path = random_gguf(args.layers, args.gguf)
        # PyTorch first: loading for the native kernels hands PyTorch's threads to the native library
        for form, where in (("none", "dequantized, float32 PyTorch"), ("gguf", "matrices on the native kernels")):
            model = load_model(path, progress=False, quantization=form).model
            measure(f"gpt-oss-20b's layer x {args.layers} ({args.gguf}, {path.stat().st_size / 1e9:.2f} GB: {where}, "
                    f"{torch.get_num_threads()} PyTorch threads)", model, args)  # fmt: skip
            del model
        return
    torch.manual_seed(0)
    model = Transformer(shape(args.layers)).eval()
    for p in model.parameters():
        p.normal_(0.0, 0.02)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    measure(f"gpt-oss-20b's layer x {args.layers} ({params:.2f} B parameters, float32 PyTorch, "
            f"{torch.get_num_threads()} threads)", model, args)  # fmt: skip


if __name__ == "__main__":
    main()
