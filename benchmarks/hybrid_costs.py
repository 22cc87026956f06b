"""What speculation costs on Qwen3.5's hybrid layers, on random checkpoints (acceptance is meaningless on random
weights; cost is not): a verify pass of 1, 4, 8 rows against one decode step, the rollback of a rejected draft, and
the MTP layer's draft step against a target step (c), with the full head and with the head restricted to its first
N rows (what --draft-vocab keeps: engine/mtp.py).

    python benchmarks/hybrid_costs.py                      # both shapes on PyTorch, float32
    python benchmarks/hybrid_costs.py --shape 0.8b --gguf Q4_K_M
        # the 0.8b shape as a Q4_K_M file made by llama.cpp's converter and llama-quantize from a random checkpoint
        # (cached), on the CPU default: its matrices on the native kernels, the blocks one by one

Shapes:
- small: hidden 512, 8 layers (6 Gated DeltaNet, 2 gated attention), 8 heads of 64 (2 KV), DeltaNet 4 key heads and
  8 value heads of 64, MLP 1408, vocab 32000, its own head, one MTP layer: 62 M parameters.
- 0.8b: Qwen3.5-0.8B's published text config as far as we know it: hidden 1024, 24 layers (18 DeltaNet, 6 attention),
  8 heads of 256 (2 KV), DeltaNet 16 key and 16 value heads of 128, MLP 3584, vocab 248320 (tied head), one MTP
  layer: 773 M parameters.

Each figure is the median of --reps timed runs after a warm-up, on a context of --context tokens prefilled once.
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
from verispec.models.draft_head import DraftHead, frequent_ids
from verispec.models.mtp import transformer
from verispec.models.recurrent_state import RecurrentState

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
HEAD_ROWS = (16384, 32768, 65536)


def _median(run, reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def hf_config(config: ModelConfig) -> dict:
    """The transformers config.json of a shape (qwen3_5_text)."""
    return dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], vocab_size=config.vocab_size,
                hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                num_key_value_heads=config.num_kv_heads, head_dim=config.head_size,
                layer_types=["linear_attention" if config.linear(i) else "full_attention"
                             for i in range(config.num_layers)],
                linear_num_key_heads=config.linear_key_heads, linear_key_head_dim=config.linear_key_dim,
                linear_num_value_heads=config.linear_value_heads, linear_value_head_dim=config.linear_value_dim,
                linear_conv_kernel_dim=config.linear_conv_kernel, tie_word_embeddings=config.tie_word_embeddings,
                max_position_embeddings=config.max_position_embeddings, mtp_num_hidden_layers=config.mtp_layers,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                                 "partial_rotary_factor": config.rotary_size / config.head_size})  # fmt: skip


def random_gguf(name: str, config: ModelConfig, quant: str) -> Path:
    """A GGUF file of the shape in `quant`, from a random bfloat16 checkpoint with an MTP layer (random_gguf.py: made
    once, cached)."""

    def save(folder: Path) -> None:
        from safetensors.torch import load_file, save_file
        from transformers import AutoConfig, AutoModelForCausalLM

        from architectures import add_mtp  # tests/ is on the path while the file is made

        fields = hf_config(config)
        fields.pop("architectures")
        mtp_layers = fields.pop("mtp_num_hidden_layers")
        AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields), dtype=torch.bfloat16).save_pretrained(folder)
        if mtp_layers:
            add_mtp(folder)
            saved = load_file(folder / "model.safetensors")  # the MTP tensors in bfloat16, as the rest
            save_file({k: v.to(torch.bfloat16) for k, v in saved.items()}, folder / "model.safetensors",
                      metadata={"format": "pt"})  # fmt: skip

    return made_gguf(f"qwen35-{name}", quant, save)


@torch.inference_mode()
def measure(label: str, model, context: int, reps: int) -> None:
    config = model.config
    cache = model.new_cache(1, max_len=context + 32)
    ids = torch.randint(0, config.vocab_size, (1, context + 16), generator=torch.Generator().manual_seed(0))
    model(ids[:, :context], cache, [0], num_logits=1, invariant=False)

    def verify(rows: int):
        def run():
            model(ids[:, context : context + rows], cache, [0])
            cache.set_length(0, context)

        return run

    steps = {rows: _median(verify(rows), reps) for rows in (1, 4, 8)}
    seconds: list[float] = []
    for _ in range(reps + 1):  # a verify pass of 5 rows of which 1 is kept: the set_length alone is timed
        model(ids[:, context : context + 5], cache, [0])
        begin = time.perf_counter()
        cache.set_length(0, context + 1)
        seconds.append(time.perf_counter() - begin)
        cache.set_length(0, context)
    back = statistics.median(seconds[1:])
    mtp, mtp_cache = model.mtp, model.mtp.new_cache(1, max_len=context + 32)
    hidden = torch.randn(1, context, config.hidden_size, generator=torch.Generator().manual_seed(1))
    mtp.draft(model, ids[:, 1 : context + 1], hidden, mtp_cache, [0])

    def mtp_step(head):
        def run():
            normed = mtp.draft(model, ids[:, context : context + 1], hidden[:, -1:], mtp_cache, [0])
            model.head_logits(normed[:, -1], head)
            mtp_cache.set_length(0, context)

        return run

    heads = {config.vocab_size: None}
    for rows in HEAD_ROWS:
        if rows < config.vocab_size:
            heads[rows] = DraftHead(model, config.vocab_size, frequent_ids(rows, config.vocab_size, frozenset())).module
    drafts = {rows: _median(mtp_step(head), reps) for rows, head in heads.items()}
    state_mib = RecurrentState.slot_bytes(config) / 2**20
    from verispec.kernels import native

    threads = native.threads() if native.available() else 0
    print(f"\n{label}: context {context}, {torch.get_num_threads()} PyTorch threads, {threads} native; "
          f"median of {reps}")  # fmt: skip
    print(f"  decode step T(1)        {steps[1] * 1e3:8.1f} ms")
    for rows in (4, 8):
        ratio = steps[rows] / steps[1]
        print(f"  verify pass T({rows})        {steps[rows] * 1e3:8.1f} ms   T({rows})/T(1) {ratio:.2f}")
    print(f"  rollback (set_length)   {back * 1e6:8.1f} us   {back / steps[4]:.2e} of T(4); "
          f"states kept per verify row {state_mib:.1f} MiB")  # fmt: skip
    for rows, seconds_per_draft in drafts.items():
        print(f"  MTP draft step, head of {rows:6d} rows   {seconds_per_draft * 1e3:7.1f} ms   "
              f"c = {seconds_per_draft / steps[1]:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--gguf", metavar="TYPE", help="a random file of the shape in this llama-quantize type")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    for name, config in SHAPES.items():
        if args.shape not in (name, "all"):
            continue
        if args.gguf:
            path = random_gguf(name, config, args.gguf)
            model = load_model(path, progress=False, quantization="gguf").model
            label = f"{name} ({args.gguf}, {path.stat().st_size / 1e6:.0f} MB: matrices on the native kernels)"
        else:
            torch.manual_seed(0)
            model = transformer(config).eval()
            params = sum(p.numel() for p in model.parameters())
            label = f"{name} ({params / 1e6:.0f} M parameters, float32 PyTorch)"
        measure(label, model, args.context, args.reps)


if __name__ == "__main__":
    main()
