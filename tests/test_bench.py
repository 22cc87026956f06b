"""verispec bench on tiny in-process models: complete, self-consistent outputs; clear errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verispec.bench import BenchConfig, Models, run_bench, write_outputs
from verispec.bench import methods as bench_methods
from verispec.bench.cli import config_from_args
from verispec.bench.config import QUICK
from verispec.bench.datasets import load_requests
from verispec.bench.runner import reference_method
from verispec.bench.summary import ideal_speedup
from verispec.bench.tiny import hf_twin, tiny_models
from verispec.cli import main
from verispec.decoding.acceptance import expected_tokens_per_round
from verispec.testing import prefer_the_end_token

PROMPTS = [
    {"prompt": "def add(a, b):\n    return"},
    {"messages": [{"role": "user", "content": "Write hello world in C."}]},
    {"turns": ["What is 2 + 2?", "And 3 + 3?"]},
    {"prompt": "The quick brown fox"},
]
MAX_TOKENS = 16


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def bench(prompts_file, tmp_path_factory):
    """One tiny bench with every method and the transformers peers; returns (results.json, report.md, folder)."""
    threads = torch.get_num_threads()
    target, draft = tiny_models()
    models = Models(target, draft, load_hf=lambda role: hf_twin((target if role == "target" else draft).model))
    config = BenchConfig(
        dataset=str(prompts_file), num_prompts=len(PROMPTS), max_tokens=MAX_TOKENS, ks=(1, 3), peers=("hf",),
        threads=1, warmup_tokens=2, cost_repeats=2, progress=False,
    )  # fmt: skip
    result = run_bench(config, models, log=lambda message: None)
    torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("bench")
    write_outputs(result, folder)
    return json.loads((folder / "results.json").read_text()), (folder / "report.md").read_text(), folder


METHODS = ["plain", "draft-k1", "draft-k3", "hf-plain", "hf-assisted", "hf-lookup"]


def by_method(results: dict) -> dict[str, dict]:
    return {row["method"]: row for row in results["summary"]}


def test_results_cover_every_prompt_and_method(bench):
    results, _, _ = bench
    assert results["interrupted"] is False
    assert [row["method"] for row in results["summary"]] == METHODS
    assert len(results["prompts"]) == len(PROMPTS)
    pairs = {(run["prompt"], run["method"]) for run in results["runs"]}
    assert pairs == {(p, m) for p in range(len(PROMPTS)) for m in METHODS}
    assert results["costs"]["c"] > 0 and set(results["costs"]["verify_ratio"]) == {"1", "3"}
    for run in results["runs"]:
        assert run["wall_s"] > 0 and run["peak_rss_bytes"] > 0
        assert run["new_tokens"] == len(run["output_ids"]) <= MAX_TOKENS
        if not run["method"].startswith("hf-"):
            times = run["time_prefill"] + run["time_draft"] + run["time_target"] + run["time_other"]
            assert times == pytest.approx(run["wall_s"], rel=1e-6)


def test_counts_add_up(bench):
    results, _, _ = bench
    for run in results["runs"]:
        if run["method"].startswith("hf-"):
            continue
        assert run["drafted"] == sum(run["drafted_by_position"])
        assert run["accepted"] == sum(run["accepted_by_position"])
        if run["method"] == "plain":
            assert run["drafted"] == 0 and run["rejected"] is None
        else:
            assert run["accepted"] + run["rejected"] <= run["drafted"]
            assert run["rejected"] <= run["target_passes"]
        emitted = run["accepted"] + run["target_passes"]  # each pass emits its accepted tokens + one more
        if run["finish_reason"] == "length":
            assert run["new_tokens"] == emitted
        else:
            assert run["new_tokens"] < emitted
    for row in results["summary"]:
        runs = [run for run in results["runs"] if run["method"] == row["method"]]
        assert row["new_tokens"] == sum(run["new_tokens"] for run in runs)
        assert row["target_passes"] == sum(run["target_passes"] for run in runs)
        assert row["mean_accepted_length"] == pytest.approx(row["new_tokens"] / row["target_passes"])
        if row["k"]:
            assert row["accepted"] == sum(run["accepted"] for run in runs)
            assert row["acceptance_rate"] == pytest.approx(row["accepted"] / row["drafted"])


def test_speedup_is_the_ratio_of_measured_rates(bench):
    results, _, _ = bench
    rows = by_method(results)
    for row in rows.values():
        runs = [run for run in results["runs"] if run["method"] == row["method"]]
        rate = sum(run["new_tokens"] for run in runs) / sum(run["wall_s"] for run in runs)
        assert row["tokens_per_s_total"] == pytest.approx(rate)
        assert row["speedup"] == pytest.approx(rate / rows["plain"]["tokens_per_s_total"])
    assert rows["plain"]["speedup"] == pytest.approx(1.0)


def test_ideal_and_efficiency_follow_the_formula(bench):
    results, _, _ = bench
    c = results["costs"]["c"]
    for method in ("draft-k1", "draft-k3"):
        row = by_method(results)[method]
        alpha = row["accepted"] / (row["accepted"] + row["rejected"])
        assert row["alpha"] == pytest.approx(alpha)
        assert row["ideal_speedup"] == pytest.approx(expected_tokens_per_round(alpha, row["k"]) / (row["k"] * c + 1))
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["ideal_speedup"])
        assert row["verify_ratio"] == pytest.approx(results["costs"]["verify_ratio"][str(row["k"])])
    assert expected_tokens_per_round(1.0, 4) == 5 and expected_tokens_per_round(0.0, 4) == 1
    assert ideal_speedup(0.5, 2, 0.0) == pytest.approx(1.75)


def test_greedy_outputs_equal_plain_decoding(bench):
    results, _, _ = bench
    plain = {run["prompt"]: run["output_ids"] for run in results["runs"] if run["method"] == "plain"}
    for run in results["runs"]:
        if run["method"] != "plain":
            assert run["output_ids"] == plain[run["prompt"]], run["method"]
            assert run["identical_to_plain"] is True
    for method in METHODS[1:]:
        assert by_method(results)[method]["identical_to_plain"] == len(PROMPTS)


def test_report_has_a_row_per_method_and_the_plots(bench):
    results, report, folder = bench
    rows = by_method(results)
    assert "| method | k | prompts | new tokens | tok/s median | tok/s total | speedup |" in report
    for method, row in rows.items():
        line = next(line for line in report.splitlines() if line.startswith(f"| {method} |"))
        assert f"| {row['speedup']:.2f}x |" in line and f"| {row['tokens_per_s_total']:.2f} |" in line
        if row["k"]:
            assert f"| {row['alpha']:.3f} |" in line and line.endswith(f"| {len(PROMPTS)}/{len(PROMPTS)} |")
    assert results["command"] in report
    for method in ("draft-k1", "draft-k3"):  # the draft model alone drafts: all its drafts are the model's
        row = rows[method]
        assert f"| {method} | model | {row['drafted']} | 100% | {row['accepted']} |" in report
        assert f"| {method} | lookup |" not in report
    for name in ("speedup_vs_k.png", "acceptance_by_position.png", "time_breakdown.png"):
        assert (folder / name).read_bytes().startswith(b"\x89PNG") and f"]({name})" in report


def test_cli_quick_tiny_run_and_ctrl_c_keeps_finished_runs(prompts_file, tmp_path, monkeypatch, capsys):
    args = ["bench", "--tiny", "--quick", "--threads", "1", "--dataset", str(prompts_file), "--num-prompts", "3"]
    assert main([*args, "--max-tokens", "6", "--no-plots", "--output", str(tmp_path / "ok")]) == 0
    results = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert len(results["runs"]) == 3 * 3 and results["config"]["ks"] == [2, 4]
    assert "--tiny" in results["command"] and "--quick" not in results["command"]

    calls = {"n": 0}
    original = bench_methods.Method.generate

    def interrupted_on_the_8th_call(self, *args, **kwargs):  # 3 warm-up calls, then 4 finished runs
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(bench_methods.Method, "generate", interrupted_on_the_8th_call)
    assert main([*args, "--max-tokens", "6", "--output", str(tmp_path / "cut")]) == 130
    results = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert results["interrupted"] is True and len(results["runs"]) == 4
    rows = by_method(results)
    assert rows["plain"]["prompts"] == 1 and rows["draft-k2"]["prompts"] == 2  # prompt 2 starts with draft-k2
    first = [run for run in results["runs"] if run["prompt"] == 0]
    rate = {run["method"]: run["new_tokens"] / run["wall_s"] for run in first}
    assert rows["draft-k2"]["speedup"] == pytest.approx(rate["draft-k2"] / rate["plain"])  # same prompts only
    assert "interrupted" in (tmp_path / "cut" / "report.md").read_text()
    assert "verispec: interrupted" in capsys.readouterr().err


def test_datasets_humaneval_and_jsonl(prompts_file):
    humaneval = load_requests("humaneval")
    assert len(humaneval) == 164 and humaneval[0].id == "HumanEval/0" and "def " in humaneval[0].prompt
    requests = load_requests(str(prompts_file))
    assert [r.is_chat for r in requests] == [False, True, True, False]
    assert requests[2].prompt == [{"role": "user", "content": "What is 2 + 2?"}]
    assert all(r.is_chat for r in load_requests(str(prompts_file), chat=True))
    long = load_requests("humaneval-long")
    assert len(long) == 164 - 8 and long[0].id == "HumanEval/8-long"
    assert long[0].prompt.endswith(humaneval[8].prompt) and humaneval[7].prompt in long[0].prompt
    assert all(len(r.prompt) > 2500 for r in long)  # 800-2,700 tokens of the bundled tokenizer


def test_reported_command_repeats_the_run():
    from verispec.cli import COMMANDS

    parser = __import__("argparse").ArgumentParser()
    COMMANDS["bench"][0](parser)
    config = config_from_args(parser.parse_args(["--quick", "--k", "3,1", "--dtype", "bfloat16", "--chat"]))
    again = config_from_args(parser.parse_args(config.command.split()[2:]))
    assert again.command == config.command and again.ks == (3, 1) and again.max_tokens == QUICK["max_tokens"]


# ---- bad input: one line `verispec: error: ...`, exit status 2, no traceback --------------------------------
def bad_jsonl(tmp_path: Path) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "broken"\n')
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--dataset", "no-such-set"], "unknown dataset 'no-such-set'"),
        (["--dataset", "BAD"], "bad.jsonl:2: not valid JSON"),
        (["--k", "2,0"], "k (tokens drafted per target pass) must be >= 1, got 0"),
        (["--k", "2,x"], "--k expects comma-separated integers, got 'x'"),
        (["--methods", "plain,medusa"], "unknown method 'medusa'"),
        (["--peers", "vllm"], "unknown peer 'vllm'"),
        (["--peers", "hf", "--temperature", "0.7"], "--peers compares greedy outputs"),
        (["--speculative-model", "none"], "the draft speculative method needs a draft model"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--draft-vocab", "-1"], "--draft-vocab must be >= 0"),
        (["--methods", "auto-medusa"], "unknown method 'auto-medusa'"),
        (["--methods", "hybrid", "--speculative-model", "none"], "the hybrid speculative method needs a draft model"),
        (["--dataset", "json-schema", "--peers", "hf"], "the peers run no grammars"),
    ],
)
def test_bad_input_gives_one_clear_line(args, expected, tmp_path, capsys):
    args = [bad_jsonl(tmp_path) if a == "BAD" else a for a in args]
    assert main(["bench", "--tiny", "--output", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: ") and expected in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_peer_missing_its_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # as if not installed
    assert main(["bench", "--peers", "hf", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: --peers hf needs the 'accelerate' package") and err.count("\n") == 1


def test_llamacpp_peer_missing_its_package(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    assert main(["bench", "--peers", "llamacpp", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: --peers llamacpp needs llama-cpp-python") and err.count("\n") == 1


def test_each_method_is_compared_with_its_own_plain_decoding():
    methods = {"plain", "draft-k3", "auto-hybrid-k3", "hf-plain", "hf-assisted", "llamacpp-plain", "llamacpp-lookup"}
    assert reference_method("draft-k3", methods) == "plain"
    assert reference_method("auto-hybrid-k3", methods) == "plain"
    assert reference_method("hf-plain", methods) == "plain"
    assert reference_method("hf-assisted", methods) == "hf-plain"
    assert reference_method("llamacpp-lookup", methods) == "llamacpp-plain"
    assert reference_method("llamacpp-draft", methods - {"llamacpp-plain"}) == "plain"


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    command = [sys.executable, "-m", "verispec", "bench", "--tiny", "--dataset", bad_jsonl(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"verispec: error: {tmp_path / 'bad.jsonl'}:2: not valid JSON (Expecting ',' delimiter)"
    ]


@pytest.mark.real
def test_llamacpp_peers_run_on_the_bundled_gguf_files(tmp_path):
    """Skipped unless llama-cpp-python is installed (the [llamacpp] extra; it builds from source)."""
    pytest.importorskip("llama_cpp")
    from real_models import require_bundled

    require_bundled()
    config = BenchConfig(
        num_prompts=1, max_tokens=12, methods=("plain",), ks=(), peers=("llamacpp",), draft_model="draft",
        warmup_tokens=0, cost_repeats=1, progress=False, output=tmp_path, plots=False,
    )  # fmt: skip
    runs = {run.method: run for run in run_bench(config, log=lambda message: None).runs}
    assert set(runs) == {"plain", "llamacpp-plain", "llamacpp-lookup", "llamacpp-draft"}
    plain = runs["llamacpp-plain"]
    assert len(plain.output_ids) == 12 and plain.target_passes == 12  # the prompt's pass, then one per token
    for name in ("llamacpp-lookup", "llamacpp-draft"):
        assert 0 < runs[name].target_passes <= 12 and runs[name].identical_to_plain is not None


def test_llamacpp_native_peer_missing_its_programs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LLAMACPP_BIN", str(tmp_path))
    monkeypatch.setenv("LLAMACPP_HOME", str(tmp_path))
    assert main(["bench", "--peers", "llamacpp-native", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: --peers llamacpp-native needs llama.cpp's programs")
    assert err.count("\n") == 1


def test_json_schema_dataset_constrains_every_run_and_reports_the_grammars_time(tmp_path):
    """The structured-output workload: each prompt carries its schema; every method decodes under it (the tiny
    byte model writes JSON-shaped text), speculative equals plain, and the report shows the masks' time."""
    requests = load_requests("json-schema")
    assert len(requests) == 20 and all(r.grammar is not None and r.is_chat for r in requests)
    assert len(load_requests("json-schema-long")) == 10
    target, draft = tiny_models()
    config = BenchConfig(
        dataset="json-schema", num_prompts=2, max_tokens=12, methods=("plain", "draft"), ks=(3,), threads=1,
        warmup_tokens=0, cost_repeats=1, progress=False, plots=False,
    )  # fmt: skip
    result = run_bench(config, Models(target, draft), log=lambda message: None)
    assert all(run.time_grammar > 0 for run in result.runs)
    assert all(run.identical_to_plain for run in result.runs if run.method != "plain")
    first = target.tokenizer.decode(result.runs[0].output_ids)
    assert first.lstrip().startswith("{")  # the first schema is an object
    write_outputs(result, tmp_path / "out")
    assert "grammar (within)" in (tmp_path / "out" / "report.md").read_text()


