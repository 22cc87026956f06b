"""What verispec's passes cost on a GPU at real shapes (random weights), with and without one pass shape
(models/pass_shape.py: every pass at one padded shape, replayed from CUDA graphs), beside the memory's read rate and
transformers' own decoding of the same shape; and whether greedy speculative output is plain output there.

    python benchmarks/gpu_costs.py                                   # CUDA, bfloat16, 7b and 0.5b shapes
    python benchmarks/gpu_costs.py --hf                              # and transformers (eager; static cache + compile)
    python benchmarks/gpu_costs.py --device cpu --target tiny --draft tiny-draft --dtype float32   # a smoke run

Per pass shape (--pass-shapes, "off" = PyTorch's ordinary passes; "auto:compiled" = auto with each pass compiled by
torch.compile, its compilations done before any timing; "auto:written" = auto with the attention written out in
PyTorch's operations in place of the fused Triton kernel, kernels/triton_attention.py), one run:
- T(n): one sequence's pass over n new rows after a 256-token context (median of --reps); T(n)/T(1);
- c: the draft shape's one-row step over the target's T(1);
- GB/s at T(1): the target's weight bytes / T(1), against the card's read rate (a 4 GiB matrix-vector product);
- kernels per step: the CUDA kernels one decode step runs (what a graph replays, or Python launches without one),
  their summed time on the card (T(1) less that is gaps between kernels) and the dozen that take most of it;
- plain tok/s: greedy decoding of --tokens tokens after a 256-token prompt, prefill included;
- speculative tok/s with drafts of fixed acceptance (engine/fixed_acceptance.py: the target's own continuation, a share
  --acceptance right) at k = --k, alone and --batch sequences at once, and the speedup over plain at that batch;
- identical: each speculative output equals plain output at the same shape (greedy), counted;
- after --long-context tokens: T(1) and c per pass shape not compiled, and with the fused attention whether splitting
  the older keys into chunks pays (`:walked`: one program walks them all).
Writes everything as JSON to --out (default $OUT/gpu_costs.json where $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from verispec.decoding.sampling import SamplingParams  # noqa: E402
from verispec.engine.fixed_acceptance import fixed_acceptance  # noqa: E402
from verispec.engine.requests import EngineRequest, FinishEvent  # noqa: E402
from verispec.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from verispec.errors import InvalidParameterError  # noqa: E402
from verispec.kernels import triton_attention  # noqa: E402
from verispec.models.config import ModelConfig  # noqa: E402
from verispec.models.model import Transformer  # noqa: E402
from verispec.models.pass_shape import parse_pass_shape, use_pass_shape  # noqa: E402
from verispec.testing import byte_tokenizer, tiny_loaded, tiny_model  # noqa: E402

QWEN = dict(rope_theta=1e6, qkv_bias=True, max_position_embeddings=4096)
SHAPES = {  # Qwen2.5-7B, -1.5B and -0.5B-Instruct's shapes
    "7b": dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
               intermediate_size=18944, tie_word_embeddings=False, **QWEN),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                 intermediate_size=8960, tie_word_embeddings=True, **QWEN),
    "0.5b": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                 intermediate_size=4864, tie_word_embeddings=True, **QWEN),
    "tiny": dict(vocab_size=257, hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=384,
                 tie_word_embeddings=True, **QWEN),
    "tiny-draft": dict(vocab_size=257, hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                       intermediate_size=128, tie_word_embeddings=True, **QWEN),
}  # fmt: skip
CONTEXT = 256
WIDEST = 16  # the widest pass timed


def build(shape: str, device: str, dtype: torch.dtype) -> Transformer:
    """Random weights of `shape` (each product's output of unit scale), made on the device."""
    return tiny_model(ModelConfig(**SHAPES[shape]), dtype=dtype, device=device)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def read_rate(device: str) -> float | None:
    """The memory's read rate (GB/s): a bfloat16 matrix-vector product over 4 GiB (CUDA only)."""
    if not device.startswith("cuda"):
        return None
    matrix = torch.randn(32768, 65536, device=device, dtype=torch.bfloat16)
    vector = torch.randn(65536, device=device, dtype=torch.bfloat16)
    times = []
    for _ in range(12):
        synchronize(device)
        begin = time.perf_counter()
        matrix @ vector
        synchronize(device)
        times.append(time.perf_counter() - begin)
    rate = matrix.numel() * 2 / statistics.median(times[2:]) / 1e9
    del matrix, vector
    torch.cuda.empty_cache()
    return rate


def pass_times(model: Transformer, widths: tuple[int, ...], reps: int, device: str,
               length: int = CONTEXT) -> dict[int, float]:  # fmt: skip
    """Median ms of one sequence's pass over n new rows after `length` tokens, per n (interleaved, rolled back)."""
    cache = model.new_cache(num_slots=1, max_len=length + WIDEST + 1)  # one size: compiled passes compile once
    context = torch.arange(1, length + 1, device=device)[None] % model.config.vocab_size
    model(context, cache, [0], num_logits=1)
    samples: dict[int, list[float]] = {n: [] for n in widths}
    for rep in range(reps + 2):
        for n in widths:
            cache.set_length(0, length)
            synchronize(device)
            begin = time.perf_counter()
            model(context[:, :n], cache, [0], num_logits=n)
            synchronize(device)
            if rep >= 2:  # the first two: warm-up (and a CUDA graph's capture)
                samples[n].append(time.perf_counter() - begin)
    return {n: statistics.median(s) * 1e3 for n, s in samples.items()}


def kernels_per_step(model: Transformer, device: str) -> dict | None:
    """The CUDA kernels one decode step runs (PyTorch's profiler), its passes run eagerly: what a graph replays, or
    what Python launches one by one without a graph. Their count, their summed time on the card (against T(1): the
    rest is gaps between kernels), and the kernels that take most of it, by name. None off CUDA."""
    if not device.startswith("cuda"):
        return None
    from torch.profiler import ProfilerActivity, profile

    graphs, model.pass_graphs = model.pass_graphs, False
    try:
        cache = model.new_cache(num_slots=1, max_len=CONTEXT + WIDEST + 1)  # pass_times' size: compiled already
        context = torch.arange(1, CONTEXT + 1, device=device)[None] % model.config.vocab_size
        model(context, cache, [0], num_logits=1)
        model(context[:, :1], cache, [0])  # the step's own lazy initialisations, before counting
        cache.set_length(0, CONTEXT)
        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            model(context[:, :1], cache, [0])
            synchronize(device)
    finally:
        model.pass_graphs = graphs
    kernels = [event for event in profiled.events() if event.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name[:80], []).append(event.time_range.elapsed_us())
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:12]
    return {"count": len(kernels), "busy_ms": sum(sum(times) for times in by_name.values()) / 1e3,
            "top": [[name, len(times), round(sum(times), 1)] for name, times in top]}  # fmt: skip


def prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, min(vocab, 256), (CONTEXT,), generator=generator).tolist() for _ in range(count)]


def split(entry: str) -> tuple[str, bool]:
    """A --pass-shapes entry as (the shape, compiled); `written` says whether it asks for the written-out attention."""
    shape, *how = entry.split(":")
    if not set(how) <= {"compiled", "written"}:
        raise SystemExit(f"--pass-shapes: {entry!r}: a shape (off, auto, GxW), optionally followed by :compiled "
                         "and/or :written")  # fmt: skip
    return shape, "compiled" in how


def written(entry: str) -> bool:
    """Whether a --pass-shapes entry asks for the written-out attention (VERISPEC_FUSED_ATTENTION=0) in place of the
    fused kernel (kernels/triton_attention.py), the default on CUDA."""
    return "written" in entry.split(":")[1:]


FUSED_ATTENTION = os.environ.get("VERISPEC_FUSED_ATTENTION", "auto")  # as the run was started: 1 on a CPU interprets


def choose_attention(entry: str) -> None:
    """VERISPEC_FUSED_ATTENTION for an entry's passes (read by use_pass_shape, the engines' too)."""
    os.environ["VERISPEC_FUSED_ATTENTION"] = "0" if written(entry) else FUSED_ATTENTION


def run_batch(target, method: str | None, entry: str, prompts_: list[list[int]], tokens: int, args, device: str,
              room: int | None = None) -> tuple[list[list[int]], float]:  # fmt: skip
    """Every prompt at once through one engine of --batch slots (greedy, `tokens` each, the context sized for `room`
    tokens, default --tokens): the outputs and the wall seconds. Every engine of a run has caches of one size, since
    compiled passes compile once per cache size."""
    shape, compiled, k = *split(entry), args.k
    config = SchedulerConfig(max_num_seqs=args.batch, max_model_len=CONTEXT + (room or args.tokens) + 2 * k + 2,
                             num_speculative_tokens=k, draft_policy="always" if method else "never",
                             speculative_method=method, pass_shape=shape, compile_passes=compiled)  # fmt: skip
    engine = Scheduler(target, None, config)
    finals: dict[int, FinishEvent] = {}
    synchronize(device)
    begin = time.perf_counter()
    for i, ids in enumerate(prompts_):
        sink = lambda event, i=i: finals.__setitem__(i, event) if isinstance(event, FinishEvent) else None  # noqa: E731
        engine.submit(EngineRequest(request_id=str(i), prompt_ids=ids, params=SamplingParams(), max_tokens=tokens,
                                    sink=sink, ignore_eos=True))  # fmt: skip
    engine.run_until_idle(max_steps=100_000)
    synchronize(device)
    return [finals[i].output.token_ids for i in range(len(prompts_))], time.perf_counter() - begin


