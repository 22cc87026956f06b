"""What a DFlash block drafter costs beside an 8B-shaped target on this CPU, on random weights (acceptance is
meaningless on random weights; cost is not), and the speedup those costs project at assumed acceptance lengths.

    python benchmarks/dflash_costs.py --shape llama-3.1-8b            # this machine's best kernels
    VERISPEC_KERNELS=avx2 python benchmarks/dflash_costs.py --shape qwen3-8b

The target: the random Q4_K_M checkpoint of the shape that benchmarks/eagle3_costs.py makes (llama.cpp's converter
and llama-quantize through benchmarks/random_gguf.py, cached under the verispec cache's bench/ folder as
`<shape>-eagle3-Q4_K_M.gguf`; make it with `eagle3_costs.py --shape <shape> --make-only`), on the native stack. The
drafter: a random DFlash drafter of the published b16 drafters' shape (z-lab/Qwen3-8B-DFlash-b16: five Qwen3 layers
of the target's hidden size, 32 heads, 8 KV heads, head size 128, the target's MLP size, reading five target layers,
block 16; the target's embeddings and output head), its matrices in Q4_0 on the native kernels as the method runs it
beside a native target (engine/dflash.py).

Timed (median of --reps, interleaved, on a context of --context tokens; each pass rolled back):
- T(1): a plain target pass over one row; T_served(n): over n rows with the drafter's five layers served and fused
  (the stack in six ranges, the rows copied, fc and its norm): what a verify pass costs under dflash;
- block(k): one block pass of k + 1 rows over the context (the drafter's layers, the target's head on k rows, the
  argmax): c_block(k) = block(k) / T(1), the cost of proposing k tokens;
- catch_up(n): writing the keys and values of n accepted positions into the drafter's cache.
Projected speedup of blocks of k drafts at acceptance length tau (tokens per round, the bonus token included):
    tau T(1) / (T_served(k + 1) + catch_up(tau) + block(k))
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from timing import interleaved_medians  # beside this script
from torch import nn

from verispec import load_model
from verispec.engine.dflash import DFlashProposer
from verispec.models.config import ModelConfig
from verispec.models.converted import cache_dir
from verispec.models.dflash import DFlashDrafter, DFlashSpec

SHAPES = {"llama-3.1-8b": dict(intermediate=14336, layers=32), "qwen3-8b": dict(intermediate=12288, layers=36)}
DRAFT_LAYERS = 5
BLOCK = 16
KS = (3, 7, 15)
TAUS = (3.0, 4.5, 6.0)  # assumed acceptance lengths (tokens per round), not measured: random weights accept nothing
ROWS = (1, 4, 8, 16)


def _target_layers(layers: int) -> tuple[int, ...]:
    """The published drafters' five layers (1 .. layers - 3, evenly), as inputs of the layers after them."""
    span = layers - 4
    return tuple(round(1 + i * span / (DRAFT_LAYERS - 1)) + 1 for i in range(DRAFT_LAYERS))


def _drafter(target: ModelConfig, intermediate: int) -> DFlashDrafter:
    """A random drafter of the published shape, each matrix drawn and put in Q4_0 on the native kernels in turn (the
    whole drafter never in float32 at once)."""
    from verispec.kernels import native
    from verispec.kernels.linear import NativeLinear

    layers = ModelConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size, num_layers=DRAFT_LAYERS,
                         num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=intermediate,
                         rope_theta=target.rope_theta, rope_scaling=target.rope_scaling, qk_norm=True)  # fmt: skip
    spec = DFlashSpec(layers=layers, target_hidden=target.hidden_size,
                      target_layers=_target_layers(target.num_layers), block_size=BLOCK,
                      mask_token=target.vocab_size - 1, vocab=target.vocab_size)  # fmt: skip
    with torch.device("meta"):
        drafter = DFlashDrafter(spec)
    generator = torch.Generator().manual_seed(1)
    native.claim_threads()

    def drawn(linear: nn.Linear) -> NativeLinear:
        rows = torch.randn(linear.out_features, linear.in_features, generator=generator) * linear.in_features**-0.5
        raw = rows.view(torch.uint8).reshape(rows.shape[0], -1)
        ids = torch.arange(rows.shape[0])
        return NativeLinear(linear.in_features, [(native.Q4_0, native.requantize_q4_0(0, raw, ids, rows.shape[1]))])

    for module in list(drafter.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, drawn(child))
            elif not list(child.children()) and any(p.is_meta for p in child.parameters()):
                for key, p in list(child.named_parameters(recurse=False)):
                    setattr(child, key, nn.Parameter(1.0 + 0.1 * torch.randn(p.shape, generator=generator)))
    return drafter.eval()


