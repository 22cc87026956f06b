"""Read a Hugging Face checkpoint folder: config.json (hf_config.py), *.safetensors, tokenizer files.

Tensor names are mapped per family; fused tensors (Phi-3's qkv_proj and gate_up_proj) are served as the row
ranges of their parts. Every tensor of the checkpoint is read, or known not to matter (the rotary's saved
inverse frequencies, a multimodal checkpoint's vision tower and projector, a tied head's saved copy): a tensor
the loader would otherwise leave unread (a bias, an extra norm) means a computation verispec does not do, and
the folder is refused naming it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import ModelLoadError
from .config import ModelConfig
from .hf_config import GEMMA, WRAPPERS, config_from_hf
from .tokenizer import Tokenizer
from .weights import assemble_state_dict, canonical_names

_LLAMA_NORMS = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight"}
# Gemma's post_attention_layernorm follows the attention; its MLP's input norm is pre_feedforward_layernorm
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight", "post_mlp_norm": "post_feedforward_layernorm.weight",
}  # fmt: skip
_LAYER_NAMES = {
    "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "o": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "o_bias": "self_attn.o_proj.bias",
    "sinks": "self_attn.sinks",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}
# a Gated DeltaNet layer's (Qwen3.5)
_LINEAR_NAMES = {
    "ssm_qkv": "linear_attn.in_proj_qkv.weight", "ssm_z": "linear_attn.in_proj_z.weight",
    "ssm_b": "linear_attn.in_proj_b.weight", "ssm_a": "linear_attn.in_proj_a.weight",
    "ssm_conv": "linear_attn.conv1d.weight", "ssm_dt_bias": "linear_attn.dt_bias", "ssm_a_log": "linear_attn.A_log",
    "ssm_norm": "linear_attn.norm.weight", "ssm_out": "linear_attn.out_proj.weight",
    # Qwen3.5-MoE's shared expert and its gate
    "shared.gate": "mlp.shared_expert.gate_proj.weight", "shared.up": "mlp.shared_expert.up_proj.weight",
    "shared.down": "mlp.shared_expert.down_proj.weight", "shared_gate": "mlp.shared_expert_gate.weight",
}  # fmt: skip
# Gemma 4's per-layer inputs and layer scalars
_GEMMA4_NAMES = {"ple_gate": "per_layer_input_gate.weight", "ple_up": "per_layer_projection.weight",
                 "ple_norm": "post_per_layer_input_norm.weight", "scalar": "layer_scalar"}  # fmt: skip
_GEMMA4_GLOBAL = {"ple_embed": "embed_tokens_per_layer.weight", "ple_project": "per_layer_model_projection.weight",
                  "ple_norm": "per_layer_projection_norm.weight"}  # fmt: skip
# Gemma 4's mixture beside its MLP (26B-A4B)
_GEMMA4_MOE = {"router": "router.proj.weight", "router_scale": "router.scale",
               "expert_scale": "router.per_expert_scale",
               "moe_pre_norm": "pre_feedforward_layernorm_2.weight",
               "moe_mlp_post_norm": "post_feedforward_layernorm_1.weight",
               "moe_post_norm": "post_feedforward_layernorm_2.weight"}  # fmt: skip
# the MTP layer's own tensors (Qwen3.5), at the checkpoint's top level
_MTP_NAMES = {"mtp.fc": "mtp.fc.weight", "mtp.enorm": "mtp.pre_fc_norm_embedding.weight",
              "mtp.hnorm": "mtp.pre_fc_norm_hidden.weight", "mtp.norm": "mtp.norm.weight"}  # fmt: skip
# where the text model's tensors are: plain, and inside multimodal checkpoints (transformers 5, then 4)
_PREFIXES = (("model.", "lm_head.weight"), ("model.language_model.", "lm_head.weight"),
             ("language_model.model.", "language_model.lm_head.weight"))  # fmt: skip


def read_config(folder: Path) -> dict:
    """A folder's config.json; ModelLoadError where there is none or it does not parse."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: not a model folder (no config.json) and not a GGUF file")
    try:
        return json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path}: unreadable ({exc})") from None


