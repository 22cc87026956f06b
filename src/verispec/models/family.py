"""What a model family is to the loader: which files are its own, how each is read, what its checkpoints carry.

One `Family` per family, in one table (families.py). The shared readers (hf_config.py, hf_source.py, gguf_config.py,
gguf_source.py, gguf_native.py, loading.py) read these fields and call these hooks; they test no family by name. Every
field past the names departs from a Llama's, whose value is the default: an entry lists what its family does
otherwise, and a family's own code (its readers' extra fields, tensors stored its own way, its blocks on the native
kernels, a checkpoint loaded its own way) is a hook, kept in the family's module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import ModelConfig

Values = Mapping[str, Any]  # ModelConfig fields, by name
Where = tuple[str, "tuple[int, int] | None"]  # a tensor's name in the file, and its rows that hold a canonical name


@dataclass(frozen=True)
class Shape:
    """What the shared reader has read when it calls a family's hook: the text model's layers (those of a GGUF file's
    trailing blocks excluded), its head size, its windows (0: full attention), and for a GGUF file the rotary's
    dimensions where they are fewer than the head's (else 0), its trailing blocks and its tensors' shapes."""

    layers: int
    head_dim: int
    windows: tuple[int, ...] = ()
    rotary: int = 0
    trailing: int = 0
    tensors: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    name: str  # the family's name in the readers' messages
    model_types: tuple[str, ...] = ()  # config.json's model_type of its text model
    # multimodal model_types read as their `text_config`, of one of these model_types (the vision part left unread)
    wrappers: Mapping[str, frozenset[str]] = field(default_factory=dict)
    architectures: tuple[str, ...] = ()  # a GGUF file's general.architecture
    # the speculative method that drafts with what its checkpoints carry (where a checkpoint has it) or are
    drafter: str | None = None

    # what every checkpoint of the family computes, whatever its format (ModelConfig fields)
    block: Values = field(default_factory=dict)

    # config.json: the fields its checkpoints imply beyond `block` (q/k norms, Gemma's 1 + w, Qwen2's q/k/v bias)
    hf_block: Values = field(default_factory=dict)
    # the config.json fields naming its gated MLP's activation, first set first, and that activation's name there
    activation_fields: tuple[str, ...] = ("hidden_act",)
    activation_name: str = "silu"
    attention_bias: bool = False  # attention_bias is accepted (its meaning: hf_block or hf_fields)
    tie_default: bool = False  # transformers' tie_word_embeddings where config.json has none
    query_pre_attn_scalar: float | None = None  # its default, where the family scales queries by it
    # the soft-capping fields it computes, each with transformers' default where config.json has none (None: none)
    softcaps: Mapping[str, float | None] = field(default_factory=dict)
    hf_harmless: frozenset[str] = frozenset()  # fields its modules read and do not apply
    rope_theta_default: float = 10_000.0
    partial_rotary: bool = False  # a rotary on part of each head, its multimodal sections read as the plain rotary
    local_rope: bool = False  # its sliding layers' own plain rotary (rope_local_base_freq; GGUF rope.freq_base_swa)
    # config.json's windows: False where it has none; transformers' default sliding_window; whether it applies only
    # with use_sliding_window; why the family refuses one; whether every layer slides; which layers slide where
    # layer_types is absent ((fields, layer) -> whether it slides; None: all but every sliding_window_pattern-th, 6 by
    # default, as Gemma 3's config derives); why its sliding layers need a window
    windows: bool = True
    window_default: int | None = 4096
    window_flag: bool = False
    window_refused: str = ""
    slides_every_layer: bool = False
    sliding_layers: Callable[[Any, int], bool] | None = None
    window_needed: str = ""
    last_layer_full: bool = False  # transformers makes its last layer a full-attention one whatever the file says
    # the use_bidirectional_attention values it accepts, any other refused (None: the field is not checked)
    bidirectional: frozenset[str] | None = None
    hf_rope: Callable[..., tuple] | None = None  # (fields, rope parameters) -> (theta, scaling, local theta)
    hf_fields: Callable[[Any, Shape], Values] | None = None  # (fields, shape) -> its own ModelConfig fields

    # a Hugging Face folder's tensors: names beyond a Llama's (layer, then model-wide), fused q/k/v and gate/up,
    # tensors stored its own way: (source, layer key prefix, short name) -> where, or None; (a reader of the stored
    # tensor, canonical name) -> the tensor, or None
    hf_names: Mapping[str, str] = field(default_factory=dict)
    hf_globals: Mapping[str, str] = field(default_factory=dict)
    fused_qkv: bool = False
    fused_gate_up: bool = False
    hf_where: Callable[[Any, str, str], Where | None] | None = None
    hf_fetch: Callable[[Any, str], Any] | None = None

    # a GGUF file: llama.cpp's converter interleaved each head's rotary halves of q and k; a block's attn_qkv is its
    # attention's q, k, v fused (where the file has one); the key counting blocks after the model's own (its MTP
    # blocks); its windows: the default sliding_window, and which layers slide ("" refused, "every", "pattern")
    rope_permuted: bool = False
    attn_qkv_fused: bool = True
    trailing_blocks_key: str = ""
    gguf_window_default: int = 0
    gguf_slides: str = ""
    gguf_pattern_default: int = 2
    gguf_fields: Callable[[Any, Shape], Values] | None = None  # (keys, shape) -> its own ModelConfig fields
    # a reader of its own: (keys, tensors' shapes, floats(name), windows(layers)) -> config
    gguf_config: Callable[..., ModelConfig] | None = None
    gguf_names: Mapping[str, str] = field(default_factory=dict)
    gguf_globals: Mapping[str, str] = field(default_factory=dict)
    gguf_where: Callable[[ModelConfig, str, str], Where | None] | None = None
    gguf_fetch: Callable[[str, Any], Any] | None = None  # (name, float32 tensor) -> the tensor the model takes
    int4_as_stored: bool = True  # a 4-bit tensor is the model's weight as stored (gguf_fetch changes none of them)

    # the native kernels: its own build of a GGUF file's model where the shared one does not serve ((config, the
    # file's tensors, this entry) -> model); whether a file the native kernels do not run is read dequantized rather
    # than requantized to int4 (another model's text)
    native_build: Callable[..., Any] | None = None
    dequantized_fallback: bool = False

    # a checkpoint loaded its own way (a drafter's: read on PyTorch as stored): (folder, config.json, dtype, this
    # entry) -> (module, tokenizer or None); why it cannot be the target
    load_folder: Callable[..., tuple] | None = None
    not_a_target: str = ""
