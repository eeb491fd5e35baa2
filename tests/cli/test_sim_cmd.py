"""``conductor simulate | compare | capacity`` through Typer's test runner (small inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.workload.synth import synthesize
from conductor.workload.trace import write_trace

runner = CliRunner()


def _trace(tmp_path: Path, n: int = 60) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(synthesize("chat", requests=n, rate_rps=2.0, seed=3), path)
    return path


def test_simulate_writes_the_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(_trace(tmp_path)), "--prefill", "2", "--decode", "2"]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for key in (
        "policy",
        "admission",
        "requests",
        "completed",
        "rejected",
        "rejected_after_prefill",
        "ttft_s",
        "tbt_ms",
        "slo_attainment",
        "goodput_rps",
        "cache_hit_rate",
        "prefill_compute_s",
        "preemptions",
        "sim_wall_s",
    ):
        assert key in data, key
    assert data["policy"] == "conductor" and data["admission"] == "early"
    assert data["requests"] == 60
    assert set(data["ttft_s"]) == {"mean", "p50", "p90", "p99"}


def test_same_seed_gives_identical_json_but_for_wall_time(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    outs = []
    for i in range(2):
        out = tmp_path / f"c{i}.json"
        result = runner.invoke(
            app,
            [
                "compare",
                "--trace",
                str(trace),
                "--policies",
                "random,mooncake",
                "--seed",
                "5",
                "--prefill",
                "2",
                "--decode",
                "1",
                "--json",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        for d in data:
            d.pop("sim_wall_s")
        outs.append(json.dumps(data))
    assert outs[0] == outs[1]
    assert [d["policy"] for d in json.loads(outs[0])] == ["random", "mooncake"]


def test_compare_plot_and_admissions(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    result = runner.invoke(
        app,
        [
            "compare",
            "--trace",
            str(_trace(tmp_path)),
            "--policies",
            "mooncake",
            "--admissions",
            "off,early",
            "--prefill",
            "2",
            "--decode",
            "1",
            "--plot",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mooncake (early)" in result.stdout


def test_bad_trace_line_names_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1, "input_length": -3, "output_length": 5, "hash_ids": [1]}\n'
    )
    result = runner.invoke(app, ["simulate", "--trace", str(bad)])
    assert result.exit_code == 2
    assert "line 2" in result.output and "input_length" in result.output
    ok = runner.invoke(app, ["simulate", "--trace", str(bad), "--skip-invalid", "--prefill", "1"])
    assert ok.exit_code == 0, ok.output
    assert "skipped 1 invalid line(s)" in ok.output


def test_bad_options_are_named() -> None:
    r = runner.invoke(app, ["simulate", "--policy", "nope"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --policy='nope': unknown policy; known: ")
    r = runner.invoke(app, ["simulate", "--speed", "0"])
    assert r.exit_code == 2 and "--speed" in r.output
    r = runner.invoke(app, ["compare", "--policies", "mooncake,zzz"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --policies='zzz': unknown policy; known: ")
    r = runner.invoke(app, ["simulate", "--preset", "gpt5"])
    assert r.exit_code == 2 and "--preset" in r.output
    r = runner.invoke(app, ["simulate", "--prefill", "0"])
    assert r.exit_code == 2 and "--prefill" in r.output
    r = runner.invoke(app, ["simulate", "--trace", "/nonexistent/x.jsonl"])
    assert r.exit_code == 2 and "no such file" in r.output
    for flag, value in (
        ("--kv-block-tokens", "0"),
        ("--max-num-batched-tokens", "0"),
        ("--max-num-seqs", "0"),
        ("--long-prefill-tokens", "-1"),
        ("--both", "-1"),
    ):
        r = runner.invoke(app, ["simulate", flag, value])
        assert r.exit_code == 2, flag
        assert r.stderr.startswith(f"error: invalid {flag}={value}: must be >= "), r.stderr


def test_both_role_instances_and_engine_flags(tmp_path: Path) -> None:
    """Two role=both instances and nothing else; small engine steps and KV blocks."""
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(_trace(tmp_path)), "--prefill", "0", "--decode", "0"]
    args += ["--both", "2", "--max-num-batched-tokens", "1024", "--kv-block-tokens", "32"]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 60 and data["completed"] + data["rejected"] == 60
    assert "preemptions: 0" in result.output


def test_capacity_finds_a_speed(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    result = runner.invoke(
        app,
        [
            "capacity",
            "--trace",
            str(_trace(tmp_path, 40)),
            "--policies",
            "mooncake",
            "--tbt-slos-ms",
            "100",
            "--prefill",
            "1",
            "--decode",
            "1",
            "--bisect-steps",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data[0]["policy"] == "mooncake"
    point = data[0]["tbt_100ms"]
    assert point["speed"] > 0 and point["attainment"] >= 0.9


def test_compare_runs_every_policy_on_equal_footing_plus_a_labelled_bundle(
    tmp_path: Path,
) -> None:
    out = tmp_path / "c.json"
    args = ["compare", "--trace", str(_trace(tmp_path)), "--prefill", "2", "--decode", "1"]
    result = runner.invoke(app, [*args, "--policies", "mooncake,conductor", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["policy"], r["admission"], r["cpp"], r["bundle"]) for r in rows] == [
        ("mooncake", "early", False, False),
        ("conductor", "early", False, False),
        ("conductor", "early", True, True),
    ]
    assert "conductor (own bundle: early+cpp)" in result.stdout
    for r in rows:
        assert set(r["rejected_by_prompt"]) == {"<=32k", "32k-64k", ">64k"}
        assert r["goodput_tokens_per_s"] >= 0 and r["prefill_compute_s"] > 0
        assert r["max_tokens"] == "none" and r["oracle_lengths"] is False
    off = runner.invoke(app, [*args, "--policies", "mooncake", "--admission", "off", "--no-bundle"])
    assert off.exit_code == 0, off.output
    assert "mooncake " in off.stdout and "bundle" not in off.stdout


def test_max_tokens_and_oracle_lengths(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    base = ["simulate", "--trace", trace, "--prefill", "2", "--decode", "1", "--json"]
    summaries = {}
    for extra in ([], ["--max-tokens", "trace"], ["--max-tokens", "cap:8"], ["--oracle-lengths"]):
        out = tmp_path / f"s{len(summaries)}.json"
        result = runner.invoke(app, [*base, str(out), *extra])
        assert result.exit_code == 0, result.output
        summaries[" ".join(extra)] = json.loads(out.read_text())
    assert summaries[""]["max_tokens"] == "none"
    assert summaries["--max-tokens cap:8"]["max_tokens"] == "cap:8"
    assert summaries["--oracle-lengths"]["oracle_lengths"] is True
    # cap:8 generates at most 8 tokens: fewer tokens of good requests than uncapped
    capped = summaries["--max-tokens cap:8"]["goodput_tokens_per_s"]
    assert capped < summaries["--max-tokens trace"]["goodput_tokens_per_s"]


@pytest.mark.parametrize("value", ["cap:0", "cap:x", "foo"])
def test_bad_max_tokens_is_named(value: str) -> None:
    for cmd in ("simulate", "compare", "capacity"):
        r = runner.invoke(app, [cmd, "--max-tokens", value])
        assert r.exit_code == 2, (cmd, r.output)
        assert r.stderr.startswith(f"error: invalid --max-tokens='{value}': "), r.stderr


def test_cost_error_bias_and_correction_reach_the_simulation(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    base = ["simulate", "--trace", trace, "--prefill", "2", "--decode", "2", "--policy", "mooncake"]
    runs = {}
    for name, extra in {
        "exact": [],
        "slow": ["--cost-bias", "0.5"],
        "slow-uncorrected": ["--cost-bias", "0.5", "--no-correction"],
        "noisy": ["--cost-error", "0.3"],
    }.items():
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(out.read_text())
    assert runs["slow"]["cost_bias"] == 0.5 and runs["noisy"]["cost_error"] == 0.3
    assert runs["slow-uncorrected"]["cost_correction"] is False
    slow, exact = runs["slow"]["prefill_compute_s"], runs["exact"]["prefill_compute_s"]
    # 1.5x to within 1%: the engines batch and chunk prefills by timing, so a slower engine
    # forms its steps differently (the fixed per-pass part is paid per step)
    assert slow == pytest.approx(1.5 * exact, rel=0.01)
    assert runs["noisy"]["prefill_compute_s"] != runs["exact"]["prefill_compute_s"]
    assert runs["slow"]["ttft_s"]["mean"] > runs["exact"]["ttft_s"]["mean"]


def test_replica_options_are_named() -> None:
    r = runner.invoke(app, ["simulate", "--replicas", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("error: invalid --replicas=0: must be >= 1")
    r = runner.invoke(app, ["simulate", "--sync-delay-ms", "-1"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --sync-delay-ms=-1.0: must be >= 0")
