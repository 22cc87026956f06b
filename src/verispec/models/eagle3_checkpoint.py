"""An EAGLE-3 head's checkpoint (eagle3.py): a Hugging Face folder in any of the published layouts, or its GGUF as
llama.cpp's converter writes it (`convert_hf_to_gguf.py HEAD --target-model-dir TARGET`), checked against its target.

The folder layouts (config.json + safetensors, or pytorch_model.bin):
- SpecForge's `LlamaForCausalLMEagle3` (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, Tengyunw/qwen3_8b_eagle3): the layer's
  tensors under `midlayer.`;
- vLLM's and AngelSlim's `Eagle3LlamaForCausalLM` (AngelSlim/Qwen3-*_eagle3): under `midlayer.` or `layers.0.`, some
  with a `model.` prefix;
- RedHat's speculators `Eagle3Speculator` (RedHatAI/*-speculator.eagle3): the layer's config nested in
  `transformer_layer_config`, its tensors under `layers.0.`.
Each: `fc` [hidden, 3 x target hidden], the layer's norms (`input_layernorm`, `hidden_norm`, `post_attention_layernorm`)
and products, `norm`, `lm_head` [draft vocab, hidden], `d2t` (draft id d is target id d + d2t[d]; the GGUF holds the
sums), `t2d` (unused), and `embed_tokens` where the head has embeddings of its own. The layer's config is read as a
Llama's (hf_config.py: every field read, harmless or refused), beside the head's own fields: draft_vocab_size,
target_hidden_size, norm_before_residual, norm_before_fc, and the target layers it reads
(`eagle_aux_hidden_state_layer_ids`, at the top or in `eagle_config`): the layers whose inputs it reads, as vLLM and
llama.cpp take them (SGLang adds one to ids a config names); without them, default_layers of the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidParameterError, ModelLoadError
from .config import ModelConfig
from .eagle3 import Eagle3Head, Eagle3Spec
from .families import config_from_hf
from .rope import RopeScaling
from .trained_drafter import gguf_keys, gguf_tensor, load_checked, read_gguf
from .weights import undo_rope_permutation

# the head's own fields of config.json (the rest is its decoder layer's Llama config)
_OWN_FIELDS = ("draft_vocab_size", "target_hidden_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
               "norm_before_residual", "norm_before_fc")  # fmt: skip
# bookkeeping of RedHat's speculators layout
_SPECULATORS = ("speculators_model_type", "speculators_version", "speculators_config", "has_no_defaults_at_init",
                "auto_package", "transformer_layer_config")  # fmt: skip
# eagle_config fields (NVIDIA ModelOpt's) and the value that computes what eagle3.py computes
_EAGLE_CONFIG = {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                 "use_mtp_layernorm": False, "eagle_aux_hidden_state_layer_ids": None}  # fmt: skip
_NAMES = {  # checkpoint name -> the module's, for tensors read as stored
    "fc.weight": "fc.weight", "input_norm.weight": "fc_norm.weight", "embed_tokens.weight": "embed.weight",
    "layers.0.input_layernorm.weight": "input_norm.weight", "layers.0.hidden_norm.weight": "hidden_norm.weight",
    "layers.0.post_attention_layernorm.weight": "post_attention_norm.weight",
    "layers.0.self_attn.o_proj.weight": "wo.weight", "layers.0.mlp.down_proj.weight": "mlp.w_down.weight",
    "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight",
}  # fmt: skip
_FUSED = {"wqkv.weight": ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                          "layers.0.self_attn.v_proj.weight"),
          "mlp.w_gate_up.weight": ("layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight")}  # fmt: skip
_GGUF_NAMES = {  # GGUF name -> the checkpoint's
    "fc.weight": "fc.weight", "enc.output_norm.weight": "input_norm.weight",
    "token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight", "output.weight": "lm_head.weight",
    "d2t": "d2t", "blk.0.attn_norm.weight": "layers.0.input_layernorm.weight",
    "blk.0.attn_norm_2.weight": "layers.0.hidden_norm.weight",
    "blk.0.ffn_norm.weight": "layers.0.post_attention_layernorm.weight",
    "blk.0.attn_q.weight": "layers.0.self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "layers.0.self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "layers.0.self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "layers.0.self_attn.o_proj.weight",
    "blk.0.ffn_gate.weight": "layers.0.mlp.gate_proj.weight", "blk.0.ffn_up.weight": "layers.0.mlp.up_proj.weight",
    "blk.0.ffn_down.weight": "layers.0.mlp.down_proj.weight",
}  # fmt: skip


def load_eagle3(path: str, target) -> Eagle3Head:
    """The head at `path` (a folder or a GGUF file) for `target` (a LoadedModel), checked against it: one line
    (InvalidParameterError, ModelLoadError) for a head this target cannot serve."""
    where = Path(path).expanduser()
    if where.is_dir():
        spec, tensors = _read_folder(where)
    elif where.is_file() and where.read_bytes()[:4] == b"GGUF":
        spec, tensors = _read_gguf(where)
    else:
        raise ModelLoadError(f"{path}: an EAGLE-3 head is a folder (config.json and safetensors) or its GGUF file")
    check_fits(spec, target.model, str(where))
    return build_head(spec, tensors, str(where))


def check_fits(spec: Eagle3Spec, target, where: str) -> None:
    """InvalidParameterError where the head cannot read `target` (a Transformer): another hidden size, layers it lacks,
    another vocabulary."""
    config = target.config
    if spec.target_hidden != config.hidden_size:
        raise InvalidParameterError(
            f"{where}: this EAGLE-3 head reads hidden states of {spec.target_hidden} values; the target's have "
            f"{config.hidden_size} (a head for another model)"
        )
    layers = spec.layers_of(config.num_layers)
    if len(layers) != 3 or not all(0 <= layer <= config.num_layers for layer in layers):
        raise InvalidParameterError(
            f"{where}: this EAGLE-3 head reads the inputs of target layers {list(layers)}; the target has "
            f"{config.num_layers} layers (a head for another model)"
        )
    if spec.vocab != config.vocab_size:
        raise InvalidParameterError(
            f"{where}: this EAGLE-3 head drafts in a vocabulary of {spec.vocab} tokens; the target's has "
            f"{config.vocab_size} (a head for another vocabulary)"
        )
    borrowed = [part for part, own in (("embeddings", spec.own_embeddings), ("output head", spec.own_head)) if not own]
    if borrowed and spec.hidden != config.hidden_size:
        raise InvalidParameterError(
            f"{where}: this EAGLE-3 head of hidden size {spec.hidden} has no {' and no '.join(borrowed)} of its own "
            f"and the target's are of {config.hidden_size}"
        )


def build_head(spec: Eagle3Spec, tensors: dict[str, torch.Tensor], where: str) -> Eagle3Head:
    """The head of `spec` with the checkpoint's tensors (by the checkpoint's names, `model.` and `midlayer.` taken
    out); ModelLoadError for a tensor missing, left over or of another shape."""
    with torch.device("meta"):
        head = Eagle3Head(spec)
    state = {ours: tensors.pop(theirs) for theirs, ours in _NAMES.items() if theirs in tensors}
    for ours, parts in _FUSED.items():
        if all(part in tensors for part in parts):
            state[ours] = torch.cat([tensors.pop(part) for part in parts])
    tensors.pop("t2d", None)
    d2t = tensors.pop("d2t", None)
    if tensors:
        raise ModelLoadError(f"{where}: tensors an EAGLE-3 head does not have: {', '.join(sorted(tensors)[:8])}")
    load_checked(head, state, where, "the EAGLE-3 head")
    head.d2t = _target_ids(d2t, spec, where)
    return head.eval()


def _target_ids(d2t: torch.Tensor | None, spec: Eagle3Spec, where: str) -> torch.Tensor:
    """Each draft row's target id (the readers give d2t as target ids, the GGUF's form), checked."""
    rows = torch.arange(spec.draft_vocab)
    if d2t is None:
        if spec.own_head and spec.draft_vocab != spec.vocab:
            raise ModelLoadError(f"{where}: a draft vocabulary of {spec.draft_vocab} tokens and no d2t mapping")
        return rows
    ids = d2t.reshape(-1).long()
    if ids.numel() != spec.draft_vocab or int(ids.min()) < 0 or int(ids.max()) >= spec.vocab:
        raise ModelLoadError(f"{where}: d2t maps {ids.numel()} draft ids outside a vocabulary of {spec.vocab}")
    if torch.unique(ids).numel() != ids.numel():
        raise ModelLoadError(f"{where}: d2t maps two draft ids to one token")
    return ids


# ---- a Hugging Face folder ------------------------------------------------------------------------------------------
def _read_folder(folder: Path) -> tuple[Eagle3Spec, dict[str, torch.Tensor]]:
    from .hf_source import read_config

    raw = dict(read_config(folder))
    spec = _spec_of_config(raw, str(folder))
    tensors = _folder_tensors(folder)
    if "d2t" in tensors:  # offsets in the folder layouts: the GGUF's absolute ids
        tensors["d2t"] = tensors["d2t"].reshape(-1).long() + torch.arange(tensors["d2t"].numel())
    own = dict(own_embeddings="embed_tokens.weight" in tensors, own_head="lm_head.weight" in tensors)
    return Eagle3Spec(**(spec | own)), tensors


def _spec_of_config(raw: dict, where: str) -> dict[str, Any]:
    """The head's fields of a config.json (Eagle3Spec's, but for what its tensors say); the rest read as the
    decoder layer's Llama config."""
    if isinstance(raw.get("transformer_layer_config"), dict):  # speculators: the layer's config nested
        raw = {**raw, **raw["transformer_layer_config"]}
    own = {key: raw.pop(key) for key in _OWN_FIELDS if key in raw}
    for key in _SPECULATORS:
        raw.pop(key, None)
    nested = own.get("eagle_config") or {}
    for key, value in nested.items():
        if key not in _EAGLE_CONFIG or (_EAGLE_CONFIG[key] is not None and value != _EAGLE_CONFIG[key]):
            raise ModelLoadError(f"{where}: config.json eagle_config.{key} = {value!r}: not computed by verispec's "
                                 "EAGLE-3 head; refused rather than ignored")  # fmt: skip
    if raw.get("num_hidden_layers") != 1:
        raise ModelLoadError(f"{where}: an EAGLE-3 head has one decoder layer, not {raw.get('num_hidden_layers')}")
    raw.setdefault("model_type", "llama")
    family, layer = config_from_hf(raw, where)
    if family.name != "llama":
        raise ModelLoadError(f"{where}: an EAGLE-3 head's layer is a Llama layer, not {raw['model_type']}")
    layers = own.get("eagle_aux_hidden_state_layer_ids") or nested.get("eagle_aux_hidden_state_layer_ids")
    return dict(
        layer=layer,
        target_hidden=int(own.get("target_hidden_size") or layer.hidden_size),
        target_layers=tuple(int(i) for i in layers) if layers else None,
        draft_vocab=int(own.get("draft_vocab_size") or layer.vocab_size),
        vocab=layer.vocab_size,
        norm_before_residual=bool(own.get("norm_before_residual", False)),
        norm_before_fc=bool(own.get("norm_before_fc", False)),
    )


