"""What an EAGLE-3 head costs beside an 8B-shaped target on this CPU, on random weights (acceptance is meaningless on
random weights; cost is not), and the speedup those costs project at published acceptance lengths.

    python benchmarks/eagle3_costs.py --shape llama-3.1-8b            # this machine's best kernels
    VERISPEC_KERNELS=avx2 python benchmarks/eagle3_costs.py --shape qwen3-8b
    python benchmarks/eagle3_costs.py --shape qwen3-8b --make-only     # only make (and cache) the random target
    python benchmarks/eagle3_costs.py --shape bundled                  # the bundled pair's c, for comparison

The target: a random checkpoint of the shape, made by llama.cpp's converter and llama-quantize as Q4_K_M
(benchmarks/random_gguf.py; cached under the verispec cache's bench/ folder: 4.6-5.0 GB; delete it after), on the
native stack (the GGUF default). The head: a random EAGLE-3 head of the published heads' shape for that target
(yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: hidden 4096, 32 heads, 8 KV heads, MLP 14336, draft vocabulary 32000;
AngelSlim/Qwen3-8B_eagle3: the same with MLP 12288), its matrices in Q4_0 on the native kernels as the method runs
it beside a native target (engine/eagle3.py).

Timed (median of --reps, interleaved, on a context of --context tokens; each pass rolled back):
- T(n): a target pass over n new rows, plain, and T_served(n) with the head's three layers served (the stack run in
  four ranges, the rows copied, fused by the head's fc): what a verify pass costs under eagle3;
- a draft step: one row of the head (its layer at the context's end, its output head, the argmax): c = step / T(1);
- a catch-up of n rows: what the first draft of a round costs after n tokens were accepted (the head reads them).
Projected speedup of a chain of k drafts at acceptance length tau (tokens per round, the bonus token included):
    tau T(1) / (T_served(k + 1) + catch-up(tau) + (k - 1) step)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from random_gguf import random_gguf  # beside this script
from timing import interleaved_medians  # beside this script

from verispec import load_model
from verispec.engine.eagle3 import Eagle3Drafter
from verispec.models.config import ModelConfig
from verispec.models.eagle3 import Eagle3Head, Eagle3Spec, visible_chain

SHAPES = {
    "llama-3.1-8b": dict(
        target=dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                    intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        head_intermediate=14336,
    ),
    "qwen3-8b": dict(
        target=dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=4096,
                    intermediate_size=12288, num_hidden_layers=36,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                    rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False),
        head_intermediate=12288,
    ),
}  # fmt: skip
DRAFT_VOCAB = 32000
ROWS = (1, 2, 3, 4, 5, 8, 16)  # verify passes timed: k + 1 rows for k = 0 .. 4, and wider
TAUS = (2.0, 3.0, 4.0)  # AngelSlim's published mean for Qwen3-8B is 1.99 (its docs' Eagle3 benchmark); 3, 4 above it


def _hf_names(config: dict) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors and shapes, Hugging Face names."""
    hidden, inter, heads, kv = (config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_key_value_heads"))  # fmt: skip
    dim = config.get("head_dim", hidden // heads)
    names = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,),
             "lm_head.weight": (config["vocab_size"], hidden)}  # fmt: skip
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                  p + "self_attn.q_proj.weight": (heads * dim, hidden),
                  p + "self_attn.k_proj.weight": (kv * dim, hidden), p + "self_attn.v_proj.weight": (kv * dim, hidden),
                  p + "self_attn.o_proj.weight": (hidden, heads * dim), p + "mlp.gate_proj.weight": (inter, hidden),
                  p + "mlp.up_proj.weight": (inter, hidden), p + "mlp.down_proj.weight": (hidden, inter)}  # fmt: skip
        if config["model_type"] == "qwen3":
            names |= {p + "self_attn.q_norm.weight": (dim,), p + "self_attn.k_norm.weight": (dim,)}
    return names


