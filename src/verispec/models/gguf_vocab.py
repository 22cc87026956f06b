"""llama.cpp's rules for the tokenizer a GGUF file describes, laid over the one transformers builds from it.

A GGUF file holds a vocabulary (tokens, merges or scores, control and user-defined tokens) and names how text
is cut before the merges run: `tokenizer.ggml.pre` for a byte-level BPE vocabulary, `add_space_prefix` for a
SentencePiece one. llama.cpp is the reference for what those names mean. transformers reads the vocabulary
well but knows only some of the names and guesses the rest (a digit run of StarCoder or DeepSeek kept whole, a
SentencePiece text starting with a space given one prefix space instead of two), so verispec keeps
transformers' vocabulary and sets, from the file's metadata:

- the pre-tokenizer: llama.cpp's regexes for the file's `pre`, applied in turn, each to the pieces the one
  before left (a match becomes a piece, so does the text between matches), then GPT-2's byte alphabet;
- whole-word lookup (llama.cpp's `ignore_merges`): a piece that is itself a token is that token;
- the SentencePiece space prefix: one '▁' at the start and after each control token in the text;
- BOS and EOS from `add_bos_token` / `add_eos_token`, else llama.cpp's default for the vocabulary.

A vocabulary type or `pre` name outside these tables is refused in one line rather than cut some other way.
tests/test_vocab_vectors.py checks every family against llama.cpp's own test vectors.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError

RULES_VERSION = 1  # saved with a tokenizer built by these rules; bump when a rule changes (stale caches rebuild)

# ---- pre-tokenizers, by the name in `tokenizer.ggml.pre` -------------------------------------------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)  # Llama 3's, one digit a piece
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"  # DeepSeek's runs of CJK ideographs and Hangul
# DeepSeek LLM's letters (its tokenizer.json lists the cased letters: Latin, Greek, Cyrillic, Armenian, ...). Escapes
# that Python resolves: Oniguruma reads \U as a plain 'U'.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-"
    "\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_PUNCTUATION = "[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]"


@dataclass(frozen=True)
class Splitting:
    """How a byte-level BPE vocabulary cuts text: `regexes` in turn; `whole_words`: a piece that is a token is
    that token (llama.cpp's ignore_merges); `add_bos`: llama.cpp's default when the file has no flag."""

    regexes: tuple[str, ...]
    whole_words: bool = False
    add_bos: bool = False


_LLAMA3_RULE = Splitting((_LLAMA3,), whole_words=True, add_bos=True)
# llama.cpp's names of each rule, as its converter writes them into `tokenizer.ggml.pre`
_NAMED_RULES = (
    # a file without `pre` (converted before llama.cpp recorded it) is read with llama.cpp's default too
    (("default",), Splitting((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     _LLAMA3_RULE),
    (("dbrx", "smaug-bpe"), Splitting((_LLAMA3,))),
    (("tekken",), Splitting((_TEKKEN,), whole_words=True, add_bos=True)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
     Splitting((_QWEN2,))),
    (("qwen35",), Splitting((_QWEN35,))),
    (("deepseek-llm",), Splitting(
        (r"[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+", rf"\s?{_DEEPSEEK_PUNCTUATION}+", r"\s+$", _CJK, r"\p{N}+"))),
    (("deepseek-coder",), Splitting((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"))),
    (("falcon",), Splitting((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"))),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     Splitting((r"\p{N}", _GPT2))),  # every digit its own piece
    (("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "gigachat", "a.x-4.0",
      "mellum", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de"), Splitting((_GPT2,))),
)  # fmt: skip
PRE_TOKENIZERS: dict[str, Splitting] = {name: rule for names, rule in _NAMED_RULES for name in names}
# Gemma 4's BPE runs on raw UTF-8, spaces written '▁', over each run of newlines and each text between them
_GEMMA4_SPLIT = r"[^\n]+|[\n]+"
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")  # the arrays `apply_rules` reads
_NORMAL, _USER_DEFINED = 1, 4  # llama.cpp's token types: a token of the merges, a text matched whole
VOCABULARIES = {"gpt2": "byte-level BPE", "llama": "SentencePiece", "gemma4": "Gemma 4 BPE"}


@dataclass(frozen=True)
class VocabRules:
    """`vocabulary`: the file's `tokenizer.ggml.model`; `splitting`: for byte-level BPE; `space_prefix`: a
    SentencePiece text gets one '▁' before it (then every space is '▁')."""

    vocabulary: str
    splitting: Splitting | None
    space_prefix: bool
    add_bos: bool
    add_eos: bool


def vocab_rules(metadata: dict, where: str) -> VocabRules:
    """The rules for the vocabulary these metadata describe; ModelLoadError for one llama.cpp's rules here do
    not cover (a BERT or T5 vocabulary, an unknown `pre`)."""
    vocabulary = metadata.get("tokenizer.ggml.model")
    if vocabulary not in VOCABULARIES:
        kinds = ", ".join(f"{name} ({kind})" for name, kind in VOCABULARIES.items())
        raise ModelLoadError(f"{where}: tokenizer type {vocabulary!r} is not supported (supported: {kinds})")
    splitting, add_bos = None, True  # llama.cpp adds BOS for SentencePiece and (forced) Gemma 4 vocabularies
    if vocabulary == "gpt2":
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ModelLoadError(
                f"{where}: tokenizer pre-type {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        splitting = PRE_TOKENIZERS[pre]
        add_bos = splitting.add_bos
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos))
    if vocabulary == "gemma4":
        add_bos = True  # llama.cpp forces it (llama.cpp#21500): the model needs <bos> first, templates write it too
    return VocabRules(
        vocabulary=vocabulary,
        splitting=splitting,
        space_prefix=vocabulary == "llama" and bool(metadata.get("tokenizer.ggml.add_space_prefix", True)),
        add_bos=add_bos and "tokenizer.ggml.bos_token_id" in metadata,
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and "tokenizer.ggml.eos_token_id" in metadata,
    )


def apply_rules(raw, rules: VocabRules, metadata: dict):
    """`raw` (a `tokenizers.Tokenizer` over the file's vocabulary) set to cut text by `rules`, with the file's
    user-defined tokens matched whole; `metadata` as `read_metadata(path, VOCAB_ARRAYS)` gives it. May return a
    new object."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    raw = _with_user_defined_tokens(raw, metadata)
    if rules.splitting is not None:
        splits = [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in rules.splitting.regexes]
        raw.normalizer = None
        raw.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(False, use_regex=False)])
        raw.model.ignore_merges = rules.splitting.whole_words
    elif rules.vocabulary == "llama":
        # the prefix is a normalizer, not Metaspace: Metaspace gives " Hello" one '▁' before "Hello", llama.cpp two
        spaces = normalizers.Replace(" ", "\u2581")
        raw.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), spaces]) if rules.space_prefix else spaces
        raw.pre_tokenizer = None
        strip = [decoders.Strip(" ", 1, 0)] if rules.space_prefix else []
        raw.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
        )
    else:
        raw.normalizer = normalizers.Replace(" ", "\u2581")
        raw.pre_tokenizer = pre_tokenizers.Split(Regex(_GEMMA4_SPLIT), behavior="isolated")
    raw.post_processor = _bos_eos(raw, rules, metadata, processors)
    return raw


