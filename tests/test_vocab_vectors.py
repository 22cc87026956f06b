"""verispec's GGUF tokenizers against llama.cpp's own test vectors.

llama.cpp ships vocabulary-only GGUF files (`ggml-vocab-<family>.gguf`) with texts (`.inp`, separated by the
line `__ggml_vocab_test__`) and the ids its tokenizer gives each (`.out`, a line per text): no BOS, a control
token's spelling read as text (its tests/test-tokenizer-0.cpp). A family's tokenizer built the way verispec
builds a model's (Tokenizer.from_gguf, saved and loaded back) must give those ids for every text, decode them
back to the text, and add BOS where llama.cpp does.

The vectors come from the llama.cpp copy that `llama-cpp-python`'s build leaves under $LLAMACPP_HOME
(~/.cache/llamacpp-native) when there is one, else from tests/fixtures/vocab: the vocabularies that are under
2 MB xz-compressed (qwen2, llama-bpe, llama-spm, phi-3, deepseek-coder, deepseek-llm, starcoder, gpt-2, mpt,
falcon). gemma-4 (3.0 MB compressed), command-r (2.5 MB), and qwen35 and refact (rules that qwen2's and
starcoder's share all but a regex, resp. all of) run only with the llama.cpp copy. bert-bge is BERT's WordPiece,
for embedding models verispec does not run: its loading is refused, which is checked here too.
"""

from __future__ import annotations

import lzma
import os
from functools import cache
from pathlib import Path

import pytest

FAMILIES = ("llama-bpe", "llama-spm", "qwen2", "qwen35", "phi-3", "gemma-4", "deepseek-coder", "deepseek-llm",
            "gpt-2", "starcoder", "command-r", "falcon", "mpt", "refact")  # fmt: skip
# the BOS llama.cpp adds to a text (its vocabulary loader's default for the family, or the file's flag)
BOS = {"llama-bpe": 128000, "llama-spm": 1, "phi-3": 1, "gemma-4": 2, "deepseek-coder": 32013,
       "deepseek-llm": 100000, "command-r": 5}  # fmt: skip
FIXTURES = Path(__file__).parent / "fixtures" / "vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"


def llamacpp_models() -> Path | None:
    home = Path(os.environ.get("LLAMACPP_HOME", Path.home() / ".cache" / "llamacpp-native"))
    found = sorted(home.glob("llama_cpp_python-*/vendor/llama.cpp/models"), reverse=True)
    return found[0] if found else None


def vocab_file(family: str, tmp_dir: Path) -> Path:
    """The family's vocabulary file: llama.cpp's copy, else the fixture decompressed into `tmp_dir`."""
    name = f"ggml-vocab-{family}.gguf"
    models = llamacpp_models()
    if models is not None and (models / f"{name}.inp").is_file():
        return models / name
    packed = FIXTURES / f"{name}.xz"
    if not packed.is_file():
        pytest.skip(f"{name}: no llama.cpp copy under $LLAMACPP_HOME, and not among the fixtures (module docstring)")
    path = tmp_dir / name
    path.write_bytes(lzma.decompress(packed.read_bytes()))
    for suffix in (".inp", ".out"):
        (tmp_dir / f"{name}{suffix}").write_bytes((FIXTURES / f"{name}{suffix}").read_bytes())
    return path


def vectors(path: Path) -> list[tuple[str, list[int]]]:
    """(text, llama.cpp's ids) pairs, as test-tokenizer-0.cpp reads them."""
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts) and not any(lines[len(texts) :]), f"{path}: texts and id lines differ in count"
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines, strict=False)]