def test_ignore_eos_generates_max_tokens_through_end_of_sequence(prompts_file):
    """A target whose head always prefers the end token: without --ignore-eos every run stops at once; with it
    every run has max_tokens tokens, and speculative decoding still equals plain decoding token for token."""
    target, draft = tiny_models()
    eos = prefer_the_end_token(target)
    runs = {}
    for ignore in (False, True):
        config = BenchConfig(
            dataset=str(prompts_file), num_prompts=len(PROMPTS), max_tokens=24, methods=("plain", "draft"), ks=(3,),
            threads=1, warmup_tokens=0, cost_repeats=1, progress=False, ignore_eos=ignore,
        )  # fmt: skip
        runs[ignore] = run_bench(config, Models(target, draft), log=lambda message: None).runs
    assert all(run.new_tokens == 0 and run.finish_reason == "stop" for run in runs[False])
    assert all(run.new_tokens == 24 and run.finish_reason == "length" for run in runs[True])
    assert all(run.output_ids == [eos] * 24 for run in runs[True])
    assert all(run.identical_to_plain for run in runs[True] if run.method != "plain")


@pytest.mark.real
def test_llamacpp_native_programs_run_beside_ours(tmp_path):
    """Skipped unless llama.cpp's programs are built (docs/bench.md)."""
    from verispec.bench.llamacpp_native import binaries
    from verispec.bench.peer_tools import PeerUnavailableError

    from real_models import require_bundled

    try:
        binaries()
    except PeerUnavailableError:
        pytest.skip("llama.cpp's programs are not built")
    require_bundled()
    config = BenchConfig(
        num_prompts=1, max_tokens=12, methods=("plain",), ks=(), peers=("llamacpp-native",), draft_model="draft",
        warmup_tokens=0, cost_repeats=1, progress=False, output=tmp_path, plots=False, ignore_eos=True,
        quantization="gguf",
    )  # fmt: skip
    result = run_bench(config, log=lambda message: None)
    runs = {run.method: run for run in result.runs}
    assert set(runs) == {"plain", "llama.cpp-plain", "llama.cpp-draft", "llama.cpp-ngram-simple", "llama.cpp-ngram-mod"}
    for name, run in runs.items():  # llama-speculative-simple keeps a whole accepted draft past -n
        assert run.new_tokens == 12 if name.endswith("plain") else 12 <= run.new_tokens <= 32, name
        assert 0 < run.wall_s < 30, name
    assert runs["llama.cpp-plain"].output_ids[:4] == runs["plain"].output_ids[:4]  # the same model, greedy
    assert all(run.identical_to_plain is not None for name, run in runs.items() if name != "plain")
    assert result.peer_passes is not None and set(result.peer_passes) >= {1, 4, 8}
    assert 0 < result.costs.native["target"]["head_s"] < result.costs.target_step_s  # the head, inside the step


