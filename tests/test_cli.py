"""Bad input through the real command line: one line on stderr, non-zero exit, never a traceback."""

import re
import subprocess
import sys

import pytest

from real_models import require_bundled, smollm2_path


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verispec", *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def assert_clean_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], result.stderr


def test_missing_model_path():
    assert_clean_error(run_cli("generate", "hi", "--model", "/nonexistent/model.gguf"), "does not exist")


def test_file_that_is_not_a_model(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all" * 10)
    assert_clean_error(run_cli("generate", "hi", "--model", str(junk)), "not a readable GGUF")


def test_folder_that_is_not_a_model(tmp_path):
    assert_clean_error(run_cli("generate", "hi", "--model", str(tmp_path)), "no config.json")


def test_unreadable_model(tmp_path):
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(b"GGUF")
    locked.chmod(0)
    result = run_cli("generate", "hi", "--model", str(locked))
    assert_clean_error(result)  # as root the file is still readable: then it is "not a readable GGUF"


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--num-speculative-tokens", "0"], "num_speculative_tokens must be >= 1"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--max-tokens", "0"], "max_tokens must be >= 1"),
        (["--presence-penalty", "3"], "presence_penalty must be in [-2, 2]"),
        (["--json-schema", "{not json"], "--json-schema is neither a file nor JSON text"),
        (["--regex", "[a-", "--max-tokens", "2"], "invalid regex"),
        (["--grammar", "start: nothing_defined", "--max-tokens", "2"], "invalid grammar"),
    ],
)
def test_bad_parameters(flags, fragment):
    require_bundled()
    assert_clean_error(run_cli("generate", "hi", *flags), fragment)


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "hi", "--draft-window", "-1"],
        ["generate", "hi", "--draft-window", "many"],
        ["bench", "--draft-window", "-3"],
        ["serve", "--suffix-cache-tokens", "-5"],
    ],
)
def test_negative_sizes_are_refused_by_their_flag_before_loading(args):
    flag = next(arg for arg in args if arg.startswith("--"))
    assert_clean_error(run_cli(*args), f"argument {flag}:")


def test_empty_prompt():
    require_bundled()
    assert_clean_error(run_cli("generate", "", "--speculative-model", "none"), "prompt is empty")


def test_prompt_longer_than_the_context():
    require_bundled()
    result = run_cli("generate", "word " * 300, "--max-model-len", "64", "--speculative-model", "none")
    assert_clean_error(result, "context holds 64")


def test_a_draft_model_of_another_family_drafts_through_text():
    """SmolLM2's tokenizer is not the bundled Qwen target's: it drafts (text re-cut both ways), and the output is
    plain decoding's."""
    require_bundled()
    result = run_cli("generate", "def add(a, b):", "--max-tokens", "8", "--compare",
                     "--speculative-model", str(smollm2_path()), "--speculative-method", "draft")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "texts identical" in result.stderr


def test_generate_streams_and_prints_stats():
    require_bundled()
    result = run_cli("generate", "def add(a, b):", "--max-tokens", "8", "--compare")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "acceptance" in result.stderr and "texts identical" in result.stderr
    chosen = [line for line in result.stderr.splitlines() if line.startswith("verispec: drafter:")]
    assert chosen == ["verispec: drafter: suffix with the bundled draft (the bundled draft's vocabulary is the "
                      "target's)"], result.stderr  # fmt: skip
    speculative = next(line for line in result.stderr.splitlines() if line.startswith("[speculative]"))
    drafted = int(re.search(r"\| drafted (\d+) \|", speculative)[1])
    if drafted:  # each proposer that drafted, accepted / drafted; and the acceptance by draft position
        counts = [(int(a), int(d)) for a, d in re.findall(r"(?:model|lookup) (\d+)/(\d+) \(", speculative)]
        assert sum(d for _, d in counts) == drafted, speculative
        assert re.search(r"^\[positions\]   acceptance by draft position (\d+% ?)+", result.stderr, re.M)


def test_generate_follows_a_json_schema_file(tmp_path):
    require_bundled()
    schema = tmp_path / "person.json"
    schema.write_text(
        '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", '
        '"maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}'
    )
    result = run_cli("generate", "A person, as JSON.", "--chat", "--json-schema", str(schema), "--max-tokens", "60")
    assert result.returncode == 0, result.stderr
    import json

    assert set(json.loads(result.stdout)) == {"name", "age"}
