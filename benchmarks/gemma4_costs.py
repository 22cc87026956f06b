"""What speculation costs on Gemma 4 and its assistant, on random checkpoints (acceptance is meaningless on random
weights; cost is not): a verify pass of 1, 4, 8 rows against one decode step, and the assistant's draft step against
a target step (c), with its ordered-embedding head (the top 32 of 2048 clusters) and with its whole head.

    python benchmarks/gemma4_costs.py                    # both shapes, PyTorch float32 (Gemma 4 runs on PyTorch)
    python benchmarks/gemma4_costs.py --shape small
    python benchmarks/gemma4_costs.py --shape e2b-half --gguf Q4_K_M
        # a random file of the shape made by llama.cpp's converter and llama-quantize (cached), on the CPU default:
        # its matrices on the native kernels, the blocks on PyTorch; and the same file dequantized on PyTorch

Shapes (the target's):
- small: hidden 512, 10 layers (4 sliding of 8 heads of 128, then a full one of 8 heads of 256; 1 KV head), the last 4
  layers sharing keys and values, MLP 2048 (double-wide where shared), per-layer inputs of 64, vocab 32768: 0.10 B.
- default: transformers' Gemma4TextConfig defaults (its docstring's "similar to google/gemma-4-e2b-it"): hidden 2304,
  30 layers (5 sliding : 1 full), 8 heads of 256 (full: 512), 4 KV heads, MLP 9216, per-layer inputs of 256, vocab
  262144, tied head. Its per-layer embedding has 8192 rows here instead of 262144 (a lookup costs the same; the full
  table would take 8 GB): 3.1 B parameters.

The assistant: 4 layers (3 sliding, 1 full) of --assistant-hidden (default 512; the published assistants' config is
not available offline: the figures for 256 and 1024 bracket it), 4 heads shaped as the target's last sliding and
full layers, MLP 4 x hidden, reading the target's hidden state (its size) and keys; Gemma4AssistantConfig's defaults
for the head: 2048 clusters, 32 chosen per step.

Each figure is the median of --reps timed runs after a warm-up, on a context of --context tokens prefilled once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from random_gguf import random_gguf as made_gguf  # beside this script

from verispec import load_model
from verispec.models.assistant import AssistantModel
from verispec.models.config import ModelConfig
from verispec.models.gguf_native import linears_on_the_kernels
from verispec.models.model import Transformer
from verispec.models.rope import RopeScaling


def _gemma4(layers: int, hidden: int, heads: int, kv: int, dims: tuple[int, int], **rest) -> ModelConfig:
    """A Gemma 4 shape: every sixth layer (and the last) full, `dims` (sliding, full) head sizes."""
    window = rest.pop("window", 512)
    full = [(i + 1) % 6 == 0 or i == layers - 1 for i in range(layers)]
    shared = rest.pop("shared", 0)
    first = layers - shared
    sources = tuple(
        i if i < first else max(j for j in range(first) if full[j] == full[i]) for i in range(layers)
    )  # fmt: skip
    return ModelConfig(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=dims[0], qk_norm=True,
        post_norms=True, activation="gelu_tanh", embed_scale=True, query_scale=1.0, tie_word_embeddings=True,
        rope_theta=1e6, rope_scaling=RopeScaling("proportional", partial=0.25), rope_local_theta=1e4,
        layer_windows=tuple(0 if f else window for f in full), layer_head_dims=tuple(dims[f] for f in full),
        layer_kv_heads=(kv,) * layers, kv_sources=sources, v_norm=True, layer_scalar=True,
        wide_mlp_layers=tuple(i for i in range(first, layers)), max_position_embeddings=4096, **rest,
    )  # fmt: skip


SHAPES = {
    # E2B as its config has it (as far as we know it: not available offline): 35 layers of which the last 20 share
    # keys, hidden 1536, heads of 256 and 512, one kv head, MLP 6144 (double-wide where shared), per-layer inputs of
    # 256 over the whole vocabulary: 5.1 B parameters, 2.0 B of them in the per-layer table
    "e2b": _gemma4(35, 1536, 8, 1, (256, 512), shared=20, vocab_size=262144, intermediate_size=6144,
                   per_layer_input_size=256, per_layer_vocab=262144),
    # half of E2B's depth as its config has it (hidden 1536, heads of 256 and 512, one kv head, MLP 6144, per-layer
    # inputs of 256 over the whole vocabulary), 15 layers of which the last 5 share keys: 2.2 B parameters
    "e2b-half": _gemma4(15, 1536, 8, 1, (256, 512), shared=5, vocab_size=262144, intermediate_size=6144,
                        per_layer_input_size=256, per_layer_vocab=262144),
    "small": _gemma4(10, 512, 8, 1, (128, 256), shared=4, vocab_size=32768, intermediate_size=2048,
                     per_layer_input_size=64, per_layer_vocab=32768),
    "default": _gemma4(30, 2304, 8, 4, (256, 512), vocab_size=262144, intermediate_size=9216,
                       per_layer_input_size=256, per_layer_vocab=8192),
}  # fmt: skip


def assistant_for(target: ModelConfig, hidden: int, ordered: bool) -> AssistantModel:
    """A random assistant of 4 layers (3 sliding, 1 full) for `target`."""
    full = [False, False, False, True]
    makers = {f: max(i for i in range(target.num_layers) if target.kv_source(i) == i and (target.window(i) == 0) == f)
              for f in (False, True)}  # fmt: skip
    config = replace(
        target, hidden_size=hidden, num_layers=4, num_heads=4, intermediate_size=4 * hidden, per_layer_input_size=0,
        per_layer_vocab=0, wide_mlp_layers=(), kv_sources=(-1,) * 4,
        layer_windows=tuple(target.window(makers[f]) for f in full),
        layer_head_dims=tuple(target.head_size_of(makers[f]) for f in full),
        layer_kv_heads=tuple(target.kv_heads_of(makers[f]) for f in full),
    )  # fmt: skip
    model = _random(AssistantModel, config, target.hidden_size, (2048, 32) if ordered else (0, 0))
    if ordered:
        model.token_ordering.copy_(torch.randperm(target.vocab_size))
    return model


def hf_config(config: ModelConfig) -> dict:
    """The transformers config.json of a shape (gemma4_text)."""
    layers = config.num_layers
    full = [config.window(i) == 0 for i in range(layers)]
    return dict(model_type="gemma4_text", vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size, num_hidden_layers=layers,
                num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                head_dim=config.head_size_of(0), global_head_dim=config.head_size_of(layers - 1),
                layer_types=["full_attention" if f else "sliding_attention" for f in full],
                sliding_window=max(config.layer_windows), num_kv_shared_layers=sum(
                    config.kv_source(i) != i for i in range(layers)), use_double_wide_mlp=bool(config.wide_mlp_layers),
                hidden_size_per_layer_input=config.per_layer_input_size,
                vocab_size_per_layer_input=config.per_layer_vocab, max_position_embeddings=4096,
                final_logit_softcapping=30.0)  # fmt: skip


def random_gguf(name: str, config: ModelConfig, quant: str) -> Path:
    """A GGUF file of the shape in `quant`, from a random bfloat16 checkpoint (random_gguf.py: made once, cached)."""

    def save(folder: Path) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config(config)), dtype=torch.bfloat16)
        model.save_pretrained(folder)

    return made_gguf(f"gemma4-{name}", quant, save, vocab=config.vocab_size)


def _random(cls, *args):
    """A model of random weights (N(0, 0.02), norms and scalars 1), made without initialising twice."""
    with torch.device("meta"):
        model = cls(*args)
    model = model.to_empty(device="cpu").eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scalar"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model


def _median(run, reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def measure(label: str, model: Transformer, context: int, args) -> None:
    config, reps = model.config, args.reps
    cache = model.new_cache(1, max_len=context + 32)
    high = min(config.vocab_size, config.per_layer_vocab or config.vocab_size)  # ids the smaller table has
    ids = torch.randint(0, high, (1, context + 16), generator=torch.Generator().manual_seed(0))
    model(ids[:, :context], cache, [0], num_logits=1, invariant=False)

    def verify(rows: int):
        def run():
            model(ids[:, context : context + rows], cache, [0])
            cache.set_length(0, context)

        return run

    steps = {rows: _median(verify(rows), reps) for rows in (1, 4, 8)}
    print(f"\n{label}: context {context}, {torch.get_num_threads()} PyTorch threads; median of {reps}")
    print(f"  decode step T(1)        {steps[1] * 1e3:8.1f} ms")
    for rows in (4, 8):
        print(
            f"  verify pass T({rows})        {steps[rows] * 1e3:8.1f} ms   T({rows})/T(1) {steps[rows] / steps[1]:.2f}"  # noqa: E501
        )
    hidden = torch.randn(1, config.hidden_size)
    for size in args.assistant_hidden:
        for ordered in (True, False):
            helper = assistant_for(config, size, ordered)
            helper.bind(model)
            if type(model.lm_head).__name__ == "NativeLinear":  # as the drafter puts it beside such a target
                linears_on_the_kernels(helper)
                helper.native_head()
            params = sum(p.numel() for p in helper.parameters()) / 1e6

            def draft(helper=helper):
                helper.step(model, [int(ids[0, context])], hidden, cache=cache, slots=[0])

            seconds = _median(draft, reps)
            head = "32 of 2048 clusters" if ordered else "whole head"
            print(f"  assistant hidden {size:5d} ({params:5.0f} M), {head:19s}  draft step {seconds * 1e3:7.2f} ms"
                  f"   c = {seconds / steps[1]:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--assistant-hidden", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--gguf", metavar="TYPE", help="a random file of the shape in this llama-quantize type")
    parser.add_argument(
        "--forms",
        nargs="+",
        choices=["gguf", "none"],
        default=["none", "gguf"],  # PyTorch first: a load for the native kernels hands it PyTorch's threads
        help="with --gguf: the file on the native kernels (gguf), dequantized on PyTorch (none)",
    )
    args = parser.parse_args()
    for name, config in SHAPES.items():
        if args.shape != name and (args.shape != "all" or name.startswith("e2b")):  # "all": the random-weight ones
            continue
        if args.gguf:
            path = random_gguf(name, config, args.gguf)
            for form in args.forms:
                model = load_model(path, progress=False, quantization=form).model
                where = "matrices on the native kernels" if form == "gguf" else "dequantized, float32 PyTorch"
                measure(f"{name} ({args.gguf}, {path.stat().st_size / 1e9:.2f} GB: {where})", model, args.context,
                        args)  # fmt: skip
                del model
            continue
        model = _random(Transformer, config)
        params = sum(p.numel() for p in model.parameters())
        measure(f"{name} ({params / 1e9:.2f} B parameters, float32 PyTorch)", model, args.context, args)


if __name__ == "__main__":
    main()