def test_lookups_longer_than_k_are_summarized_by_position(tmp_path):
    """Suffix drafting drafts up to 15 tokens at any k: the summary counts every position it drafted at (a report
    sized to k alone failed here, after a whole run)."""
    path = tmp_path / "repeating.jsonl"
    path.write_text(json.dumps({"prompt": "one two three four five six seven eight " * 6}) + "\n")
    target, draft = tiny_models()
    config = BenchConfig(
        dataset=str(path), num_prompts=1, max_tokens=40, ks=(1,), methods=("plain", "suffix-only"), threads=1,
        warmup_tokens=0, cost_repeats=1, progress=False, ignore_eos=True,
    )  # fmt: skip
    result = run_bench(config, Models(target, draft), log=lambda message: None)
    write_outputs(result, tmp_path / "out")
    rows = by_method(json.loads((tmp_path / "out" / "results.json").read_text()))
    suffix = rows["suffix-only-k1"]
    assert suffix["drafted_by_lookup"] == suffix["drafted"] > 0
    assert len(suffix["acceptance_by_position"]) > 1


def test_report_splits_the_drafts_by_proposer_and_by_position(tmp_path):
    """Suffix drafting with the draft model beside it: both proposers draft on a repeating prompt, and the
    summary and report.md count each one's tokens apart (summing to the method's totals) and by position."""
    path = tmp_path / "repeating.jsonl"
    path.write_text(json.dumps({"prompt": "one two three four five six seven eight " * 6 + "nine"}) + "\n")
    target, draft = tiny_models()
    config = BenchConfig(
        dataset=str(path), num_prompts=1, max_tokens=40, ks=(2,), methods=("plain", "suffix"), threads=1,
        warmup_tokens=0, cost_repeats=1, progress=False, ignore_eos=True,
    )  # fmt: skip
    result = run_bench(config, Models(target, draft), log=lambda message: None)
    write_outputs(result, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    report = (tmp_path / "out" / "report.md").read_text()
    row = by_method(results)["suffix-k2"]
    (run,) = [run for run in results["runs"] if run["method"] == "suffix-k2"]
    assert 0 < row["drafted_by_lookup"] < row["drafted"]  # both proposers drafted
    for name in ("drafted", "accepted", "rejected"):
        assert row[f"{name}_by_lookup"] == run[f"{name}_by_lookup"] <= row[name]
    assert row["drafted_by_position"] == run["drafted_by_position"] and row["drafted_by_position"][2] > 0  # past k
    model = row["drafted"] - row["drafted_by_lookup"], row["accepted"] - row["accepted_by_lookup"]
    lookup = row["drafted_by_lookup"], row["accepted_by_lookup"]
    for proposer, (drafted, accepted) in (("model", model), ("lookup", lookup)):
        assert f"| suffix-k2 | {proposer} | {drafted} | {drafted / row['drafted']:.0%} | {accepted} |" in report
    line = next(line for line in report.splitlines() if line.startswith("| suffix-k2 | ") and "%" in line.split("|")[2])
    first = row["accepted_by_position"][0] / row["drafted_by_position"][0]
    assert line.startswith(f"| suffix-k2 | {first:.0%} |") and "## Acceptance by draft position" in report