def speeds(target, shape: str, args, device: str) -> dict:
    """Plain and fixed-acceptance speculative tok/s, alone and batched, and how many outputs equal plain's."""
    result: dict = {}
    run_batch(target, None, shape, prompts(args.batch, target.model.config.vocab_size), 8, args, device)  # warm-up
    for batch in sorted({1, args.batch}):
        batch_prompts = prompts(batch, target.model.config.vocab_size)
        plain, seconds = run_batch(target, None, shape, batch_prompts, args.tokens, args, device)
        row = {"plain_tok_s": batch * args.tokens / seconds}
        truths = [p + o for p, o in zip(batch_prompts, plain, strict=True)]
        for acceptance in args.acceptance:
            with fixed_acceptance(truths, acceptance) as oracle:
                outputs, seconds = run_batch(target, oracle, shape, batch_prompts, args.tokens, args, device)
            tok_s = batch * args.tokens / seconds
            same = sum(o == p for o, p in zip(outputs, plain, strict=True))
            row[f"alpha_{acceptance}"] = {"tok_s": tok_s, "speedup": tok_s / row["plain_tok_s"],
                                          "identical": f"{same}/{batch}"}  # fmt: skip
        result[f"batch_{batch}"] = row
        print(f"  batch {batch}: {json.dumps(row)}", flush=True)
    return result