def _with_user_defined_tokens(raw, metadata: dict):
    """llama.cpp matches a user-defined token's text whole wherever it occurs. transformers adds those a
    byte-level vocabulary spells in its byte alphabet; the ones spelled in plain text (GPT-NeoX's runs of
    spaces) it respells into the alphabet, where they displace the regular tokens of that spelling ("ĠĠ"), and
    leaves unmatched. Here each gets its own text under its id, and the displaced token its id back."""
    tokens, kinds = metadata.get("tokenizer.ggml.tokens"), metadata.get("tokenizer.ggml.token_type")
    if not tokens or not kinds:
        return raw
    added = raw.get_added_tokens_decoder()
    missing = {i: tokens[i] for i, kind in enumerate(kinds) if kind == _USER_DEFINED and i not in added}
    definition = json.loads(raw.to_str()) if missing else None
    if definition is None or not isinstance(definition["model"].get("vocab"), dict):
        return raw
    model = definition["model"]
    vocab, spelling = model["vocab"], {i: text for text, i in model["vocab"].items()}
    regular = {}
    for i, (text, kind) in enumerate(zip(tokens, kinds, strict=False)):
        if kind == _NORMAL:
            regular.setdefault(text, i)
    dropped = set()
    for i, text in missing.items():
        respelled = spelling.get(i)
        if respelled is not None and respelled != text:
            if respelled in regular:
                vocab[respelled] = regular[respelled]
            else:
                del vocab[respelled]
                dropped.add(respelled)
        vocab[text] = i
    model["merges"] = [m for m in model["merges"] if not dropped.intersection(_merge_parts(m))]
    definition["added_tokens"] += [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": False}
        for i, text in missing.items()
    ]  # fmt: skip
    return type(raw).from_str(json.dumps(definition))


