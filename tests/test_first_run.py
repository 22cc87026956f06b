"""A fresh machine's first run: missing optional packages, stale temporaries, damaged model files, the streamed
conversion, and the fast tokenizer against transformers'."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verispec import cli
from verispec.models import bundled
from verispec.models.quantize import (
    QuantizedLinear,
    _int4_layout,
    _unpack_int4,
    concat_quantized,
    quantized_entries,
    select_rows,
)

from real_models import require_bundled, smollm2_path


# ---- optional packages: one line naming what to install ------------------------------------------------
def test_a_command_whose_package_is_missing_at_run_time_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` now fails as if it were not installed
    assert cli.main(["serve", "--model", "tiny", "--speculative-model", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("verispec: error:") and "'uvicorn'" in err[0], err


def test_a_subcommand_module_that_cannot_import_still_gets_its_command(monkeypatch, tmp_path, capsys):
    (tmp_path / "verispec_fake_ext.py").write_text("import verispec_not_installed_package\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli._EXTENSIONS, "verispec_fake_ext", (("fake",), "fake-extra"))
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    assert cli.main(["fake", "--any", "flags"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verispec_not_installed_package" in err[0] and "verispec[fake-extra]" in err[0], err


# ---- temporaries of killed runs -------------------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporaries_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    (tmp_path / f"model.gguf.tmp{dead}").write_bytes(b"half a file")
    (tmp_path / f"model-abc-v2.tmp{dead}").mkdir()
    (tmp_path / f"model-abc-v2.tmp{dead}" / "layer-000.safetensors").write_bytes(b"x")
    (tmp_path / f"other.tmp{alive}").mkdir()
    (tmp_path / "model-abc-v2").mkdir()
    bundled.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"other.tmp{alive}", "model-abc-v2"])


# ---- bundled files are checked against their sha256 ---------------------------------------------------
def _fake_bundled(tmp_path: Path, monkeypatch) -> tuple[bundled.BundledModel, list[Path]]:
    import hashlib

    parts = []
    for i in range(2):
        part = tmp_path / f"part{i + 1}.bin"
        part.write_bytes(bytes(range(256)) * (1000 + i))
        parts.append(part)
    joined = b"".join(p.read_bytes() for p in parts)
    model = bundled.BundledModel(
        "fake", "fake.gguf", "fake-part", "1.0", 2, len(joined), hashlib.sha256(joined).hexdigest()
    )
    monkeypatch.setitem(bundled.BUNDLED, "fake", model)
    monkeypatch.setattr(bundled.BundledModel, "part_location", lambda self, i: parts[i - 1])
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    return model, parts


def test_a_damaged_joined_file_is_detected_and_joined_again(tmp_path, monkeypatch):
    model, parts = _fake_bundled(tmp_path, monkeypatch)
    path = bundled.bundled_path("fake", progress=False)
    good = path.read_bytes()
    with open(path, "r+b") as damaged:  # the same size, other bytes: only the hash can tell
        damaged.seek(300)
        damaged.write(os.urandom(64))
    assert path.read_bytes() != good
    assert bundled.bundled_path("fake", progress=False) == path
    assert path.read_bytes() == good


def test_an_unchanged_joined_file_is_not_hashed_again(tmp_path, monkeypatch):
    _fake_bundled(tmp_path, monkeypatch)
    bundled.bundled_path("fake", progress=False)
    monkeypatch.setattr(bundled.hashlib, "sha256", lambda: pytest.fail("hashed again"))
    bundled.bundled_path("fake", progress=False)


# ---- damaged weights are refused, and nothing is cached -----------------------------------------------
def _damage(source: Path, target: Path, tensor_name: str) -> None:
    from gguf import GGUFReader

    shutil.copyfile(source, target)
    tensor = next(t for t in GGUFReader(source).tensors if t.name == tensor_name)
    with open(target, "r+b") as f:
        f.seek(int(tensor.data_offset))
        f.write(b"\xff" * 4096)  # block scales become float16 NaN


@pytest.mark.slow  # a real model's conversion, stopped by its NaN: 17 s on two cores
def test_weights_that_dequantize_to_nan_are_refused_and_never_cached(tmp_path):
    damaged = tmp_path / "damaged.gguf"
    _damage(smollm2_path(), damaged, "blk.0.ffn_down.weight")
    env = {**os.environ, "VERISPEC_CACHE": str(tmp_path / "cache")}
    for quantization in ("gguf", "int4", "none"):
        result = subprocess.run(
            [sys.executable, "-m", "verispec", "generate", "hi", "--model", str(damaged), "--speculative-model",
             "none", "--quantization", quantization],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        error = [line for line in result.stderr.splitlines() if "error:" in line]
        named = "0.down" in error[0] or "blk.0.ffn_down" in error[0]  # canonical or GGUF name
        assert len(error) == 1 and "NaN or infinite" in error[0] and named, result.stderr
    converted = tmp_path / "cache" / "converted"
    assert not converted.exists() or not any(converted.iterdir())


# ---- the streamed conversion equals the whole ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["int8", "int4-all"])
def test_chunked_quantization_equals_quantizing_all_rows_at_once(mode):
    weight = torch.randn(64 * 5 + 48 + 8, 96, generator=torch.Generator().manual_seed(0))
    whole = quantized_entries([weight], mode)
    chunks = [weight[start : start + 128] for start in range(0, weight.shape[0], 128)]
    joined = concat_quantized([quantized_entries([c], mode) for c in chunks])
    for key in whole:
        assert torch.equal(whole[key], joined[key]), key


def test_selecting_rows_of_an_int4_linear_matches_a_full_repack():
    weight = torch.randn(64 * 7 + 16, 64, generator=torch.Generator().manual_seed(1))
    linear = QuantizedLinear(64, weight.shape[0], 4, bias=False)
    for key, value in quantized_entries([weight], "int4-all").items():
        setattr(linear, key, value)
    for rows in ([*range(256), 300, 460], [*range(200), 5], [3, 1, 463], list(range(weight.shape[0]))):
        ids = torch.tensor(rows)
        small = select_rows(linear, ids)
        values = _unpack_int4(linear.qweight, 64)
        padded = torch.cat([ids, ids[-1:].expand(-len(ids) % 16)])
        expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values[padded].to(torch.int32), 1)
        assert torch.equal(small.qweight, expected), (rows[:3], _int4_layout())
        x = torch.randn(3, 64).to(torch.bfloat16)
        assert torch.equal(small(x), linear(x)[:, ids])


# ---- the runtime tokenizer equals transformers' --------------------------------------------------------
TEXTS = ["def fibonacci(n):\n    return n", "  leading spaces, punctuation !?", "üñíçødé 中文 🙂", "<|im_end|> x", ""]
CHATS = [
    [{"role": "user", "content": "Reverse a string in Python."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
]  # fmt: skip


@pytest.mark.real
@pytest.mark.parametrize("which", ["target", "smollm2"])
def test_the_saved_tokenizer_encodes_decodes_and_renders_chats_as_transformers_does(which, tmp_path):
    from transformers import AutoTokenizer

    from verispec.models.tokenizer import Tokenizer

    if which == "target":
        require_bundled()
        path = bundled.bundled_path("target")
    else:
        path = smollm2_path()
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    Tokenizer.from_hf(reference).save(tmp_path)
    ours = Tokenizer.load(tmp_path)
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=True)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    for messages in CHATS:
        rendered = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.render_chat(messages) == rendered
    assert ours.eos_token_id == reference.eos_token_id
    assert ours.vocab == reference.get_vocab()


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_a_dense_tensor_holding_nan_or_infinity_is_refused(kind, tmp_path):
    """Dense matrices are checked in place (no float32 copy of a large tensor): BF16 by its exponent bits."""
    from verispec.errors import ModelLoadError
    from verispec.models.gguf_native import _check_finite

    qtype = {"F32": 0, "F16": 1, "BF16": 30}[kind]
    values = np.linspace(-3.0, 3.0, 64, dtype=np.float32)
    for bad in (None, np.nan, np.inf, -np.inf):
        row = values.copy()
        if bad is not None:
            row[17] = bad
        if kind == "F32":
            raw = row
        elif kind == "F16":
            raw = row.astype(np.float16)
        else:  # the upper half of each float32
            raw = (row.view(np.uint32) >> 16).astype(np.uint16)
        path = tmp_path / f"{kind}.bin"
        path.write_bytes(raw.tobytes())
        entry = {"type": qtype, "offset": 0, "bytes": raw.nbytes}
        if bad is None:
            _check_finite(path, "w", entry)
        else:
            with pytest.raises(ModelLoadError, match="NaN or infinite"):
                _check_finite(path, "w", entry)


def test_a_saved_tokenizer_with_string_merges_cuts_text_as_the_pair_form_does():
    """`save` writes a BPE's merges as "a b" strings (parsed faster) only where no token holds a space; either way
    the tokenizer read back cuts every text as the original does (the control: a vocabulary with a spaced token
    keeps its pairs)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    from verispec.models.tokenizer import _quick_to_parse

    texts = ["def fibonacci(n):\n    return n", "naïve café — ünïcode", "    indented\ttabs  and  spaces"]
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.train_from_iterator(texts * 20, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    quick = _quick_to_parse(raw.to_str())
    assert isinstance(json.loads(quick)["model"]["merges"][0], str)
    again = RawTokenizer.from_str(quick)
    for text in [*texts, "fresh text the merges never saw: café fibonacci"]:
        assert again.encode(text).ids == raw.encode(text).ids
    spaced = json.loads(raw.to_str())
    spaced["model"]["merges"][0] = ["a b", "c"]
    assert json.loads(_quick_to_parse(json.dumps(spaced)))["model"]["merges"][0] == ["a b", "c"]
