"""The drafter a target gets with no flag but its model (engine/default_drafter.py): the bundled draft for a target of
its vocabulary, the target's own MTP layer, an assistant or a smaller model of its family found among the user's
models, else lookups alone; never an error, and each gives plain decoding's greedy text. A method that needs a draft
model and finds none is one line; a draft model named explicitly is still checked (test_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verispec import SpeculativeGenerator
from verispec.engine.default_drafter import candidates, describe_loaded
from verispec.errors import InvalidParameterError
from verispec.kernels import native
from verispec.models import bundled
from verispec.models.catalog import describe

from architectures import TINY, make_assistant, make_model, save
from model_stores import FIXTURES, Home
from real_models import require_bundled, smollm2_path

PROMPT = [(37 * i + 11) % 250 for i in range(30)]  # byte tokens: below every tiny model's vocabulary
FAMILIES = sorted(p for p in (FIXTURES / "architectures").glob("*.gguf"))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Home:
    return Home(tmp_path, monkeypatch)


def _greedy(generator: SpeculativeGenerator, prompt, tokens: int = 24) -> list[int]:
    return generator.generate(prompt, tokens, ignore_eos=True).token_ids


def _drafted(chosen: SpeculativeGenerator, prompt, tokens: int = 24) -> list[int]:
    """Greedy tokens of a generator whose drafter drafts: some of its drafts were verified."""
    out = chosen.generate(prompt, tokens, ignore_eos=True)
    assert out.stats.drafted > 0, chosen.drafter.line
    return out.token_ids


def _plain(chosen: SpeculativeGenerator, prompt, tokens: int = 24) -> list[int]:
    """Plain decoding's greedy tokens on the same loaded target (after `chosen` ran: the newest engine on a model takes
    its hidden states, which a drafter reading them needs)."""
    return _greedy(SpeculativeGenerator(chosen.target, None, progress=False), prompt, tokens)


def test_a_smollm2_target_with_no_flag_drafts_by_lookups_and_writes_plain_text(home):
    """The first run of a user with any GGUF outside the bundled draft's family: no error, one line naming the drafter
    and why, and plain decoding's text."""
    result = subprocess.run(
        [sys.executable, "-m", "verispec", "generate", "def add(a, b):", "--model", str(smollm2_path()),
         "--max-tokens", "16", "--compare"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("verispec: drafter:")]
    assert len(lines) == 1 and "suffix lookups alone" in lines[0] and "vocabulary" in lines[0], result.stderr
    assert "texts identical" in result.stderr


def test_the_bundled_target_gets_the_bundled_draft():
    """Judged from the files, without loading: its token table is the bundled draft's."""
    require_bundled()
    target = describe(bundled.bundled_path("target", progress=False), "target", "bundled")
    first = next(candidates(target, None, found=lambda: []))
    assert (first.method, first.model) == ("suffix", "draft")
    smollm2 = describe(smollm2_path(), "smollm2", "path")
    assert [(d.method, d.model) for d in candidates(smollm2, None, found=lambda: [])] == [("suffix", None)]


def test_a_target_with_an_mtp_layer_drafts_with_it_and_writes_plain_text(home):
    path = FIXTURES / "architectures" / "qwen3.5.gguf"
    chosen = SpeculativeGenerator(path, progress=False)
    assert chosen.drafter.method == "mtp" and chosen.drafter.model is None
    assert _drafted(chosen, PROMPT) == _plain(chosen, PROMPT)


@pytest.mark.parametrize("quantization", ["none", "gguf"])  # PyTorch's kernels, the native ones (the CLI's on a CPU)
@pytest.mark.parametrize("path", FAMILIES, ids=[p.stem for p in FAMILIES])
def test_every_family_starts_with_only_its_model_and_writes_plain_text(path, quantization, home):
    """0 errors over the families of tests/fixtures, each drafting where it can, each writing plain decoding's text."""
    if quantization == "gguf" and not native.available():
        pytest.skip("native kernels not compiled")
    chosen = SpeculativeGenerator(path, progress=False, quantization=quantization)
    assert chosen.speculates, chosen.drafter.line
    assert _greedy(chosen, PROMPT) == _plain(chosen, PROMPT), chosen.drafter.line


def test_a_smaller_model_of_the_target_family_among_the_users_drafts_for_it(home, tmp_path):
    """A Llama target in the hub cache, a third-size Llama of its vocabulary beside it: the draft model."""
    target = home.hub_repo("org/llama-small", {"": save(make_model("llama"), tmp_path / "small")})
    draft = home.hub_repo("org/llama-tiny", {"": save(make_model("llama", seed=3, dims=TINY), tmp_path / "tiny")})
    home.hub_repo("org/other-family", {"": save(make_model("qwen2", dims=TINY), tmp_path / "qwen")})
    chosen = SpeculativeGenerator("org/llama-small", progress=False)
    drafter = chosen.drafter
    assert (drafter.method, drafter.model, drafter.label) == ("suffix", str(draft), "org/llama-tiny")
    assert chosen.target.path == target
    assert _drafted(chosen, PROMPT) == _plain(chosen, PROMPT)
    assert chosen.engine.proposer.drafter is not None  # the draft model drafts where no lookup does


def test_a_gemma4_assistant_among_the_users_models_drafts_for_its_target(home, architecture, tmp_path):
    folder, _ = architecture("gemma4")
    home.hub_repo("google/gemma-4-tiny", {"": folder})
    assistant = home.hub_repo("google/gemma-4-tiny-assistant", {"": save(make_assistant(), tmp_path / "assistant")})
    chosen = SpeculativeGenerator("google/gemma-4-tiny", progress=False)
    assert (chosen.drafter.method, chosen.drafter.model) == ("assistant", str(assistant))
    assert _drafted(chosen, PROMPT) == _plain(chosen, PROMPT)


def test_a_named_method_that_needs_a_draft_model_and_finds_none_is_one_line(home):
    with pytest.raises(InvalidParameterError, match=r"^the draft speculative method needs a draft model and none") as e:
        SpeculativeGenerator(smollm2_path(), speculative_method="draft", progress=False)
    assert "\n" not in str(e.value) and "--speculative-model" in str(e.value)


def test_a_named_method_drafting_without_a_model_keeps_its_name(home):
    chosen = SpeculativeGenerator(FIXTURES / "architectures" / "llama3.gguf", speculative_method="ngram",
                                  progress=False)  # fmt: skip
    assert (chosen.drafter.method, chosen.drafter.model) == ("ngram", None)


def test_a_loaded_target_without_a_file_gets_lookups(tiny):
    target, _ = tiny
    assert describe_loaded(target).family is None
    chosen = SpeculativeGenerator(target, progress=False)
    assert (chosen.drafter.method, chosen.drafter.model) == ("suffix", None)


def test_the_bench_without_a_fitting_draft_model_measures_lookups_alone(home, tmp_path):
    """`verispec bench --model SMOLLM2` with its default methods (plain, draft): draft runs as suffix-only, noted."""
    from verispec.bench.config import BenchConfig
    from verispec.bench.runner import run_bench

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    config = BenchConfig(dataset=str(prompts), num_prompts=1, max_tokens=6, ks=(2,), model=str(smollm2_path()),
                         warmup_tokens=0, cost_repeats=1, plots=False, progress=False)  # fmt: skip
    result = run_bench(config, log=lambda message: None)
    assert [c["name"] for c in result.contenders] == ["plain", "suffix-only-k2"]
    assert any("draft ran as suffix-only" in note for note in result.config.notes)
    assert Path(str(smollm2_path())).name in str(result.config.model)
