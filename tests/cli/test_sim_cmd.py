"""``conductor simulate | compare | capacity`` through Typer's test runner (small inputs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.workload.synth import synthesize
from conductor.workload.trace import read_trace, split_by_model, write_trace

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


def test_no_kv_fetch_reaches_the_simulation(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path, n=120))
    base = ["simulate", "--trace", trace, "--prefill", "2", "--decode", "2", "--policy", "mooncake"]
    runs = {}
    for name, extra in {"fetch": [], "local": ["--no-kv-fetch"]}.items():
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, [*base, "--speed", "4", *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(out.read_text())
    assert runs["fetch"]["kv_fetch"] is True and runs["local"]["kv_fetch"] is False
    assert runs["fetch"]["fetched_tokens"] > 0
    assert runs["local"]["fetched_tokens"] == 0


def test_prefill_lanes_reach_the_simulation_and_its_json(tmp_path: Path) -> None:
    """``--prefill-lanes engine`` tells the scheduler what the engines do (8192 // 4096 = 2
    by default), the JSON says so; 1 by default; a word is an error naming the option."""
    trace = str(_trace(tmp_path, n=60))
    base = ["simulate", "--trace", trace, "--prefill", "2", "--decode", "2"]
    lanes = {}
    for name, extra in {"default": [], "engine": ["--prefill-lanes", "engine"]}.items():
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        lanes[name] = json.loads(out.read_text())["prefill_lanes"]
    assert lanes == {"default": 1, "engine": 2}
    r = runner.invoke(app, [*base, "--prefill-lanes", "two"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --prefill-lanes='two': must be a count >= 1")


def test_replica_options_are_named() -> None:
    r = runner.invoke(app, ["simulate", "--replicas", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("error: invalid --replicas=0: must be >= 1")
    r = runner.invoke(app, ["simulate", "--sync-delay-ms", "-1"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: invalid --sync-delay-ms=-1.0: must be >= 0")


# --- Several models ----------------------------------------------------------------------------


def _mixed(tmp_path: Path, n: int = 60) -> tuple[Path, dict[str, Path]]:
    """A chat trace for models a (0.7) and b (0.3), and each model's sub-trace alone."""
    records = synthesize("chat", requests=n, rate_rps=3.0, seed=4, models={"a": 0.7, "b": 0.3})
    path = tmp_path / "mixed.jsonl"
    write_trace(records, path)
    subs = {}
    for model, part in split_by_model(records).items():
        subs[model] = tmp_path / f"{model}.jsonl"
        write_trace(part, subs[model])
    return path, subs


def _json(args: list[str], out: Path) -> Any:
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for summary in data if isinstance(data, list) else [data]:
        summary.pop("sim_wall_s", None)
        for part in summary.get("per_model", {}).values():
            part.pop("sim_wall_s")
    return data


def test_simulate_over_two_pools_equals_each_sub_trace_alone(tmp_path: Path) -> None:
    mixed, subs = _mixed(tmp_path)
    pools = ["--pool", "a=2P+1D", "--pool", "b=1P+1D"]
    pooled = _json(["simulate", "--trace", str(mixed), *pools], tmp_path / "p.json")
    alone = {
        "a": _json(["simulate", "--trace", str(subs["a"]), "--prefill", "2", "--decode", "1"],
                   tmp_path / "a.json"),
        "b": _json(["simulate", "--trace", str(subs["b"]), "--prefill", "1", "--decode", "1"],
                   tmp_path / "b.json"),
    }  # fmt: skip
    assert pooled["per_model"] == alone
    assert pooled["pools"] == {"a": "2P+1D", "b": "1P+1D"}
    assert (alone["a"]["requests"], alone["b"]["requests"], pooled["requests"]) == (42, 18, 60)
    for key in ("completed", "rejected", "rejected_after_prefill", "preemptions"):
        assert pooled[key] == alone["a"][key] + alone["b"][key], key
    assert pooled["max_tokens"] == "none" and pooled["policy"] == "conductor"
    # goodput over the whole trace's span; each pool's over its own sub-trace's
    records = read_trace(mixed).records
    span = (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000
    good = round(pooled["slo_attainment"] * 60)
    assert pooled["goodput_rps"] == round(good / span, 6)
    shown = runner.invoke(app, ["simulate", "--trace", str(mixed), *pools])
    assert shown.exit_code == 0, shown.output
    assert "│   a (2P+1D) " in shown.stdout and "│   b (1P+1D) " in shown.stdout


def test_several_models_split_the_cluster_equally_by_name(tmp_path: Path) -> None:
    mixed, _ = _mixed(tmp_path)
    args = ["simulate", "--trace", str(mixed), "--prefill", "3", "--decode", "2", "--both", "1"]
    data = _json(args, tmp_path / "s.json")
    assert data["pools"] == {"a": "2P+1D+1B", "b": "1P+1D"}
    given = ["simulate", "--trace", str(mixed), "--pool", "a=2P+1D+1B", "--pool", "b=1P+1D"]
    assert _json(given, tmp_path / "g.json") == data


def test_compare_and_capacity_report_every_model(tmp_path: Path) -> None:
    mixed, _ = _mixed(tmp_path, 40)
    pools = ["--pool", "a=1P+1D", "--pool", "b=1P+1D"]
    md = tmp_path / "c.md"
    args = ["compare", "--trace", str(mixed), *pools, "--policies", "mooncake", "--no-bundle"]
    rows = _json([*args, "--markdown", str(md)], tmp_path / "c.json")
    assert [set(r["per_model"]) for r in rows] == [{"a", "b"}]
    for part in rows[0]["per_model"].values():
        assert (part["bundle"], part["max_tokens"], part["policy"]) == (False, "none", "mooncake")
    lines = md.read_text().splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| mooncake (early)",
        "|   a (1P+1D)",
        "|   b (1P+1D)",
    ]
    cap = ["capacity", "--trace", str(mixed), *pools, "--policies", "mooncake"]
    cap += ["--tbt-slos-ms", "100", "--bisect-steps", "1", "--ttft-slo-s", "2"]
    (row,) = _json(cap, tmp_path / "cap.json")
    assert row["pools"] == {"a": "1P+1D", "b": "1P+1D"}
    cell = row["tbt_100ms"]
    assert set(cell["per_model"]) == {"a", "b"} and cell["attainment"] >= 0.9
    assert cell["rps"] == round(cell["speed"] * 40 / _span_s(mixed), 4)