def _merge_parts(merge) -> tuple[str, str, str]:
    """A merge's two parts and its result (a merge is "a b" or ["a", "b"] in tokenizer.json)."""
    first, second = merge.split(" ", 1) if isinstance(merge, str) else merge
    return first, second, first + second


def _bos_eos(raw, rules: VocabRules, metadata: dict, processors):
    """A post-processor adding the BOS and EOS the rules ask for (none: the text's own tokens only)."""
    ends = [("bos", rules.add_bos), ("eos", rules.add_eos)]
    marks = {end: raw.id_to_token(int(metadata[f"tokenizer.ggml.{end}_token_id"])) for end, on in ends if on}
    ids = {token: int(metadata[f"tokenizer.ggml.{end}_token_id"]) for end, token in marks.items()}
    single = " ".join(t for t in (marks.get("bos"), "$A", marks.get("eos")) if t)
    pair = " ".join(t for t in (single, marks.get("bos"), "$B:1", marks.get("eos")) if t)
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(ids.items()))


# ---- the file's metadata -----------------------------------------------------------------------------------------
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_metadata(path: Path, arrays: tuple[str, ...] = (), stop: Callable[[str, dict], bool] | None = None) -> dict:
    """A GGUF file's scalar and string metadata, and the arrays named in `arrays` as lists (other arrays, such as
    the merges, are skipped: the gguf package parses every array into numpy views, 10-20 s over a large vocabulary).
    `stop(key, found so far)`: true ends the reading before that key (a caller that needs the header's start only)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] not in (2, 3):
                raise ModelLoadError(f"{path}: not a GGUF file (version 2 or 3, little-endian)")
            found, offset = {}, 24
            for _ in range(struct.unpack_from("<Q", data, 16)[0]):
                key, offset = _string(data, offset)
                if stop is not None and stop(key, found):
                    break
                kind = struct.unpack_from("<I", data, offset)[0]
                if kind == _ARRAY:
                    value, offset = _array(data, offset + 4, keep=key in arrays)
                else:
                    value, offset = _scalar(data, offset + 4, kind)
                if value is not None:
                    found[key] = value
            return found
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ModelLoadError(f"{path}: unreadable GGUF metadata ({type(exc).__name__}: {exc})") from None


def _string(data, offset: int) -> tuple[str, int]:
    length = struct.unpack_from("<Q", data, offset)[0]
    return data[offset + 8 : offset + 8 + length].decode(errors="replace"), offset + 8 + length


def _scalar(data, offset: int, kind: int):
    if kind == _STRING:
        return _string(data, offset)
    form = _SCALARS[kind]  # KeyError: not a GGUF value type
    return struct.unpack_from(form, data, offset)[0], offset + struct.calcsize(form)


def _array(data, offset: int, keep: bool) -> tuple[list | None, int]:
    """(the array's values, or None when not `keep`; the offset after it)."""
    kind, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if kind in _SCALARS:
        size = struct.calcsize(_SCALARS[kind])
        values = list(struct.unpack_from(f"<{count}{_SCALARS[kind][1]}", data, offset)) if keep else None
        return values, offset + count * size
    values = []
    for _ in range(count):
        value, offset = _string(data, offset) if kind == _STRING else _array(data, offset, keep)
        values.append(value)
    return (values if keep else None), offset
