"""Tokenizer: encode, decode, chat template, stop tokens, and the draft/target compatibility check.

The runtime tokenizer is the `tokenizers` library's (Rust) over a `tokenizer.json`, with the chat template
rendered by jinja2 the way transformers renders it. transformers is imported only to read a tokenizer the
first time (from GGUF metadata, or a Hugging Face folder); its import and JSON parsing cost seconds of
start-up, the `tokenizers` load a tenth of a second.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path

from ..errors import InvalidParameterError, ModelLoadError, TokenizerMismatchError

# End-of-generation tokens that chat checkpoints use besides their declared eos (llama.cpp treats the
# same texts as end-of-generation).
_END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>")
# gpt-oss's harmony format: <|end|> ends a message (its reasoning, say) and the answer goes on; <|return|> ends the
# answer and <|call|> a tool call (llama.cpp's end-of-generation tokens for it too)
_HARMONY_ENDS = ("<|return|>", "<|call|>")
_CONFIG = "verispec_tokenizer.json"  # our settings beside tokenizer.json in a converted cache
SAVED_FORMAT = 2  # 2: a BPE's merges saved as "a b" strings where they can be (_quick_to_parse)
# transformers' optional clean-up of spaces before punctuation, for tokenizers whose config asks for it
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))  # fmt: skip


class Tokenizer:
    """`raw` is a `tokenizers.Tokenizer`; the special-token strings are the model's (for the chat template)."""

    def __init__(
        self,
        raw,
        eos_token: str | None = None,
        chat_template: str | None = None,
        extra_stop_ids: tuple[int, ...] = (),
        special_tokens: dict[str, str] | None = None,
        clean_up_spaces: bool = False,
        gguf_rules: int | None = None,
    ):
        self.raw = raw
        self.gguf_rules = gguf_rules  # the gguf_vocab.RULES_VERSION a GGUF file's tokenizer was built by
        self.saved_format = SAVED_FORMAT  # how `save` wrote the files it was read from (load: what they say)
        self.eos_token = eos_token
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v} | (
            {"eos_token": eos_token} if eos_token else {}
        )
        self.clean_up_spaces = clean_up_spaces
        self.extra_stop_ids = tuple(extra_stop_ids)
        ends = _END_TEXTS
        if raw.token_to_id("<|channel|>") is not None and raw.token_to_id("<|return|>") is not None:  # harmony
            ends = tuple(t for t in _END_TEXTS if t != "<|end|>") + _HARMONY_ENDS
        stops = {raw.token_to_id(t) for t in (eos_token, *ends) if t} | set(extra_stop_ids)
        self.stop_token_ids = frozenset(i for i in stops if i is not None)

    @cached_property
    def vocab(self) -> dict[str, int]:
        """token -> id, added tokens included (built on first use: a tenth of a second for 150k tokens)."""
        return self.raw.get_vocab(with_added_tokens=True)

    @cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self.raw.get_added_tokens_decoder())

    @cached_property
    def _byte_level(self) -> bool:
        return type(self.raw.decoder).__name__ == "ByteLevel"

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a piece of a multi-byte character is a piece of its bytes): a
        byte-level BPE token spelled back through GPT-2's byte alphabet; added tokens and other tokenizers'
        tokens as the UTF-8 of their text."""
        piece = self.raw.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._added_ids:
            return piece.encode()
        if self._byte_level and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return self.decode([token_id]).encode()

    def token_text(self, token_id: int) -> str:
        """A token as text (a piece of a multi-byte character shows as U+FFFD, as OpenAI's logprobs do)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    @property
    def eos_token_id(self) -> int | None:
        return self.raw.token_to_id(self.eos_token) if self.eos_token else None

    # ---- reading and writing ----------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf, extra_stop_ids=(), raw=None) -> Tokenizer:
        """From a transformers fast tokenizer (its backend, or `raw` in its place, special tokens and chat
        template)."""
        special = {name: getattr(hf, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        template = hf.chat_template if isinstance(hf.chat_template, str) else None
        clean_up = bool(getattr(hf, "clean_up_tokenization_spaces", False))
        raw = hf.backend_tokenizer if raw is None else raw
        return cls(raw, hf.eos_token, template, tuple(extra_stop_ids), special, clean_up)

    @classmethod
    def from_transformers(cls, folder: Path, extra_stop_ids=()) -> Tokenizer:
        """Read a Hugging Face folder's tokenizer with transformers (a GGUF file's: `from_gguf`)."""
        from transformers import AutoTokenizer  # heavy import, only when a tokenizer is read the first time
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its Mistral-regex heuristic misfires on Qwen/SmolLM tokenizers
        try:
            hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(f"{folder}: cannot load its tokenizer ({type(exc).__name__}: {exc})") from None
        if not getattr(hf, "is_fast", False):
            raise ModelLoadError(f"{folder}: only fast (tokenizer.json) tokenizers are supported")
        return cls.from_hf(hf, extra_stop_ids)

    @classmethod
    def from_gguf(cls, path: Path, extra_stop_ids=()) -> Tokenizer:
        """A GGUF file's tokenizer: the vocabulary as transformers reads it, cut into pieces by llama.cpp's rules
        for the file (gguf_vocab.py). A vocabulary those rules do not cover is refused before it is read."""
        from transformers import PreTrainedTokenizerFast  # heavy import, only when a tokenizer is read the first time
        from transformers.utils import logging as hf_logging

        from .gguf_vocab import RULES_VERSION, VOCAB_ARRAYS, apply_rules, read_metadata, vocab_rules

        metadata = read_metadata(path, VOCAB_ARRAYS)
        rules = vocab_rules(metadata, str(path))
        hf_logging.set_verbosity_error()
        try:  # not AutoTokenizer: it reads the model's config too (ten times slower, and refuses some architectures)
            hf = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot load its tokenizer ({type(exc).__name__}: {exc})") from None
        tokenizer = cls.from_hf(hf, extra_stop_ids, raw=apply_rules(hf.backend_tokenizer, rules, metadata))
        tokenizer.gguf_rules = RULES_VERSION
        return tokenizer

    @classmethod
    def load_for_gguf(cls, folder: Path, path: Path) -> Tokenizer:
        """What `save` wrote into `folder` for the GGUF file `path`, rebuilt from the file first (in place) when
        older rules built it: a cache converted by an earlier verispec keeps its weights, not its tokenizer."""
        from .gguf_vocab import RULES_VERSION

        tokenizer = cls.load(folder)
        stale = tokenizer.gguf_rules != RULES_VERSION
        if stale or tokenizer.saved_format < SAVED_FORMAT:  # older rules: rebuilt; an older format: written again
            if stale:
                tokenizer = cls.from_gguf(path, tokenizer.extra_stop_ids)
            with suppress(OSError):  # a cache this user cannot write: rebuilt again next time
                tokenizer.save(folder)
        return tokenizer

    def save(self, folder: Path) -> None:
        """tokenizer.json plus our settings; `load` reads them back without transformers. Each file is written
        whole and renamed into place, settings last (so a reader never sees a part of a file)."""
        settings = {
            "eos_token": self.eos_token, "chat_template": self.chat_template, "special_tokens": self.special_tokens,
            "clean_up_spaces": self.clean_up_spaces, "extra_stop_ids": list(self.extra_stop_ids),
            "gguf_rules": self.gguf_rules, "saved_format": SAVED_FORMAT,
        }  # fmt: skip
        definition = _quick_to_parse(self.raw.to_str())
        for name, text in (("tokenizer.json", definition), (_CONFIG, json.dumps(settings, indent=1))):
            partial = folder / f"{name}.tmp{os.getpid()}"
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, folder / name)

    @classmethod
    def load(cls, folder: Path) -> Tokenizer:
        """What `save` wrote. A target and its draft with identical tokenizer.json files share one parse."""
        try:
            raw = _parse((folder / "tokenizer.json").read_bytes())
            settings = json.loads((folder / _CONFIG).read_text())
            tokenizer = cls(
                raw, settings["eos_token"], settings["chat_template"], tuple(settings["extra_stop_ids"]),
                settings["special_tokens"], settings["clean_up_spaces"], settings.get("gguf_rules"),
            )  # fmt: skip
            tokenizer.saved_format = settings.get("saved_format", 1)
            return tokenizer
        except Exception as exc:
            raise ModelLoadError(f"{folder}: cannot load its tokenizer ({type(exc).__name__}: {exc})") from None

    # ---- text <-> ids ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return _encode(self.raw, text, add_special_tokens=True)

    @cached_property
    def longest_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes one token stands for: a text of more than n times this many
        characters has more than n tokens (the server refuses it without tokenizing it)."""
        return max(len(piece.encode()) for piece in self.vocab)

    def decode(self, ids: list[int], keep_special: bool = False) -> str:
        """The text of `ids`; special tokens are left out unless `keep_special` (a tool call's markers)."""
        text = self.raw.decode(list(ids), skip_special_tokens=not keep_special)
        if self.clean_up_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def render_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """`messages` (and `tools`: OpenAI's tool objects, as apply_chat_template(tools=...) takes them) through the
        model's chat template as transformers' apply_chat_template renders them, with no documents
        (tests/test_chat_templates.py holds the two equal on 71 real templates). A template that fails on the
        messages (a role out of order, a template that needs tools) raises InvalidParameterError: a template is the
        model's code, and its failure is the request's 400, never a server error."""
        if not self.chat_template:
            raise ModelLoadError("this model has no chat template; drop --chat or pass a raw prompt")
        from jinja2 import TemplateError

        try:
            return _compile_template(self.chat_template).render(
                messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )  # fmt: skip
        except TemplateError as exc:  # the template refuses these messages (roles out of order, ...)
            raise InvalidParameterError(f"the model's chat template refuses these messages: {exc}") from None
        except Exception as exc:  # it fails on them ('NoneType' is not iterable: it loops over the tools)
            raise InvalidParameterError(
                f"the model's chat template fails on these messages ({type(exc).__name__}: {exc})"
            ) from None

    def encode_chat(
        self, messages: list[dict], parse_special: bool = False, tools: list[dict] | None = None
    ) -> list[int]:
        """The chat template's rendering of `messages`, encoded. Message contents are text: a content that spells
        a control token ('<|im_end|>') is encoded as those characters, so a user cannot write a turn of another
        role; only the template's own markers are control tokens. `parse_special`: contents may spell control
        tokens too (llama.cpp's parse_special; what transformers and vLLM do by default)."""
        text = self.render_chat(messages, tools=tools)
        if parse_special or not any(self._spells_control_token(str(m.get("content") or "")) for m in messages):
            return _encode(self.raw, text, add_special_tokens=False)
        return self._encode_contents_as_text(messages, tools)

    @cached_property
    def _control_tokens(self) -> tuple[str, ...]:
        return tuple(t.content for t in self.raw.get_added_tokens_decoder().values() if t.special and t.content)

    def _spells_control_token(self, content: str) -> bool:
        return any(token in content for token in self._control_tokens)

    @cached_property
    def _text_only(self):
        """A copy of the tokenizer that reads control tokens' texts as plain text."""
        copy = type(self.raw).from_str(self.raw.to_str())
        copy.encode_special_tokens = True
        return copy

    def _encode_contents_as_text(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The template rendered around placeholders, its pieces encoded with control tokens and each content
        without them. Raises InvalidParameterError when the template changes contents (so their places in its
        rendering cannot be told)."""
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        contents = [str(m.get("content") or "") for m in messages]
        marked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        pieces = self.render_chat(marked, tools=tools)
        ids: list[int] = []
        for mark, content in zip(marks, contents, strict=True):
            before, found, pieces = pieces.partition(mark)
            if not found or mark in pieces:
                raise InvalidParameterError(
                    "a message spells a control token of this model (such as its turn markers), and its chat "
                    "template rewrites messages, so it cannot be kept as text: remove it"
                )
            ids += _encode(self.raw, before, add_special_tokens=False)
            ids += _encode(self._text_only, content, add_special_tokens=False)
        return ids + _encode(self.raw, pieces, add_special_tokens=False)

    def _differing(self, other: Tokenizer) -> tuple[list[str], dict[str, int]]:
        """The tokens of the smaller token table that the other maps to another id (or lacks), and that table."""
        if other.raw is self.raw:
            return [], {}
        small, large = sorted((self.vocab, other.vocab), key=len)
        return [tok for tok, i in small.items() if large.get(tok) != i], small

    def shares_vocabulary(self, other: Tokenizer) -> bool:
        """Whether `other`'s token ids mean what this tokenizer's do: one token table extends the other (padded
        vocabulary sizes, 151936 vs 152064 rows, do not matter; only the token tables do). A draft model whose
        tokenizer does not share the target's drafts through text, where its method allows one (engine/methods.py:
        Method.other_vocabulary)."""
        return not self._differing(other)[0]

    def check_compatible(self, draft: Tokenizer) -> None:
        """Draft tokens must mean the same to the target (shares_vocabulary), else TokenizerMismatchError."""
        differing, small = self._differing(draft)
        if differing:
            first = min(differing, key=small.__getitem__)  # the lowest id: the same example on every run
            raise TokenizerMismatchError(
                f"draft and target tokenizers differ ({len(differing)} of {len(small)} tokens map to other "
                f"ids, e.g. {first!r}: id {draft.vocab.get(first)} in the draft, {self.vocab.get(first)} in the "
                "target); use a draft model from the target's family"
            )


def _encode(raw, text: str, add_special_tokens: bool) -> list[int]:
    """`raw.encode(text)` through the batch call, which releases the GIL while it runs (the single call holds it:
    a 5 MB prompt stalled every other thread of a server for seconds); the same ids."""
    return raw.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 bytes stand for themselves, the other
    bytes for the characters from U+0100 on, in byte order (the table every byte-level BPE vocabulary uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


_BYTE_OF = _byte_alphabet()


def _quick_to_parse(definition: str) -> str:
    """A tokenizer.json that the tokenizers library reads in two thirds of the time (0.21 s instead of 0.29 for
    Qwen2.5's 151k merges, a third of a warm start's loading): a BPE's merges as "a b" strings, the older form the
    library still reads, where no token holds a space (there the pair form is the only unambiguous one)."""
    data = json.loads(definition)
    model = data.get("model") or {}
    merges = model.get("merges")
    pairs = model.get("type") == "BPE" and bool(merges) and isinstance(merges[0], list)
    if pairs and not any(" " in part for merge in merges for part in merge):
        model["merges"] = [" ".join(merge) for merge in merges]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=4)
def _parse(definition: bytes):
    from tokenizers import Tokenizer as RawTokenizer

    return RawTokenizer.from_buffer(definition)


@lru_cache(maxsize=16)
def _compile_template(source: str):
    """A chat template in the environment chat templates are written for (transformers' conventions: sandboxed,
    trim_blocks and lstrip_blocks, loop controls, `tojson` keeping non-ASCII text, `raise_exception`,
    `strftime_now`, the `generation` block)."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_block()]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@lru_cache(maxsize=1)
def _generation_block():
    """The extension of `{% generation %}...{% endgeneration %}`, which marks an assistant's text for
    transformers' training masks: its body renders as it is, in a scope of its own (a call block, as in
    transformers, so a `set` inside does not reach past it)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return Generation
