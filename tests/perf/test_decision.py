"""The decision benchmark on a small cluster: structure and sanity of the result, never
timings."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.core.policies import DEFAULT_POLICY
from conductor.perf.decision import (
    BUCKETS,
    bucket_of,
    load_trace,
    percentile,
    run_decision_bench,
    run_repeated,
    trace_requests,
    warm_events,
)

KEYS = {
    "prefill",
    "decode",
    "policy",
    "p50_us",
    "p99_us",
    "mean_us",
    "ingest_block_events_per_s",
    "requests",
}


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    return load_trace()


def test_small_run_structure_and_counts(rows) -> None:  # type: ignore[no-untyped-def]
    r = run_decision_bench(4, 4, requests=200, warmup=20, seed=3, rows=rows)
    d = r.to_json()
    assert set(d) >= KEYS
    json.dumps(d)  # serialisable
    assert (d["prefill"], d["decode"], d["policy"], d["requests"]) == (4, 4, DEFAULT_POLICY, 200)
    assert d["warmup_requests"] == 20
    assert d["build"] in ("pure", "forced-pure")  # the suite runs the sources (conftest)
    assert r.plans + r.rejections == 200 and r.rejections == 0  # admission is off
    assert 0 <= r.fetches <= r.plans

    # ingest counts are exact: one event per copy, one block event per hash in it
    events = warm_events(rows, 4, 3)
    assert r.ingest_events == len(events)
    assert r.ingest_block_events == sum(len(e.block_hashes) for e in events)
    with_blocks = sum(1 for row in rows if row.hash_ids)
    assert with_blocks <= r.ingest_events <= 2 * with_blocks
    assert r.ingest_s > 0 and r.ingest_block_events_per_s > 0
    assert r.ingest_block_events_per_s == pytest.approx(r.ingest_block_events / r.ingest_s)

    # latency figures are positive and ordered; the buckets partition the requests
    assert 0 < r.p50_us <= r.p99_us <= r.max_us
    assert r.p50_us <= r.max_us and 0 < r.mean_us <= r.max_us
    assert sum(b.count for b in r.by_blocks) == 200
    reqs = trace_requests(rows, 220)[20:]  # the timed ones follow the warm-up
    for b in r.by_blocks:
        assert b.count == sum(1 for q in reqs if bucket_of(len(q.block_hashes)) == b.bucket)
        assert 0 < b.p50_us <= b.p99_us
    order = [n for n, _ in BUCKETS]
    assert [b.bucket for b in r.by_blocks] == sorted(
        (b.bucket for b in r.by_blocks), key=order.index
    )


def test_warm_placement_is_seeded(rows) -> None:  # type: ignore[no-untyped-def]
    a = warm_events(rows[:300], 8, 1)
    assert a == warm_events(rows[:300], 8, 1)
    assert a != warm_events(rows[:300], 8, 2)
    assert {e.holder for e in a} <= {f"p{i}" for i in range(8)}


def test_requests_cycle_past_the_trace(rows) -> None:  # type: ignore[no-untyped-def]
    few = rows[:5]
    reqs = trace_requests(few, 12)
    assert [q.request_id for q in reqs] == [f"r{i}" for i in range(12)]
    assert reqs[5].block_hashes == few[0].hash_ids
    assert reqs[5].arrival_s > reqs[4].arrival_s
    r = run_decision_bench(2, 2, requests=12, warmup=0, rows=few, policy="round_robin")
    assert r.requests == 12 and r.plans == 12 and r.policy == "round_robin"


def test_repeated_runs_keep_the_median_p99(rows) -> None:  # type: ignore[no-untyped-def]
    r = run_repeated(2, 2, repeat=3, requests=60, warmup=5, rows=rows)
    assert r.repeats == 3 and len(r.p99_us_runs) == 3
    assert r.p99_us == sorted(r.p99_us_runs)[1]
    assert r.requests == 60 and r.plans == 60
    d = r.to_json()
    assert d["repeats"] == 3 and d["p99_us_runs"] == list(r.p99_us_runs)


def test_percentile_nearest_rank() -> None:
    vals = [float(i) for i in range(1, 101)]
    assert percentile(vals, 50) == 50.0
    assert percentile(vals, 99) == 99.0
    assert percentile(vals, 100) == 100.0
    assert percentile([], 50) == 0.0
    assert math.isclose(percentile([7.0], 99), 7.0)


def test_cli_writes_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "decision",
            "--prefill",
            "2",
            "--decode",
            "2",
            "--requests",
            "50",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "block events/s" in res.output
    d = json.loads(out.read_text())
    assert set(d) >= KEYS and d["requests"] == 50 and d["prefill"] == 2


def test_the_hand_off_is_reported_and_a_bad_one_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "r.json"
    base = ["bench", "decision", "--prefill", "2", "--decode", "2", "--requests", "50"]
    res = CliRunner().invoke(app, [*base, "--handoff", "load", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["handoff"] == "load"
    bad = CliRunner().invoke(app, [*base, "--handoff", "pigeon"])
    assert bad.exit_code == 2
    assert "--handoff" in bad.output and "pigeon" in bad.output
