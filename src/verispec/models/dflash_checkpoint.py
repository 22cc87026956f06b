"""A DFlash drafter's checkpoint (dflash.py): a Hugging Face folder in z-lab's published layout, or its GGUF as
llama.cpp's converter writes it (`convert_hf_to_gguf.py DRAFTER --target-model-dir TARGET`), checked against its
target.

The folder (z-lab/Qwen3-8B-DFlash-b16 and its kin: `architectures` DFlashDraftModel, config.json + safetensors): a
Qwen3 config for its decoder layers, beside its own fields `block_size`, `num_target_layers` and `dflash_config`
{`mask_token_id`, `target_layer_ids`}. The ids name target layers whose OUTPUTS it reads (hidden_states[id + 1] in
transformers' numbering): the inputs of layers id + 1, which is what verispec serves and what llama.cpp's converter
writes. Tensors: `fc` [hidden, m x target hidden], `hidden_norm`, `norm`, and per layer `layers.N.` the Qwen3
layer's norms and products; no embeddings and no output head (the target's). The GGUF (architecture `dflash`): the
same tensors by llama.cpp's names (`fc`, `enc.output_norm`, `output_norm`, `blk.N.*`), `dflash.target_layers` (the
ids + 1), `dflash.block_size`, `tokenizer.ggml.mask_token_id`. What llama.cpp's DFlash computes that this drafter
does not (DFlash2's convolutions and selector, sliding windows, causal blocks, logit and embedding scales, value
scales, soft-capping) is refused rather than ignored.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InvalidParameterError, ModelLoadError
from .config import ModelConfig
from .dflash import DFlashDrafter, DFlashSpec
from .families import config_from_hf
from .trained_drafter import gguf_keys, gguf_tensor, load_checked, read_gguf

_OWN_FIELDS = ("block_size", "num_target_layers", "dflash_config", "auto_map", "target_layer_ids")
# dflash_config fields this drafter computes; any other (DFlash2's conv_kernel_size, use_swa, causal, scales...) refused
_DFLASH_CONFIG = ("mask_token_id", "target_layer_ids", "block_size")
_LAYER = {  # a layer's checkpoint names (after `layers.N.`) -> the module's, read as stored
    "input_layernorm.weight": "input_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "wq.weight", "self_attn.o_proj.weight": "wo.weight",
    "self_attn.q_norm.weight": "q_norm.weight", "self_attn.k_norm.weight": "k_norm.weight",
    "mlp.down_proj.weight": "mlp.w_down.weight",
}  # fmt: skip
_LAYER_FUSED = {"wkv.weight": ("self_attn.k_proj.weight", "self_attn.v_proj.weight"),
                "mlp.w_gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}  # fmt: skip
_TOP = {"fc.weight": "fc.weight", "hidden_norm.weight": "hidden_norm.weight", "norm.weight": "norm.weight",
        "embed_tokens.weight": "embed.weight", "lm_head.weight": "lm_head.weight"}  # fmt: skip
_GGUF_TOP = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight",
             "output_norm.weight": "norm.weight", "token_embd.weight": "embed_tokens.weight",
             "output.weight": "lm_head.weight"}  # fmt: skip
_GGUF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
               "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
               "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip
# GGUF keys of llama.cpp's DFlash whose computation this drafter lacks: refused where set
_GGUF_REFUSED = ("attention.causal", "attention.sliding_window", "conv_kernel_size", "selector_top_k", "logit_scale",
                 "final_logit_softcapping", "embedding_scale", "attention.value_scale", "attention.scale",
                 "rope.scaling.type", "hyper_connection_count")  # fmt: skip


def load_dflash(path: str, target) -> DFlashDrafter:
    """The drafter at `path` (a folder or a GGUF file) for `target` (a LoadedModel), checked against it: one line
    (InvalidParameterError, ModelLoadError) for a drafter this target cannot serve."""
    where = Path(path).expanduser()
    if where.is_dir():
        spec, tensors = _read_folder(where, target.model.config.hidden_size)
    elif where.is_file() and where.read_bytes()[:4] == b"GGUF":
        spec, tensors = _read_gguf(where, target.model.config.hidden_size)
    else:
        raise ModelLoadError(f"{path}: a DFlash drafter is a folder (config.json and safetensors) or its GGUF file")
    check_fits(spec, target.model, str(where))
    return build_drafter(spec, tensors, str(where))


def check_fits(spec: DFlashSpec, target, where: str) -> None:
    """InvalidParameterError where the drafter cannot read `target` (a Transformer): another hidden size, layers it
    lacks, another vocabulary."""
    config = target.config
    if spec.target_hidden != config.hidden_size or (spec.hidden != config.hidden_size and not spec.own_embeddings):
        raise InvalidParameterError(
            f"{where}: this DFlash drafter reads hidden states of {spec.target_hidden} values and embeds in "
            f"{spec.hidden}; the target's have {config.hidden_size} (a drafter for another model)"
        )
    if not all(0 <= layer <= config.num_layers for layer in spec.target_layers):
        raise InvalidParameterError(
            f"{where}: this DFlash drafter reads the inputs of target layers {list(spec.target_layers)}; the target "
            f"has {config.num_layers} layers (a drafter for another model)"
        )
    if spec.vocab != config.vocab_size or not 0 <= spec.mask_token < config.vocab_size:
        raise InvalidParameterError(
            f"{where}: this DFlash drafter drafts in a vocabulary of {spec.vocab} tokens (its mask token "
            f"{spec.mask_token}); the target's has {config.vocab_size} (a drafter for another vocabulary)"
        )


def build_drafter(spec: DFlashSpec, tensors: dict[str, torch.Tensor], where: str) -> DFlashDrafter:
    """The drafter of `spec` with the checkpoint's tensors (by the folder's names, `model.` taken out); ModelLoadError
    for a tensor missing, left over or of another shape."""
    with torch.device("meta"):
        drafter = DFlashDrafter(spec)
    state = {ours: tensors.pop(theirs) for theirs, ours in _TOP.items() if theirs in tensors}
    for i in range(spec.layers.num_layers):
        p = f"layers.{i}."
        state |= {f"{p}{ours}": tensors.pop(p + theirs) for theirs, ours in _LAYER.items() if p + theirs in tensors}
        for ours, parts in _LAYER_FUSED.items():
            if all(p + part in tensors for part in parts):
                state[p + ours] = torch.cat([tensors.pop(p + part) for part in parts])
    if tensors:
        raise ModelLoadError(f"{where}: tensors a DFlash drafter does not have: {', '.join(sorted(tensors)[:8])}")
    load_checked(drafter, state, where, "the DFlash drafter")
    return drafter.eval()


# ---- a Hugging Face folder ------------------------------------------------------------------------------------------
def _read_folder(folder: Path, target_hidden: int) -> tuple[DFlashSpec, dict[str, torch.Tensor]]:
    from .hf_source import read_config

    raw = dict(read_config(folder))
    own = {key: raw.pop(key) for key in _OWN_FIELDS if key in raw}
    nested = own.get("dflash_config") or {}
    for key, value in nested.items():
        if key not in _DFLASH_CONFIG:
            raise ModelLoadError(f"{folder}: config.json dflash_config.{key} = {value!r}: not computed by verispec's "
                                 "DFlash drafter; refused rather than ignored")  # fmt: skip
    if raw.get("model_type") not in ("qwen3", None):
        raise ModelLoadError(f"{folder}: a DFlash drafter's layers are Qwen3 layers, not {raw['model_type']}")
    raw["model_type"] = "qwen3"
    _, layers = config_from_hf(raw, str(folder))
    departures = [name for name, value in (("sliding windows", any(layers.layer_windows)), ("q/k/v biases",
                  layers.qkv_bias), ("a partial rotary", layers.rotary_dim)) if value]  # fmt: skip
    if departures:
        raise ModelLoadError(f"{folder}: a DFlash drafter with {', '.join(departures)}: not computed by verispec's "
                             "DFlash drafter; refused rather than ignored")  # fmt: skip
    ids = nested.get("target_layer_ids", own.get("target_layer_ids"))
    mask = nested.get("mask_token_id")
    if not ids or mask is None:
        raise ModelLoadError(f"{folder}: config.json names no dflash_config.target_layer_ids or mask_token_id")
    tensors = _folder_tensors(folder)
    fc = tensors.get("fc.weight")
    features = int(fc.shape[1]) if fc is not None else len(ids) * target_hidden
    spec = DFlashSpec(
        layers=layers, target_hidden=features // len(ids), target_layers=tuple(int(i) + 1 for i in ids),
        block_size=int(nested.get("block_size", own.get("block_size", 16))), mask_token=int(mask),
        vocab=layers.vocab_size, own_embeddings="embed_tokens.weight" in tensors, own_head="lm_head.weight" in tensors,
    )  # fmt: skip
    return spec, tensors


def _folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no safetensors files")
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors |= load_file(file)
    return {name.removeprefix("model."): value for name, value in tensors.items()}


# ---- its GGUF ---------------------------------------------------------------------------------------------------
def _read_gguf(path: Path, target_hidden: int) -> tuple[DFlashSpec, dict[str, torch.Tensor]]:
    reader, fields = read_gguf(path, "dflash")
    for key in _GGUF_REFUSED:
        if fields.get(f"dflash.{key}") not in (None, False, 0, 0.0, "none"):
            raise ModelLoadError(f"{path}: GGUF key 'dflash.{key}' = {fields[f'dflash.{key}']!r}: not computed by "
                                 "verispec's DFlash drafter; refused rather than ignored")  # fmt: skip
    named = {}
    for tensor in reader.tensors:
        name = _gguf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: tensor {tensor.name} is not a DFlash drafter's")
        named[name] = gguf_tensor(tensor)
    layers = _gguf_layers(fields, str(path))
    ids = tuple(int(i) for i in fields.get("dflash.target_layers") or ())
    mask = fields.get("tokenizer.ggml.mask_token_id")
    if not ids or mask is None:
        raise ModelLoadError(f"{path}: GGUF metadata lacks 'dflash.target_layers' or 'tokenizer.ggml.mask_token_id'")
    fc = named.get("fc.weight")
    spec = DFlashSpec(
        layers=layers, target_hidden=int(fc.shape[1]) // len(ids) if fc is not None else target_hidden,
        target_layers=ids, block_size=int(fields.get("dflash.block_size", 16)), mask_token=int(mask),
        vocab=layers.vocab_size, own_embeddings="embed_tokens.weight" in named, own_head="lm_head.weight" in named,
    )  # fmt: skip
    return spec, named


def _gguf_name(name: str) -> str | None:
    """A GGUF tensor's folder name, or None for one a DFlash drafter does not have."""
    if name in _GGUF_TOP:
        return _GGUF_TOP[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _GGUF_LAYER:
        return f"layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"
    return None


def _gguf_layers(fields: dict, where: str) -> ModelConfig:
    """The decoder layers' config of the drafter's `dflash.` keys."""
    key = gguf_keys(fields, "dflash", where)
    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    vocab = fields.get("dflash.vocab_size") or len(fields.get("tokenizer.ggml.tokens") or ())
    return ModelConfig(
        vocab_size=int(vocab or 1), hidden_size=hidden, num_layers=int(key("block_count")), num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)), intermediate_size=int(key("feed_forward_length")),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")), rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 4096)), qk_norm=True,
    )  # fmt: skip