def _save_sharded(config: dict):
    """save(folder) for random_gguf: config.json and random bfloat16 tensors, a shard per layer (an 8B model never
    whole in memory)."""

    def save(folder: Path) -> None:
        from safetensors.torch import save_file
        from transformers import AutoConfig

        folder.mkdir(parents=True, exist_ok=True)
        AutoConfig.for_model(**config).save_pretrained(folder)
        shards: dict[str, dict[str, tuple[int, ...]]] = {}
        for name, shape in _hf_names(config).items():
            key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
            shards.setdefault(key, {})[name] = shape
        index, generator = {}, torch.Generator().manual_seed(0)
        for key, tensors in shards.items():
            file = f"model-{key}.safetensors"
            made = {}
            for name, shape in tensors.items():
                scale = 1.0 if len(shape) == 1 else shape[1] ** -0.5
                made[name] = (torch.randn(shape, generator=generator) * scale).to(torch.bfloat16)
                made[name] = made[name] + 1 if len(shape) == 1 else made[name]
                index[name] = file
            save_file(made, str(folder / file), metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))

    return save


def _head(target_config: ModelConfig, inter: int) -> Eagle3Head:
    """A random head of the published heads' shape, its matrices in Q4_0 on the native kernels."""
    layer = ModelConfig(vocab_size=target_config.vocab_size, hidden_size=4096, num_layers=1, num_heads=32,
                        num_kv_heads=8, intermediate_size=inter, rope_theta=target_config.rope_theta,
                        rope_scaling=target_config.rope_scaling)  # fmt: skip
    spec = Eagle3Spec(layer=layer, target_hidden=target_config.hidden_size, target_layers=None,
                      draft_vocab=DRAFT_VOCAB, vocab=target_config.vocab_size, own_embeddings=False)  # fmt: skip
    head = Eagle3Head(spec)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator) if p.dim() == 1
                    else torch.randn(p.shape, generator=generator) * p.shape[1] ** -0.5)  # fmt: skip
    head.d2t = torch.arange(DRAFT_VOCAB) * (target_config.vocab_size // DRAFT_VOCAB)
    head.on_the_kernels()
    return head.eval()


def _timers(target, head: Eagle3Head, context: list[int]) -> dict:
    """Each timed thing as a function returning its seconds (state rolled back after each)."""
    model, n = target.model, len(context)
    cache = model.new_cache(1, n + 32)
    drafter = Eagle3Drafter(model, head, slots=1, max_len=n + 64)
    model.serve_hidden(drafter.observe_hidden, layers=drafter.hidden_layers)
    model(torch.tensor([context]), cache, [0], num_logits=1, invariant=False)  # its features served and fused
    features = {p: drafter.fused[0][p] for p in range(n - 1)}
    last = drafter._catch_up([_job(context)])[0]  # the head's cache over the context
    model.serve_hidden(None)
    timers = {}

    def verify(rows: int, served: bool):
        def once() -> float:
            model.serve_hidden(drafter.observe_hidden if served else None, layers=drafter.hidden_layers)
            begin = time.perf_counter()
            model.forward_rows([context[:rows]], cache, [0])
            seconds = time.perf_counter() - begin
            cache.set_length(0, n)
            model.serve_hidden(None)
            return seconds

        return once

    for rows in ROWS:
        timers[f"T({rows})"], timers[f"T_served({rows})"] = verify(rows, False), verify(rows, True)

    def step() -> float:
        begin = time.perf_counter()
        positions = torch.tensor([[n - 1]])
        out = head(head.embeddings(torch.tensor([[context[-1]]]), model), last[None, None], cache=drafter.cache,
                   slots=[0], starts=[n - 1], positions=positions, visible=visible_chain([n - 1], [1], 1))  # fmt: skip
        int(head.d2t[int(head.logits(out[0, -1])[None].argmax())])
        seconds = time.perf_counter() - begin
        drafter.cache.set_length(0, n - 1)
        return seconds

    timers["step"] = step
    for rows in (1, 2, 3, 4, 5):
        timers[f"catch_up({rows})"] = _catch_up_timer(drafter, context, features, rows)
    return timers


def _job(tokens: list[int], k: int = 1):
    from verispec.decoding.noise import KeyedNoise
    from verispec.decoding.sampling import SamplingParams
    from verispec.engine.drafting import DraftJob

    return DraftJob(slot=0, tokens=tokens, k=k, params=SamplingParams(), noise=KeyedNoise(0, 8))


def _catch_up_timer(drafter: Eagle3Drafter, context: list[int], features: dict, rows: int):
    """The head reading the context's last `rows` positions and drafting from the last (a round's first draft)."""
    n = len(context)

    def once() -> float:
        drafter.held[0] = n - 1 - rows
        drafter.cache.set_length(0, n - 1 - rows)
        for p in range(n - 1 - rows, n - 1):
            drafter.fused[0][p] = features[p]
        begin = time.perf_counter()
        last = drafter._feed([_job(context)], [n - 1])
        int(drafter.head.d2t[int(drafter.head.logits(last)[0].argmax())])
        return time.perf_counter() - begin

    return once


def bundled(args) -> dict:
    """The bundled draft model's c beside the bundled target, as the command line runs them (bench/costs.py)."""
    from verispec.bench.costs import measure_costs
    from verispec.defaults import DEFAULT_DRAFT_VOCAB
    from verispec.models.draft_head import DraftHead, draft_ids
    from verispec.models.loading import load_pair

    target, draft = load_pair("target", "draft", quantization="gguf", progress=False)
    ids = draft_ids(DEFAULT_DRAFT_VOCAB, draft.model.config.vocab_size, frozenset(target.tokenizer.stop_token_ids))
    head = DraftHead(draft.model, target.model.config.vocab_size, ids).module
    context = target.tokenizer.encode("def fibonacci(n):\n    " * (args.context // 8))[: args.context]
    costs = measure_costs(target.model, draft.model, context, ks=(3,), repeats=args.reps, draft_head=head)
    return {"shape": "bundled", "context": len(context), "c": costs.c, "T(1)": costs.target_step_s,
            "draft_step": costs.draft_step_s, "T(4)/T(1)": costs.verify_ratio(3)}  # fmt: skip


def measure(args) -> dict:
    if args.shape == "bundled":
        return bundled(args)
    shape = SHAPES[args.shape]
    path = random_gguf(f"{args.shape}-eagle3", "Q4_K_M", _save_sharded(shape["target"]),
                       vocab=shape["target"]["vocab_size"])  # fmt: skip
    if args.make_only:
        return {"path": str(path)}
    target = load_model(path, "float32", progress=False, quantization="gguf")
    head = _head(target.model.config, shape["head_intermediate"])
    context = [int(t) for t in torch.randint(300, 30000, (args.context,), generator=torch.Generator().manual_seed(2))]
    median = interleaved_medians(_timers(target, head, context), args.reps)
    print(json.dumps(median), file=sys.stderr)  # the raw figures, whatever the report makes of them
    return _report(args, median)


def _report(args, median: dict) -> dict:
    t1 = median["T(1)"]
    out = {"shape": args.shape, "context": args.context, "reps": args.reps, "seconds": median,
           "c_step": median["step"] / t1, "served_overhead": {n: median[f"T_served({n})"] / median[f"T({n})"] - 1
                                                            for n in ROWS}}  # fmt: skip
    projected = {}
    for k in (1, 2, 3, 4):
        for tau in TAUS:
            if tau > k + 1:
                continue
            rows = max(1, round(tau))
            seconds = median[f"T_served({k + 1})"] + median[f"catch_up({min(rows, 5)})"] + (k - 1) * median["step"]
            projected[f"k={k} tau={tau}"] = tau * t1 / seconds
    out["projected_speedup"] = projected
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=[*sorted(SHAPES), "bundled"], default="llama-3.1-8b")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--make-only", action="store_true")
    args = parser.parse_args()
    with torch.inference_mode():
        print(json.dumps(measure(args), indent=2))


if __name__ == "__main__":
    main()