class HFSource:
    def __init__(
        self, folder: Path, parsed: tuple[str, ModelConfig] | None = None, extra: frozenset[str] = frozenset()
    ):
        """`parsed`: (family, config) where the caller has read config.json (an assistant's); `extra`: tensors the
        caller reads itself."""
        raw = read_config(folder)
        self.family, self.config = parsed or config_from_hf(raw, str(folder))
        self.extra = extra
        self.multimodal = raw.get("model_type") in WRAPPERS
        generation = folder / "generation_config.json"
        eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        self.stop_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.handles = [safe_open(str(f), framework="pt") for f in sorted(folder.glob("*.safetensors"))]
        if not self.handles:
            raise ModelLoadError(f"{folder}: no *.safetensors weight files")
        self.index = {key: h for h in self.handles for key in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        self.prefix, self.head = next(
            ((p, h) for p, h in _PREFIXES if f"{p}embed_tokens.weight" in self.index), _PREFIXES[0]
        )
        if self.multimodal:  # whether transformers ties a wrapper's head depends on its version: the file says
            self.config = replace(self.config, tie_word_embeddings=self.head not in self.index)
        self._names = _LAYER_NAMES | (_GEMMA_NORMS if self.family in GEMMA else _LLAMA_NORMS)
        self._names |= _LINEAR_NAMES | _GEMMA4_NAMES
        self._check_every_tensor_is_read(folder)

    def _where(self, name: str) -> tuple[str, tuple[int, int] | None]:
        """The checkpoint key of a canonical name, and the rows of it that hold it (None: all)."""
        if name in _MTP_NAMES:
            return _MTP_NAMES[name], None
        layer, _, short = name.partition(".")  # "3.expert7.gate": layer 3, "expert7.gate"
        if not short:
            if name in _GEMMA4_GLOBAL:
                return self.prefix + _GEMMA4_GLOBAL[name], None
            return {"embed": f"{self.prefix}embed_tokens.weight", "norm": f"{self.prefix}norm.weight",
                    "lm_head": self.head}[name], None  # fmt: skip
        base = f"{self.prefix}layers.{layer}."
        if layer == "mtp":  # "mtp.0.q": the MTP's decoder layer 0
            layer, _, short = short.partition(".")
            base = f"mtp.layers.{layer}."
        c = self.config
        if self.family == "phi3" and short in ("q", "k", "v"):
            q, kv = c.num_heads * c.head_size, c.num_kv_heads * c.head_size
            return base + "self_attn.qkv_proj.weight", {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[short]
        if self.family == "phi3" and short in ("gate", "up"):
            inter = c.intermediate_size
            return base + "mlp.gate_up_proj.weight", (0, inter) if short == "gate" else (inter, 2 * inter)
        if self.family == "gptoss" and (short.startswith("expert") or short.startswith("router")):
            return _gpt_oss_where(base, short)
        if self.family == "gemma4" and short in _GEMMA4_MOE:
            return base + _GEMMA4_MOE[short], None
        if self.family == "gemma4" and short.startswith("expert"):  # fused: gate_up_proj [experts, 2 x inter, hidden]
            kind = short.partition(".")[2]
            return base + ("experts.down_proj" if kind == "down" else "experts.gate_up_proj"), None
        if short == "router":
            return base + "mlp.gate.weight", None
        if short.startswith("expert"):  # expert{e}.gate, .up, .down
            expert, _, kind = short.partition(".")
            return f"{base}mlp.experts.{expert.removeprefix('expert')}.{kind}_proj.weight", None
        return base + self._names[short], None

    def _check_every_tensor_is_read(self, folder: Path) -> None:
        read = {self._where(name)[0] for name in canonical_names(self.config)}
        for key in self.index:
            if key in read or key in self.extra or key.endswith("rotary_emb.inv_freq"):
                continue
            if self.config.tie_word_embeddings and key == self.head:
                continue  # transformers ties the head to the embeddings whatever copy was saved
            if self.multimodal and not key.startswith(self.prefix) and key != self.head:
                continue  # the vision tower and projector: text prompts never reach them
            raise ModelLoadError(
                f"{folder}: checkpoint tensor '{key}' is not read by verispec's loader ({self.family}): it belongs to "
                "a computation verispec does not do; refused rather than ignored (docs/models.md)"
            )

    def fetch(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        key, part = self._where(name)
        handle = self.index.get(key)
        if handle is None:
            return None
        if self.family == "gptoss" and ".expert" in f".{name}":
            return _gpt_oss_expert(handle.get_tensor(key), name)
        if self.family == "gemma4" and ".expert" in f".{name}" and "scale" not in name:
            return _gemma4_expert(handle.get_tensor(key), name)
        if name.rpartition(".")[2] == "ssm_conv":
            return handle.get_tensor(key).squeeze(1)  # [channels, 1, width] -> [channels, width]
        if part is None and rows is None:
            return handle.get_tensor(key)
        start, stop = part or (0, None)
        if rows is not None:
            start, stop = start + rows[0], start + rows[1]
        return handle.get_slice(key)[start:stop]


def _gpt_oss_where(base: str, short: str) -> tuple[str, None]:
    """gpt-oss's router and its experts' fused tensors (all experts in one: gate_up_proj [experts, hidden, 2 x inter],
    gate and up interleaved by column; down_proj [experts, inter, hidden]; their biases)."""
    if short.startswith("router"):
        return base + ("mlp.router.bias" if short == "router_bias" else "mlp.router.weight"), None
    kind = short.partition(".")[2]
    fused = "down_proj" if kind.startswith("down") else "gate_up_proj"
    return f"{base}mlp.experts.{fused}{'_bias' if kind.endswith('_bias') else ''}", None


def _gpt_oss_expert(fused: torch.Tensor, name: str) -> torch.Tensor:
    """One expert's matrix (as a Linear's weight [out, in]) or bias out of gpt-oss's fused expert tensors."""
    short = name.rpartition("expert")[2]  # "3.gate", "3.up_bias"
    index, _, kind = short.partition(".")
    tensor = fused[int(index)]
    if kind.startswith("down"):
        return tensor if kind == "down_bias" else tensor.T.contiguous()
    part = tensor[..., 0::2] if kind.startswith("gate") else tensor[..., 1::2]  # columns interleaved gate, up
    return part if kind.endswith("_bias") else part.T.contiguous()


def _gemma4_expert(fused: torch.Tensor, name: str) -> torch.Tensor:
    """One Gemma 4 expert's matrix (a Linear's weight [out, in]) out of its fused tensors: gate_up_proj [experts,
    2 x inter, hidden] (gate rows first), down_proj [experts, hidden, inter]."""
    index, _, kind = name.rpartition("expert")[2].partition(".")
    tensor = fused[int(index)]
    if kind == "down":
        return tensor
    half = tensor.shape[0] // 2
    return tensor[:half] if kind == "gate" else tensor[half:]


def load_hf_folder(path: Path, dtype: torch.dtype, quantization: str):
    """(config, state dict, tokenizer) of the checkpoint folder `path`, in `dtype` or quantized."""
    source = HFSource(path)
    try:
        state = assemble_state_dict(source.config, source.fetch, dtype, quantization=quantization)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return source.config, state, Tokenizer.from_transformers(path, extra_stop_ids=source.stop_ids)


# an assistant's tensors beside its decoder (models/assistant.py)
_ASSISTANT_NAMES = {"pre.weight": "pre_projection.weight", "post.weight": "post_projection.weight",
                    "centroids.weight": "masked_embedding.centroids.weight",
                    "token_ordering": "masked_embedding.token_ordering"}  # fmt: skip


def load_assistant_folder(path: Path, raw: dict, dtype: torch.dtype):
    """(the AssistantModel, its tokenizer or None) of a gemma4_assistant checkpoint folder, on PyTorch in `dtype`."""
    from .assistant import AssistantModel
    from .hf_config import assistant_config

    config, backbone, centroids = assistant_config(raw, str(path))
    extra = frozenset(_ASSISTANT_NAMES.values()) | {"lm_head.weight"}
    source = HFSource(path, parsed=("gemma4", config), extra=extra)
    try:
        state = assemble_state_dict(config, source.fetch, dtype)
        for name, key in _ASSISTANT_NAMES.items():
            if centroids[0] or name in ("pre.weight", "post.weight"):
                if key not in source.index:
                    raise KeyError(key)
                state[name] = source.index[key].get_tensor(key)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    state = {name: t.to(dtype) if t.is_floating_point() else t.long() for name, t in state.items()}
    with torch.device("meta"):
        model = AssistantModel(config, backbone, centroids)
    if not centroids[0]:
        state["token_ordering"] = torch.zeros(0, dtype=torch.long)
    model.load_state_dict(state, assign=True, strict=True)
    tokenizer = Tokenizer.from_transformers(path) if (path / "tokenizer.json").is_file() else None
    return model.eval(), tokenizer
