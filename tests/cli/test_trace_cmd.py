"""``conductor trace synth|stats|spread`` through Typer's test runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app, main
from conductor.cli.trace_cmd import trace_app
from conductor.workload.spread import spread_ties
from conductor.workload.synth import synthesize
from conductor.workload.trace import bundled_trace_path, read_trace, write_trace

runner = CliRunner()

BUNDLED_STATS = """\
requests: 12031
time span: 3537.0 s
mean rate: 3.40 req/s
simultaneous arrivals: 10851 requests share a timestamp with an earlier one (largest run 28; \
`conductor trace spread` orders them in time)
input tokens: mean 12035.1, median 6909, max 126195
output tokens: mean 342.6
unique blocks: 182790
infinite-cache hit rate: 37.4%
LRU hit rate at 3000000 tokens (5859 blocks): 13.8%
"""


def test_synth_writes_the_library_output_and_prints_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "agent.jsonl"
    result = runner.invoke(
        app, ["trace", "synth", "--kind", "agent", "--requests", "100", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"wrote 100 agent requests to {out}: mean input 14371.9 tokens, "
        "mean output 76.5 tokens, infinite-cache prefix hit rate 89.4%\n"
    )
    expected = tmp_path / "expected.jsonl"
    write_trace(synthesize("agent", requests=100, rate_rps=2.0, seed=0), expected)
    assert out.read_bytes() == expected.read_bytes()


def test_synth_options_reach_the_generator(tmp_path: Path) -> None:
    out = tmp_path / "mixed.jsonl.gz"
    args = ["synth", "--kind", "mixed", "--requests", "40", "--rate", "5", "--seed", "9"]
    result = runner.invoke(trace_app, [*args, "--block-size", "256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = tmp_path / "expected.jsonl.gz"
    records = synthesize("mixed", requests=40, rate_rps=5.0, seed=9, block_size_tokens=256)
    write_trace(records, expected)
    assert out.read_bytes() == expected.read_bytes()


def test_synth_models_and_mix_reach_the_generator(tmp_path: Path) -> None:
    out = tmp_path / "two.jsonl"
    args = ["trace", "synth", "--kind", "docqa", "--requests", "50", "--seed", "2"]
    result = runner.invoke(
        app, [*args, "--models", "big, small", "--mix", "3,1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    records = synthesize("docqa", requests=50, rate_rps=2.0, seed=2, models={"big": 3, "small": 1})
    expected = tmp_path / "expected.jsonl"
    write_trace(records, expected)
    assert out.read_bytes() == expected.read_bytes()
    counts = {m: sum(1 for r in records if r.model == m) for m in ("big", "small")}
    assert result.stdout.endswith(
        f"; requests per model: big {counts['big']}, small {counts['small']}\n"
    )
    stats = runner.invoke(app, ["trace", "stats", str(out)])
    assert stats.exit_code == 0, stats.output
    assert f"\nrequests per model: big {counts['big']}, small {counts['small']}\n" in stats.stdout
    equal = tmp_path / "equal.jsonl"
    result = runner.invoke(app, [*args, "--models", "x,y", "--out", str(equal)])
    assert result.exit_code == 0, result.output
    same = synthesize("docqa", requests=50, rate_rps=2.0, seed=2, models={"x": 1, "y": 1})
    assert read_trace(equal).records == same


def test_stats_of_the_bundled_trace() -> None:
    result = runner.invoke(app, ["trace", "stats"])
    assert result.exit_code == 0, result.output
    first, rest = result.stdout.split("\n", 1)
    assert first.startswith("trace: ") and first.endswith("conversation_trace.jsonl.gz")
    assert rest == BUNDLED_STATS


def test_stats_of_a_file_with_options(tmp_path: Path) -> None:
    out = tmp_path / "agent.jsonl"
    write_trace(synthesize("agent", requests=100, rate_rps=2.0, seed=0), out)
    result = runner.invoke(app, ["trace", "stats", str(out), "--lru-tokens", "20000"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"trace: {out}\n"
        "requests: 100\n"
        "time span: 45.0 s\n"
        "mean rate: 2.22 req/s\n"
        "simultaneous arrivals: 0 requests share a timestamp with an earlier one (largest run 1;"
        " `conductor trace spread` orders them in time)\n"
        "input tokens: mean 14371.9, median 13599.5, max 31869\n"
        "output tokens: mean 76.5\n"
        "unique blocks: 345\n"
        "infinite-cache hit rate: 89.4%\n"
        "LRU hit rate at 20000 tokens (39 blocks): 27.7%\n"
    )


def test_stats_reports_the_bad_line_or_skips_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": [0]}\n'
    )
    result = runner.invoke(app, ["trace", "stats", str(path)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {path}: line 2: field 'input_length': "
        "must be a positive integer (an empty prompt is invalid), got -3\n"
    )
    result = runner.invoke(app, ["trace", "stats", str(path), "--skip-invalid"])
    assert result.exit_code == 0, result.output
    assert "requests: 1\nskipped lines: 1\n" in result.stdout
    assert "mean rate: n/a\n" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--kind", "poetry"],
            "Invalid value for '--kind': must be one of chat, agent, docqa, mixed, got 'poetry'",
        ),
        (
            ["--kind", "chat", "--requests", "0"],
            "Invalid value for '--requests': must be an integer > 0, got 0",
        ),
        (
            ["--kind", "chat", "--requests", "-2"],
            "Invalid value for '--requests': must be an integer > 0, got -2",
        ),
        (
            ["--kind", "chat", "--rate", "0"],
            "Invalid value for '--rate': must be a finite number > 0, got 0.0",
        ),
        (
            ["--kind", "chat", "--rate", "-1.5"],
            "Invalid value for '--rate': must be a finite number > 0, got -1.5",
        ),
        (
            ["--kind", "chat", "--rate", "inf"],
            "Invalid value for '--rate': must be a finite number > 0, got inf",
        ),
        (
            ["--kind", "chat", "--block-size", "0"],
            "Invalid value for '--block-size': must be an integer > 0, got 0",
        ),
        (
            ["--kind", "chat", "--models", "a,a,b"],
            "Invalid value for --models: model names must be distinct, 'a' repeated in 'a,a,b'",
        ),
        (
            ["--kind", "chat", "--models", "a,,b"],
            "Invalid value for --models: model names must be non-empty, got 'a,,b'",
        ),
        (
            ["--kind", "chat", "--models", "a,b", "--mix", "0.7"],
            "Invalid value for --mix: 1 weight(s) in '0.7' for 2 model(s) in --models",
        ),
        (
            ["--kind", "chat", "--models", "a,b", "--mix", "0.7,0"],
            "Invalid value for --mix: every weight must be a finite number > 0, got '0.7,0'",
        ),
        (
            ["--kind", "chat", "--models", "a,b", "--mix", "0.7,x"],
            "Invalid value for --mix: not a list of numbers: '0.7,x'",
        ),
        (
            ["--kind", "chat", "--mix", "1"],
            "Invalid value for --mix: needs --models",
        ),
    ],
)
def test_synth_bad_values_name_option_and_value(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "never.jsonl"
    result = runner.invoke(app, ["trace", "synth", *args, "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"Error: {message}"
    assert not out.exists()


def test_stats_bad_values(tmp_path: Path) -> None:
    result = runner.invoke(app, ["trace", "stats", "--lru-tokens", "-1"])
    assert result.exit_code == 2
    assert "Invalid value for '--lru-tokens': must be an integer >= 0, got -1" in result.stderr
    missing = tmp_path / "missing.jsonl"
    result = runner.invoke(app, ["trace", "stats", str(missing)])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_spread_writes_the_library_output_and_prints_what_it_changed(tmp_path: Path) -> None:
    out = tmp_path / "spread.jsonl.gz"
    result = runner.invoke(app, ["trace", "spread", str(bundled_trace_path()), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"wrote 12031 requests to {out}: 10851 shared a timestamp with an earlier one"
        " (largest run 28), 0 still do\n"
    )
    expected = tmp_path / "expected.jsonl.gz"
    write_trace(spread_ties(read_trace(bundled_trace_path()).records, 10), expected)
    assert out.read_bytes() == expected.read_bytes()
    again = tmp_path / "again.jsonl"
    result = runner.invoke(app, ["trace", "spread", str(out), "--gap-ms", "3", "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"wrote 12031 requests to {again}: 0 shared a timestamp with an earlier one"
        " (largest run 1), 0 still do\n"
    )


def test_spread_bad_values(tmp_path: Path) -> None:
    out = tmp_path / "never.jsonl"
    result = runner.invoke(
        app, ["trace", "spread", str(bundled_trace_path()), "--gap-ms", "0", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--gap-ms': must be an integer > 0, got 0" in result.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}\n')
    result = runner.invoke(app, ["trace", "spread", str(bad), "--out", str(out)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {bad}: line 1: field 'input_length'")
    assert not out.exists()
    result = runner.invoke(
        app, ["trace", "spread", str(bundled_trace_path()), "--out", str(tmp_path / "no" / "x")]
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot write {tmp_path / 'no' / 'x'}: ")


def test_synth_unwritable_output_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "dir.jsonl"
    result = runner.invoke(
        app, ["trace", "synth", "--kind", "chat", "--requests", "5", "--out", str(out)]
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot write {out}: ")


def test_root_app_lists_the_trace_group() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "trace" in result.stdout
    result = runner.invoke(app, ["trace", "--help"])
    assert result.exit_code == 0
    assert "synth" in result.stdout and "stats" in result.stdout


def test_main_entry_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["conductor", "trace", "--help"])
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == 0
    assert "synth" in capsys.readouterr().out
