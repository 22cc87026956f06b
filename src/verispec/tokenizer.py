"""Tokenizer wrapper: encode, decode, chat template, stop tokens, and the draft/target compatibility check."""

from __future__ import annotations

from pathlib import Path

from .errors import InvalidParameterError, ModelLoadError, TokenizerMismatchError

# End-of-generation tokens that chat checkpoints use besides their declared eos (llama.cpp treats the
# same texts as end-of-generation).
_END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>")


class Tokenizer:
    def __init__(self, hf_tokenizer, extra_stop_ids: tuple[int, ...] = ()):
        self.hf = hf_tokenizer
        vocab = hf_tokenizer.get_vocab()
        self.vocab: dict[str, int] = vocab
        stops = {hf_tokenizer.eos_token_id, *extra_stop_ids, *(vocab[t] for t in _END_TEXTS if t in vocab)}
        self.stop_token_ids = frozenset(i for i in stops if i is not None)

    @classmethod
    def from_folder(cls, folder: Path, gguf_file: str | None = None, extra_stop_ids=()) -> Tokenizer:
        from transformers import AutoTokenizer  # heavy import, only when a model is loaded
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its Mistral-regex heuristic misfires on Qwen/SmolLM tokenizers
        try:
            hf = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file, local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(f"{folder}: cannot load its tokenizer ({type(exc).__name__}: {exc})") from None
        return cls(hf, tuple(extra_stop_ids))

    def save(self, folder: Path) -> None:
        self.hf.save_pretrained(str(folder))

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict]) -> str:
        if not self.hf.chat_template:
            raise ModelLoadError("this model has no chat template; drop --chat or pass a raw prompt")
        from jinja2 import TemplateError

        try:
            return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as exc:  # the template refuses these messages (roles out of order, ...)
            raise InvalidParameterError(f"the model's chat template refuses these messages: {exc}") from None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.hf.encode(self.render_chat(messages), add_special_tokens=False)

    def check_compatible(self, draft: Tokenizer) -> None:
        """Draft tokens must mean the same to the target: one token table must extend the other.

        Padded vocabulary sizes (151936 vs 152064 rows) do not matter; only the token tables do.
        """
        small, large = sorted((self.vocab, draft.vocab), key=len)
        differing = [tok for tok, i in small.items() if large.get(tok) != i]
        if differing:
            raise TokenizerMismatchError(
                f"draft and target tokenizers differ ({len(differing)} of {len(small)} tokens map to other "
                f"ids, e.g. {differing[0]!r}); use a draft model from the target's family"
            )