@cache
def _built(family: str, tmp_root: str):
    """The family's tokenizer as a model's cache holds it: built, saved, loaded back (one build per run)."""
    from verispec.models.tokenizer import Tokenizer

    folder = Path(tmp_root) / family
    folder.mkdir(exist_ok=True)
    path = vocab_file(family, folder)
    Tokenizer.from_gguf(path).save(folder)
    return Tokenizer.load(folder), vectors(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_gives_llamacpp_ids_for_every_test_text(family, tmp_path_factory):
    tokenizer, cases = _built(family, str(tmp_path_factory.getbasetemp()))
    assert cases
    wrong = []
    for text, ids in cases:
        # llama.cpp tokenizes these without BOS, a control token's spelling as text (encode_chat's contents too)
        got = tokenizer._text_only.encode_batch([text], add_special_tokens=False)[0].ids
        if got != ids:
            wrong.append(f"{text!r}: llama.cpp {ids}, verispec {got}")
        assert tokenizer.decode(ids) == text
    assert not wrong, f"{family}: {len(wrong)} of {len(cases)} texts differ:\n" + "\n".join(wrong[:5])


@pytest.mark.parametrize("family", FAMILIES)
def test_bos_is_added_where_llamacpp_adds_it(family, tmp_path_factory):
    tokenizer, cases = _built(family, str(tmp_path_factory.getbasetemp()))
    text, ids = next((text, ids) for text, ids in cases if ids)
    assert tokenizer.encode(text) == ([BOS[family]] if family in BOS else []) + ids


def test_a_vocabulary_outside_llamacpp_rules_here_is_refused_in_one_line(tmp_path):
    """BERT's WordPiece (embedding models) and a byte-level vocabulary naming a `pre` the rules do not know are
    refused by name, before transformers reads the file."""
    from verispec.errors import ModelLoadError
    from verispec.models.gguf_vocab import vocab_rules

    with pytest.raises(ModelLoadError, match=r"tokenizer type 'bert' is not supported \(supported: gpt2"):
        vocab_rules({"tokenizer.ggml.model": "bert"}, "x.gguf")
    with pytest.raises(ModelLoadError, match="tokenizer pre-type 'chatglm-bpe' is not supported"):
        vocab_rules({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "chatglm-bpe"}, "x.gguf")
    models = llamacpp_models()
    if models is not None and (models / "ggml-vocab-bert-bge.gguf").is_file():
        from verispec.models.tokenizer import Tokenizer

        with pytest.raises(ModelLoadError, match="tokenizer type 'bert' is not supported"):
            Tokenizer.from_gguf(models / "ggml-vocab-bert-bge.gguf")


def test_a_cached_tokenizer_built_by_older_rules_is_rebuilt_in_place(tmp_path):
    """A model converted by an earlier verispec keeps its weights; its tokenizer is built again from the file
    (cut by the current rules) and saved over the old one, its extra stop ids kept."""
    from tokenizers.pre_tokenizers import ByteLevel

    from verispec.models.gguf_vocab import RULES_VERSION
    from verispec.models.tokenizer import Tokenizer

    path = vocab_file("starcoder", tmp_path)
    folder = tmp_path / "cache"
    folder.mkdir()
    old = Tokenizer.from_gguf(path, extra_stop_ids=(7,))
    old.raw.pre_tokenizer = ByteLevel(add_prefix_space=False)  # GPT-2's cut, which transformers gave it
    old.gguf_rules = None  # what a verispec before the rules saved
    old.save(folder)
    text = "ied 4 \u00bd months"  # StarCoder cuts every digit (½ too) from the space before it
    expected = dict(vectors(path))[text]
    assert Tokenizer.load(folder).encode(text) != expected
    rebuilt = Tokenizer.load_for_gguf(folder, path)
    assert rebuilt.gguf_rules == RULES_VERSION and rebuilt.extra_stop_ids == (7,)
    assert rebuilt.encode(text) == Tokenizer.load(folder).encode(text) == expected


def test_a_cached_tokenizer_saved_in_the_older_format_is_written_again_and_cuts_the_same(tmp_path):
    """A cache whose tokenizer.json holds merges as pairs (saved before SAVED_FORMAT 2) is written again with string
    merges the first time it loads; texts cut the same before and after."""
    import json

    from verispec.models.tokenizer import SAVED_FORMAT, Tokenizer

    path = vocab_file("starcoder", tmp_path)
    folder = tmp_path / "cache"
    folder.mkdir()
    Tokenizer.from_gguf(path).save(folder)
    (folder / "tokenizer.json").write_text(Tokenizer.load(folder).raw.to_str(), encoding="utf-8")  # the pair form
    settings = json.loads((folder / "verispec_tokenizer.json").read_text())
    del settings["saved_format"]
    (folder / "verispec_tokenizer.json").write_text(json.dumps(settings))
    assert isinstance(json.loads((folder / "tokenizer.json").read_text())["model"]["merges"][0], list)
    before = Tokenizer.load(folder)
    after = Tokenizer.load_for_gguf(folder, path)
    assert isinstance(json.loads((folder / "tokenizer.json").read_text())["model"]["merges"][0], str)
    assert Tokenizer.load(folder).saved_format == SAVED_FORMAT
    for text, expected in vectors(path):
        assert before.encode(text) == after.encode(text) == Tokenizer.load(folder).encode(text) == expected