def _span_s(path: Path) -> float:
    records = read_trace(path).records
    return (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000


def test_load_plot_is_one_png_per_pool(tmp_path: Path) -> None:
    mixed, _ = _mixed(tmp_path, 30)
    png = tmp_path / "load.png"
    args = ["simulate", "--trace", str(mixed), "--prefill", "2", "--decode", "2"]
    result = runner.invoke(app, [*args, "--load-plot", str(png)])
    assert result.exit_code == 0, result.output
    for model in ("a", "b"):
        assert (tmp_path / f"load.{model}.png").read_bytes()[:4] == b"\x89PNG"
    assert not png.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--pool", "a=2P+2D"],
            "error: the trace names model 'b' but no --pool gives it one (pools: a);"
            " add --pool b=SHAPE\n",
        ),
        (
            ["--pool", "a=1P+1D", "--pool", "b=1P+1D", "--pool", "c=1B"],
            "error: invalid --pool='c=1B': the trace has no request for model 'c'"
            " (its models: a, b)\n",
        ),
        (
            ["--pool", "a=1P+1D", "--pool", "b=1P+1D", "--decode", "3"],
            "error: invalid --decode=3: not used with --pool (each --pool sizes its model's"
            " pool)\n",
        ),
        (
            ["--pool", "a=1P+1D", "--pool", "a=2P+2D"],
            "error: invalid --pool='a=2P+2D': model 'a' has two pools\n",
        ),
        (
            ["--pool", "a=1Q"],
            "error: invalid --pool='a=1Q': must be like 4P+4D or 2P+2D+1B (counts of prefill,"
            " decode, both instances)\n",
        ),
        (["--pool", "4P+4D"], "error: invalid --pool='4P+4D': must be MODEL=SHAPE, e.g. a=4P+4D\n"),
        (
            ["--prefill", "1", "--decode", "3"],
            "error: 1P+3D split over 2 models leaves 'b' with 1D, which needs an instance that"
            " prefills (P or B) and one that decodes (D or B); size each pool with --pool"
            " MODEL=SHAPE\n",
        ),
    ],
)
def test_pool_errors_are_named(tmp_path: Path, extra: list[str], message: str) -> None:
    mixed, _ = _mixed(tmp_path, 20)
    for command in ("simulate", "compare", "capacity"):
        r = runner.invoke(app, [command, "--trace", str(mixed), *extra])
        assert r.exit_code == 2, (command, r.output)
        assert r.stderr == message, command


def test_one_model_is_one_cluster_unless_pooled(tmp_path: Path) -> None:
    plain, named = tmp_path / "plain.jsonl", tmp_path / "named.jsonl"
    write_trace(synthesize("chat", requests=30, rate_rps=2.0, seed=3), plain)
    write_trace(synthesize("chat", requests=30, rate_rps=2.0, seed=3, models={"m": 1}), named)
    cluster = ["--prefill", "2", "--decode", "1"]
    base = _json(["simulate", "--trace", str(plain), *cluster], tmp_path / "p.json")
    assert "per_model" not in base
    assert _json(["simulate", "--trace", str(named), *cluster], tmp_path / "n.json") == base
    pooled = ["simulate", "--trace", str(plain), "--pool", "default=2P+1D"]
    data = _json(pooled, tmp_path / "d.json")
    assert data["per_model"] == {"default": base} and data["pools"] == {"default": "2P+1D"}
    assert {k: v for k, v in data.items() if k not in ("per_model", "pools")} == base
