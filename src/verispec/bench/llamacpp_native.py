"""Peers in the same run: llama.cpp's own command-line programs, on the same GGUF files and prompts.

    llama.cpp-plain         llama-completion, greedy                                  its plain decoding
    llama.cpp-draft         llama-speculative-simple --spec-type draft-simple -md DRAFT  draft-model speculation
    llama.cpp-ngram-simple  llama-speculative-simple --spec-type ngram-simple        prompt lookup
    llama.cpp-ngram-mod     llama-speculative-simple --spec-type ngram-mod           its n-gram model

Each run is one process. Its time is what llama.cpp reports for prompt processing and decoding (model
loading excluded, as ours is); its tokens are the count it reports. Its output text is encoded with our
tokenizer and compared with other outputs up to the shorter one's length less two tokens (the text holds no
end tokens, llama-speculative-simple may decode a few tokens past -n, and a cut text's end may re-encode
otherwise); the counts agree with a comparison of the texts themselves.
`llama-bench` gives its cost of a pass over n tokens.

The binaries are found in $LLAMACPP_BIN, else where `../shared/tools/llamacpp-native build` puts them
(~/.cache/llamacpp-native/llama_cpp_python-*/vendor/llama.cpp/build/bin); docs/bench.md says how to build
them. Prompts are passed with -p and their exact text (-f drops a final newline, which changes what the
model writes).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from ..models.tokenizer import Tokenizer
from .config import BenchConfig
from .llamacpp import gguf_file
from .methods import Outcome
from .peer_tools import PeerUnavailableError

PROGRAMS = ("llama-completion", "llama-speculative-simple", "llama-bench")
SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-mod")
PASS_SIZES = (1, 2, 4, 5, 8, 16, 128)  # 128: its prompt processing, beside our prefill rate
HINT = (
    "--peers llamacpp-native needs llama.cpp's programs (llama-completion, llama-speculative-simple, llama-bench): "
    "build them (docs/bench.md) and set LLAMACPP_BIN to their folder"
)


def binaries() -> Path:
    """The folder holding llama.cpp's programs, or PeerUnavailableError."""
    candidates = [Path(os.environ["LLAMACPP_BIN"]).expanduser()] if os.environ.get("LLAMACPP_BIN") else []
    home = Path(os.environ.get("LLAMACPP_HOME", Path.home() / ".cache" / "llamacpp-native"))
    candidates += sorted(home.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin"), reverse=True)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in PROGRAMS):
            return folder
    raise PeerUnavailableError(HINT)


def check_available() -> None:
    binaries()


class LlamaCppProgram:
    """One llama.cpp configuration, run as a process per prompt."""

    kind = "peer"
    compares_prefix = True  # see runner._mark_identical

    def __init__(self, name: str, command: list[str], tokenizer: Tokenizer, k: int = 0, speculative: bool = False):
        self.name, self.command, self.tokenizer, self.k, self.speculative = name, command, tokenizer, k, speculative

    def generate(
        self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None, grammar=None
    ) -> Outcome:  # grammar: never given (the bench refuses peers for structured output)
        prompt = self.tokenizer.decode(prompt_ids)
        command = [*self.command, "-p", prompt, "-n", str(max_tokens)]
        command += ["--ignore-eos"] * config.ignore_eos
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise PeerUnavailableError(f"{self.name}: llama.cpp exited with {done.returncode}: {last}")
        text = done.stdout
        if self.speculative:  # llama-speculative-simple echoes the prompt before the completion
            text = text.split(prompt, 1)[1] if prompt in text else text
        tokens, seconds = self._timing(done.stderr)
        ids = self.tokenizer.encode(text)[:max_tokens] if text else []  # the text holds no end tokens
        reason = "length" if tokens >= max_tokens else "stop"
        return Outcome(ids, reason, target_passes=0, seconds=seconds, new_tokens=tokens)

    def _timing(self, log: str) -> tuple[int, float]:
        """(tokens generated, seconds of prompt processing + decoding) from llama.cpp's own report."""
        if self.speculative:
            decoded = re.findall(r"decoded\s+(\d+) tokens in\s+([0-9.]+) s", log)
            encoded = re.findall(r"encoded\s+\d+ tokens in\s+([0-9.]+) s", log)
            if not decoded or not encoded:
                raise PeerUnavailableError(f"{self.name}: no timing in llama.cpp's log (another llama.cpp version?)")
            return int(decoded[-1][0]), float(decoded[-1][1]) + float(encoded[-1])
        evals = re.findall(r"common_perf_print:\s+eval time =\s+([0-9.]+) ms /\s+(\d+)", log)
        prompt = re.findall(r"prompt eval time =\s+([0-9.]+) ms", log)
        if not evals or not prompt:
            raise PeerUnavailableError(f"{self.name}: no timing in llama.cpp's log (another llama.cpp version?)")
        decode_ms, tokens = evals[-1]
        return int(tokens) + 1, (float(decode_ms) + float(prompt[-1])) / 1000  # + the token prompt processing gave


def build_programs(config: BenchConfig, tokenizer: Tokenizer, threads: int, context: int) -> list[LlamaCppProgram]:
    folder, target = binaries(), gguf_file(config.model)
    common = ["--temp", "0", "-t", str(threads), "-c", str(context)]
    peers = [
        LlamaCppProgram(
            "llama.cpp-plain",
            [str(folder / "llama-completion"), "-m", target, *common, "-no-cnv", "--no-display-prompt"],
            tokenizer,
        )
    ]
    for spec in SPEC_TYPES:
        extra = ["-md", gguf_file(config.draft_model), "-td", str(threads)] if spec == "draft-simple" else []
        if spec == "draft-simple" and config.draft_model is None:
            continue
        command = [str(folder / "llama-speculative-simple"), "-m", target, *extra, "--spec-type", spec, *common]
        name = "llama.cpp-draft" if spec == "draft-simple" else f"llama.cpp-{spec}"
        peers.append(LlamaCppProgram(name, command, tokenizer, speculative=True))
    return peers


def pass_costs(config: BenchConfig, threads: int) -> dict[int, float] | None:
    """llama-bench's seconds per pass over n tokens (n in PASS_SIZES), or None if it gave no figures."""
    command = [str(binaries() / "llama-bench"), "-m", gguf_file(config.model), "-t", str(threads),
               "-p", ",".join(map(str, PASS_SIZES)), "-n", "0", "-r", "3", "-o", "csv"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    rows = [line.split(",") for line in done.stdout.splitlines()]
    if done.returncode != 0 or not rows:
        return None
    header = [h.strip('"') for h in rows[0]]
    costs = {}
    for row in rows[1:]:
        values = dict(zip(header, (v.strip('"') for v in row), strict=False))
        if values.get("n_prompt") and values.get("avg_ts"):
            n = int(values["n_prompt"])
            costs[n] = n / float(values["avg_ts"])
    return costs or None


def peer_settings() -> dict:
    return {
        "llama.cpp-plain": "llama-completion --temp 0 (llama.cpp's own program)",
        "llama.cpp-draft": "llama-speculative-simple --spec-type draft-simple -md <draft> (its defaults)",
        "llama.cpp-ngram-simple": "llama-speculative-simple --spec-type ngram-simple (its defaults)",
        "llama.cpp-ngram-mod": "llama-speculative-simple --spec-type ngram-mod (its defaults)",
    }
