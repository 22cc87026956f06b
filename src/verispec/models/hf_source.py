"""Read a Hugging Face checkpoint folder's tensors by canonical name (weights.py), by its family's rules (family.py).

Tensor names are a Llama's, unless the family's entry names them otherwise; fused tensors (Phi-3's qkv_proj and
gate_up_proj) are served as the row ranges of their parts. Every tensor of the checkpoint is read, or known not to
matter (the rotary's saved inverse frequencies, a multimodal checkpoint's vision tower and projector, a tied head's
saved copy): a tensor the loader would otherwise leave unread (a bias, an extra norm) means a computation verispec
does not do, and the folder is refused naming it. Which family a folder is of: families.py (`open_folder`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import ModelLoadError
from .config import ModelConfig
from .family import Family
from .tokenizer import Tokenizer
from .weights import assemble_state_dict, canonical_names

_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
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
# a checkpoint's MTP layer (ModelConfig.mtp_layers: its own tensors, at the checkpoint's top level)
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
    def __init__(self, folder: Path, family: Family, config: ModelConfig, extra: frozenset[str] = frozenset()):
        """The tensors of `folder`, a checkpoint of `family` whose config.json reads as `config`; `extra`: tensors the
        caller reads itself."""
        raw = read_config(folder)
        self.folder, self.family, self.config, self.extra = folder, family, config, extra
        self.multimodal = raw.get("model_type") in family.wrappers
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
        self._names = _LAYER_NAMES | family.hf_names
        self._check_every_tensor_is_read(folder)

    def _where(self, name: str) -> tuple[str, tuple[int, int] | None]:
        """The checkpoint key of a canonical name, and the rows of it that hold it (None: all)."""
        if name in _MTP_NAMES:
            return _MTP_NAMES[name], None
        layer, _, short = name.partition(".")  # "3.expert7.gate": layer 3, "expert7.gate"
        if not short:
            if name in self.family.hf_globals:
                return self.prefix + self.family.hf_globals[name], None
            return {"embed": f"{self.prefix}embed_tokens.weight", "norm": f"{self.prefix}norm.weight",
                    "lm_head": self.head}[name], None  # fmt: skip
        base = f"{self.prefix}layers.{layer}."
        if layer == "mtp":  # "mtp.0.q": the MTP's decoder layer 0
            layer, _, short = short.partition(".")
            base = f"mtp.layers.{layer}."
        own = self.family.hf_where(self, base, short) if self.family.hf_where is not None else None
        if own is not None:
            return own
        c = self.config
        if self.family.fused_qkv and short in ("q", "k", "v"):
            q, kv = c.num_heads * c.head_size, c.num_kv_heads * c.head_size
            return base + "self_attn.qkv_proj.weight", {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[short]
        if self.family.fused_gate_up and short in ("gate", "up"):
            inter = c.intermediate_size
            return base + "mlp.gate_up_proj.weight", (0, inter) if short == "gate" else (inter, 2 * inter)
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
            family = self.family.name
            raise ModelLoadError(
                f"{folder}: checkpoint tensor '{key}' is not read by verispec's loader ({family}): it belongs to "
                "a computation verispec does not do; refused rather than ignored (docs/models.md)"
            )

    def fetch(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        key, part = self._where(name)
        handle = self.index.get(key)
        if handle is None:
            return None
        if self.family.hf_fetch is not None:  # a tensor the family stores its own way (experts fused in one)
            own = self.family.hf_fetch(lambda: handle.get_tensor(key), name)
            if own is not None:
                return own
        if part is None and rows is None:
            return handle.get_tensor(key)
        start, stop = part or (0, None)
        if rows is not None:
            start, stop = start + rows[0], start + rows[1]
        return handle.get_slice(key)[start:stop]


def load_hf_folder(source: HFSource, dtype: torch.dtype, quantization: str):
    """(config, state dict, tokenizer) of the checkpoint folder `source` reads, in `dtype` or quantized."""
    path = source.folder
    try:
        state = assemble_state_dict(source.config, source.fetch, dtype, quantization=quantization)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return source.config, state, Tokenizer.from_transformers(path, extra_stop_ids=source.stop_ids)
