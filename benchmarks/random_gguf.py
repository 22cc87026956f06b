"""Random checkpoints as GGUF files made by llama.cpp's own converter and llama-quantize: the inputs of the cost
benchmarks (hybrid_costs.py, gemma4_costs.py, moe_costs.py), each made once and cached under the verispec cache's
bench/ folder."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from verispec.models.converted import cache_dir

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP = Path.home() / ".cache/llamacpp-native/llama_cpp_python-0.3.36/vendor/llama.cpp"


def random_gguf(name: str, quant: str, save: Callable[[Path], None], vocab: int = 0) -> Path:
    """The cached file `name`-`quant`.gguf, made where missing: `save(folder)` writes the random checkpoint, the
    fixtures' byte tokenizer is saved beside it (padded with unused tokens to `vocab` entries, where given: the
    converter keeps the tokenizer's rows of the embeddings only), then converted to F16 and quantized to `quant`."""
    out = cache_dir() / "bench" / f"{name}-{quant}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests/fixtures/architectures")]
    import make  # the fixtures' converter call (its tokenizer handling)

    from architectures import tokenizer

    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "hf"
        save(folder)
        tokenizer().save_pretrained(folder)
        if vocab:
            _pad_vocabulary(folder / "tokenizer.json", vocab)
        f16 = Path(work) / "f16.gguf"
        subprocess.run([sys.executable, "-c", make._CONVERT, str(LLAMA_CPP), str(folder), "--outtype", "f16",
                        "--outfile", str(f16)], check=True, capture_output=True)  # fmt: skip
        subprocess.run([str(LLAMA_CPP / "build/bin/llama-quantize"), str(f16), str(out), quant], check=True,
                       capture_output=True)  # fmt: skip
    return out


def _pad_vocabulary(path: Path, size: int) -> None:
    """A tokenizer.json's vocabulary padded with unused tokens to `size` entries."""
    tokenizer = json.loads(path.read_text())
    vocab, added = tokenizer["model"]["vocab"], len(tokenizer["added_tokens"])
    for i in range(len(vocab) + added, size):
        vocab[f"<unused{i}>"] = i
    path.write_text(json.dumps(tokenizer))
