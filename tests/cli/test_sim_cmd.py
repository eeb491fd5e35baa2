"""``conductor simulate | compare | capacity`` through Typer's test runner (small inputs)."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_replica_options_are_named() -> None:
    r = runner.invoke(app, ["simulate", "--replicas", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("error: invalid --replicas=0: must be >= 1")
    r = runner.invoke(app, ["simulate", "--sync-delay-ms", "-1"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --sync-delay-ms=-1.0: must be >= 0")
