"""Tiny randomly initialised models with a real byte-level tokenizer, for tests and smoke runs.

Nothing here is downloaded: the tokenizer is built in memory (256 byte tokens + <eos>).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .models.config import ModelConfig
from .models.loading import LoadedModel
from .models.model import Transformer
from .models.tokenizer import Tokenizer

EOS_TEXT = "<eos>"


def byte_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOS_TEXT])
    return Tokenizer(raw, EOS_TEXT, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>")


# a template that shows tools and teaches the hermes call format (server/tools.py detects it), for the tiny pair
TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>"
    '<tool_call>{"name": "", "arguments": {}}</tool_call>{% endif %}'
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    '{% for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endfor %}<assistant>"
)


def tool_tokenizer() -> Tokenizer:
    """The byte tokenizer with TOOL_TEMPLATE: the tiny pair can answer requests with tools."""
    tokenizer = byte_tokenizer()
    return Tokenizer(tokenizer.raw, EOS_TEXT, TOOL_TEMPLATE)


def tiny_config(vocab_size: int = 257, hidden_size: int = 64, num_layers: int = 2, **overrides) -> ModelConfig:
    values = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=4, num_kv_heads=2,
        intermediate_size=2 * hidden_size, rope_theta=10000.0, qkv_bias=True, max_position_embeddings=512,
    )  # fmt: skip
    values.update(overrides)
    return ModelConfig(**values)


def tiny_model(
    config: ModelConfig, seed: int = 0, scale: float = 1.0, residual_gain: float = 1.0, dtype=torch.float32,
    device: str = "cpu",
) -> Transformer:  # fmt: skip
    """Random weights (made on `device`: real shapes on a GPU); `scale` sharpens the output distribution (larger =
    more peaked); a small `residual_gain` makes each layer a small correction, so shallower copies agree more often."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name == "embed.weight":
                param.normal_(0.0, 1.0)
            else:
                param.normal_(0.0, scale / param.shape[-1] ** 0.5 if param.dim() > 1 else 0.02)
            if name.endswith(("wo.weight", "w_down.weight")):
                param.mul_(residual_gain)
    return model.to(dtype).eval()


def truncated_copy(model: Transformer, num_layers: int) -> Transformer:
    """A smaller model made of the first layers of `model` (same embeddings and head): a draft that agrees
    with its target part of the time, like a real draft."""
    config = ModelConfig(**{**model.config.__dict__, "num_layers": num_layers})
    with torch.device(model.device):
        small = Transformer(config)
    state = {
        k: v.clone()
        for k, v in model.state_dict().items()
        if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers
    }
    small.load_state_dict(state)
    return small.to(model.dtype).eval()


def tiny_loaded(model: Transformer, tokenizer: Tokenizer | None = None, name: str = "tiny") -> LoadedModel:
    return LoadedModel(name, Path(name), model, tokenizer or byte_tokenizer())


def tiny_pair(
    seed: int = 0, dtype=torch.float32, scale: float = 2.0, residual_gain: float = 0.3
) -> tuple[LoadedModel, LoadedModel]:
    """A target (4 layers) and a draft made of its first layer, over the byte tokenizer."""
    tokenizer = byte_tokenizer()
    target = tiny_model(tiny_config(num_layers=4), seed=seed, scale=scale, residual_gain=residual_gain, dtype=dtype)
    draft = truncated_copy(target, 1)
    return tiny_loaded(target, tokenizer, "tiny-target"), tiny_loaded(draft, tokenizer, "tiny-draft")


def prefer_the_end_token(target: LoadedModel) -> int:
    """Give the target a head that always prefers its first stop token (a copy of its head plus a large
    bias); returns that token: without ignore_eos every generation stops at once."""
    eos = min(target.tokenizer.stop_token_ids)
    head = target.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[eos] = 1e4
    target.model.lm_head = biased
    return eos


def word_tokenizer(size: int) -> Tokenizer:
    """A tokenizer of `size` tokens: single letters 'a', 'b', ... and '<eos>' last (for exact-distribution tests)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {chr(ord("a") + i): i for i in range(size - 1)} | {EOS_TEXT: size - 1}
    raw = RawTokenizer(models.WordLevel(vocab=vocab, unk_token=EOS_TEXT))
    raw.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    raw.decoder = decoders.ByteLevel()  # letters spell themselves in GPT-2's byte alphabet (grammars read bytes)
    return Tokenizer(raw, EOS_TEXT)