def _job(tokens: list[int], k: int):
    from verispec.decoding.noise import KeyedNoise
    from verispec.decoding.sampling import SamplingParams
    from verispec.engine.drafting import DraftJob

    return DraftJob(slot=0, tokens=tokens, k=k, params=SamplingParams(), noise=KeyedNoise(0, 8))


def _timers(target, drafter: DFlashDrafter, context: list[int]) -> dict:
    """Each timed thing as a function returning its seconds (state rolled back after each)."""
    model, n = target.model, len(context)
    cache = model.new_cache(1, n + 32)
    proposer = DFlashProposer(model, drafter, slots=1, max_len=n + 64)
    model.serve_hidden(proposer.observe_hidden, layers=proposer.hidden_layers)
    model(torch.tensor([context]), cache, [0], num_logits=1, invariant=False)  # its features served and fused
    fused = {p: proposer.fused[0][p] for p in range(n - 1)}
    proposer._catch_up([_job(context, 1)])  # the drafter's cache over the context
    model.serve_hidden(None)
    timers = {}

    def verify(rows: int, served: bool):
        def once() -> float:
            model.serve_hidden(proposer.observe_hidden if served else None, layers=proposer.hidden_layers)
            begin = time.perf_counter()
            model.forward_rows([context[:rows]], cache, [0])
            seconds = time.perf_counter() - begin
            cache.set_length(0, n)
            model.serve_hidden(None)
            return seconds

        return once

    for rows in ROWS:
        timers[f"T({rows})"], timers[f"T_served({rows})"] = verify(rows, False), verify(rows, True)

    def block(k: int):
        def once() -> float:
            begin = time.perf_counter()
            proposer._drafts([_job(context, k)])
            return time.perf_counter() - begin

        return once

    def catch_up(rows: int):
        def once() -> float:
            proposer.held[0] = n - 1 - rows
            proposer.cache.set_length(0, n - 1 - rows)
            for p in range(n - 1 - rows, n - 1):
                proposer.fused[0][p] = fused[p]
            begin = time.perf_counter()
            proposer._catch_up([_job(context, 1)])
            return time.perf_counter() - begin

        return once

    for k in KS:
        timers[f"block({k})"] = block(k)
    for rows in (1, 3, 5, 7):
        timers[f"catch_up({rows})"] = catch_up(rows)
    return timers


def measure(args) -> dict:
    shape = SHAPES[args.shape]
    path = cache_dir() / "bench" / f"{args.shape}-eagle3-Q4_K_M.gguf"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: make it with benchmarks/eagle3_costs.py --shape {args.shape} --make-only")
    target = load_model(path, "float32", progress=False, quantization="gguf")
    if target.model.config.num_layers != shape["layers"]:
        raise SystemExit(f"{path} has {target.model.config.num_layers} layers, not {shape['layers']}")
    drafter = _drafter(target.model.config, shape["intermediate"])
    context = [int(t) for t in torch.randint(300, 30000, (args.context,), generator=torch.Generator().manual_seed(2))]
    median = interleaved_medians(_timers(target, drafter, context), args.reps)
    print(json.dumps(median), file=sys.stderr)  # the raw figures, whatever the report makes of them
    return _report(args, median)


def _report(args, median: dict) -> dict:
    from verispec.kernels import native

    t1 = median["T(1)"]
    out = {"shape": args.shape, "kernels": native.isa(), "threads": native.threads(),
           "context": args.context, "reps": args.reps, "seconds": median,
           "c_block": {k: median[f"block({k})"] / t1 for k in KS},
           "served_overhead": {n: median[f"T_served({n})"] / median[f"T({n})"] - 1 for n in ROWS}}  # fmt: skip
    projected = {}
    for k in KS:
        verify = median[f"T_served({min(k + 1, 16)})"] if k + 1 in ROWS else None
        if verify is None:
            continue
        for tau in TAUS:
            if tau > k + 1:
                continue
            rows = min((r for r in (1, 3, 5, 7) if r >= tau), default=7)
            seconds = verify + median[f"catch_up({rows})"] + median[f"block({k})"]
            projected[f"k={k} tau={tau}"] = tau * t1 / seconds
    out["projected_speedup"] = projected
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with torch.inference_mode():
        print(json.dumps(measure(args), indent=2))


if __name__ == "__main__":
    main()