def _folder_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (or pytorch_model.bin), by the layouts' common names."""
    files = sorted(folder.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for file in files:
            tensors |= load_file(file)
    elif (folder / "pytorch_model.bin").is_file():
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelLoadError(f"{folder}: no safetensors files and no pytorch_model.bin")
    named = {}
    for name, value in tensors.items():
        name = name.removeprefix("model.")
        named[name.replace("midlayer.", "layers.0.", 1) if name.startswith("midlayer.") else name] = value
    return named


# ---- its GGUF ---------------------------------------------------------------------------------------------------
def _read_gguf(path: Path) -> tuple[Eagle3Spec, dict[str, torch.Tensor]]:
    reader, fields = read_gguf(path, "eagle3")
    tensors = {t.name: gguf_tensor(t) for t in reader.tensors}
    unknown = sorted(set(tensors) - set(_GGUF_NAMES) - {"rope_freqs.weight"})
    if unknown:
        raise ModelLoadError(f"{path}: tensors an EAGLE-3 head does not have: {', '.join(unknown[:8])}")
    layer = _gguf_layer(fields, tensors.pop("rope_freqs.weight", None), str(path))
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):  # llama.cpp's converter permuted their rows
        heads = layer.num_heads if "attn_q" in name else layer.num_kv_heads
        tensors[name] = undo_rope_permutation(tensors[name], heads)
    named = {_GGUF_NAMES[name]: value for name, value in tensors.items()}
    vocab = int(fields.get("eagle3.vocab_size") or len(fields.get("tokenizer.ggml.tokens") or ()))
    lm_head = named.get("lm_head.weight")
    spec = Eagle3Spec(
        layer=layer, target_hidden=int(fields["eagle3.target_hidden_size"]),
        target_layers=tuple(int(i) for i in fields["eagle3.target_layers"]),
        draft_vocab=int(lm_head.shape[0]) if lm_head is not None else vocab, vocab=vocab,
        own_embeddings="embed_tokens.weight" in named, own_head=lm_head is not None,
        norm_before_residual=bool(fields.get("eagle3.norm_before_residual", False)),
        norm_before_fc=bool(fields.get("eagle3.norm_before_fc", False)),
    )  # fmt: skip
    return spec, named


def _gguf_layer(fields: dict, rope_freqs: torch.Tensor | None, where: str) -> ModelConfig:
    """The decoder layer's config of the head's `eagle3.` keys."""
    key = gguf_keys(fields, "eagle3", where)
    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    for name in ("rope.scaling.type", "rope.scaling.factor"):
        if fields.get(f"eagle3.{name}") not in (None, "none", 1.0):
            raise ModelLoadError(f"{where}: GGUF key 'eagle3.{name}' = {fields[f'eagle3.{name}']!r}: not computed "
                                 "by verispec's EAGLE-3 head; refused rather than ignored")  # fmt: skip
    scaling = None
    if rope_freqs is not None:
        scaling = RopeScaling("factors", factors=tuple(float(f) for f in rope_freqs.reshape(-1)))
    return ModelConfig(
        vocab_size=int(fields.get("eagle3.vocab_size") or 1), hidden_size=hidden, num_layers=1, num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)), intermediate_size=int(key("feed_forward_length")),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)), rope_scaling=scaling,
        max_position_embeddings=int(key("context_length", 4096)),
    )  # fmt: skip