def measure(args, save) -> dict:
    """Every figure but transformers', `save(results)` called after each pass shape's (a visit cut short keeps what
    it measured)."""
    device, dtype = args.device, getattr(torch, args.dtype)
    if FUSED_ATTENTION == "1" and not device.startswith("cuda"):
        triton_attention.use_interpreter()  # the kernel's smoke run on a CPU (slow: Python runs each program)
    results: dict = {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
                     "torch": torch.__version__, "dtype": args.dtype, "read_GBps": read_rate(device)}  # fmt: skip
    print(f"read rate: {results['read_GBps']} GB/s", flush=True)
    if not args.pass_shapes:
        return results
    target = tiny_loaded(build(args.target, device, dtype), byte_tokenizer(), args.target)
    draft = build(args.draft, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    for text in args.pass_shapes:
        name, compiled = split(text)
        shape = parse_pass_shape(name, device)
        choose_attention(text)
        use_pass_shape(target.model, shape, asked=name != "auto", compiled=compiled)
        use_pass_shape(draft, shape, asked=name != "auto", compiled=compiled)
        times = pass_times(target.model, (1, 2, 4, 8, 16), args.reps, device)
        step = pass_times(draft, (1,), args.reps, device)[1]
        row = {"fused_attention": target.model.pass_fused, "T_ms": times,
               "T_ratio": {n: t / times[1] for n, t in times.items()}, "draft_step_ms": step, "c": step / times[1],
               "GBps_at_T1": weight_bytes / (times[1] / 1e3) / 1e9,
               "kernels_per_step": kernels_per_step(target.model, device)}  # fmt: skip
        print(f"pass shape {text}: {json.dumps(row)}", flush=True)
        results[f"shape_{text}"] = row
        save(results)
        row |= speeds(target, text, args, device)
        save(results)
    if args.long_context:
        long_context(target, draft, args, results.setdefault("long_context", {}), save=lambda: save(results))
    use_pass_shape(target.model, None)
    return results


def long_context(target, draft, args, result: dict, save) -> None:
    """T(1) and a draft step after --long-context tokens into `result`, per --pass-shapes entry not compiled; with the
    fused attention also `:walked`, one program walking each row's older keys (triton_attention.CHUNK past the
    context) where the default splits them into chunks: what the split buys. `save()` after each."""
    entries = [entry for entry in args.pass_shapes if not split(entry)[1]]
    for entry in entries + [f"{entry}:walked" for entry in entries if split(entry)[0] != "off" and not written(entry)]:
        name = split(entry.removesuffix(":walked"))[0]
        shape = parse_pass_shape(name, args.device)
        choose_attention(entry)
        chunk = triton_attention.CHUNK
        triton_attention.CHUNK = 1 << 30 if entry.endswith(":walked") else chunk
        try:
            for model in (target.model, draft):
                use_pass_shape(model, shape, asked=name != "auto")
            if entry.endswith(":walked") and not target.model.pass_fused:
                continue  # the attention written out: nothing walks
            t1 = pass_times(target.model, (1,), args.reps, args.device, length=args.long_context)[1]
            step = pass_times(draft, (1,), args.reps, args.device, length=args.long_context)[1]
        finally:
            triton_attention.CHUNK = chunk
        result[entry] = {"fused_attention": target.model.pass_fused, "T1_ms": t1, "draft_step_ms": step,
                         "c": step / t1}  # fmt: skip
        print(f"after {args.long_context} tokens, {entry}: {json.dumps(result[entry])}", flush=True)
        save()


def transformers_decoding(args, result: dict, save) -> None:
    """transformers' greedy decoding of the target's shape into `result`: eager, then with its static cache
    (compiled), `save()` after each (its compilation takes a minute or two: a visit cut short keeps the eager one)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SHAPES[args.target]
    config = Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                         num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                         rope_theta=shape["rope_theta"], tie_word_embeddings=shape["tie_word_embeddings"],
                         max_position_embeddings=4096)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype)).eval()
    ids = torch.arange(1000, 1000 + CONTEXT, device=args.device)[None] % shape["vocab_size"]

    def tok_s(**options) -> float:
        synchronize(args.device)
        begin = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, **options)
        synchronize(args.device)
        return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - begin)

    for name, options in (("eager", {}), ("static_compiled", {"cache_implementation": "static"})):
        tok_s(**options)  # warm-up (compilation)
        result[name + "_tok_s"] = statistics.median([tok_s(**options) for _ in range(3)])
        print(f"transformers {name}: {result[name + '_tok_s']:.1f} tok/s", flush=True)
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--target", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--pass-shapes", default="off,auto,auto:compiled,auto:written",
                        type=lambda text: text.split(",") if text else [],
                        help='comma-separated; "" measures none (with --hf: transformers alone)')  # fmt: skip
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--acceptance", default="0.6,0.8", type=lambda s: [float(a) for a in s.split(",")])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--long-context", type=int, default=4000,
                        help="then T(1) and c after this many tokens (0: not measured)")  # fmt: skip
    parser.add_argument("--hf", action="store_true", help="transformers' decoding of the target shape too")
    parser.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu_costs.json") if "OUT" in os.environ
                        else None)  # fmt: skip
    args = parser.parse_args()
    longest = min(SHAPES[args.target]["max_position_embeddings"], SHAPES[args.draft]["max_position_embeddings"])
    if not 0 <= args.long_context <= longest - WIDEST - 1:
        raise SystemExit(f"--long-context: from 0 to {longest - WIDEST - 1} (the shapes' positions)")
    for entry in args.pass_shapes:  # its mistakes before minutes of building
        try:
            parse_pass_shape(split(entry)[0], args.device)
        except InvalidParameterError as error:
            raise SystemExit(f"--pass-shapes: {error}") from None

    def save(results: dict) -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))

    results = measure(args, save)
    if args.hf:
        results["transformers"] = {}
        transformers_decoding(args, results["transformers"], lambda: save(results))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
