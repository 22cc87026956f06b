"""The weight forms a model loads in, by name, and the rules that pick one: what `--quantization` and
`--speculative-quantization` choose from (the forms themselves: quantize.py, gguf_native.py). Names only: no PyTorch
is imported to check a flag."""

from __future__ import annotations

# gguf: the GGUF file's own blocks on verispec's native kernels (kernels/); the others PyTorch's kernels
QUANTIZATIONS = ("none", "int8", "int4", "int4-all", "gguf")
# a draft's own form: gguf with the layers' matrices stored wider than Q4_0 requantized to Q4_0 (the draft only
# proposes, so its precision changes its speed and acceptance, never the output)
COARSE_DRAFT = "q4_0"
DRAFT_QUANTIZATIONS = (*QUANTIZATIONS, COARSE_DRAFT)


def resolve_quantization(name: str, device: str | None, dtype_chosen: bool) -> str:
    """'auto' on the CPU, unless a dtype was asked for: gguf where the native kernels were compiled, else int4;
    none elsewhere."""
    if name != "auto":
        return name
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in (None, "cpu") or dtype_chosen:
        return "none"
    from ..kernels import native

    return "gguf" if native.available() else "int4"
