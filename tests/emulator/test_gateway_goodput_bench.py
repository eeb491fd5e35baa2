"""bench/gateway_goodput.py end to end on the smallest cluster: real ``conductor serve`` in
front of two emulated engines (one prefill, one decode), a generated workload replayed
through it, and the simulator's prediction beside it. What is checked is what must hold on
any machine: every request answered, none rejected, the JSON's fields; not the timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gateway_goodput.py"

pytestmark = pytest.mark.slow


def test_two_policies_through_the_gateway_beside_the_simulator(tmp_path: Path) -> None:
    out = tmp_path / "goodput.json"
    args = ["--requests", "4", "--prefill", "1", "--decode", "1", "--speed", "4"]
    args += ["--prefill-cache-tokens", "200000"]  # the prefill engine's KV and prefix cache
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            *args,
            "--policies",
            "conductor,round_robin",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = ["goodput", "att.", "rej.", "TTFT", "s"]
    assert lines[1].split() == ["policy", *header, *header]
    assert [line.split()[0] for line in lines[2:10:4]] == ["conductor", "round_robin"]
    assert all("decode engines' steps handed out" in line for line in lines[3:11:4])
    assert all("prefix hit rate of the prefill engines" in line for line in lines[4:12:4])
    assert all("mean TBT as the gateway relayed it" in line for line in lines[5:13:4])
    result = json.loads(out.read_text())
    assert result["workload"] == {
        "kind": "agent", "requests": 4, "rate_rps": 2.5, "seed": 19, "speed": 4.0,
        "tie_gap_ms": 10,
    }  # fmt: skip
    assert result["cluster"]["prefill"] == 1 and result["cluster"]["decode"] == 1
    assert result["cluster"]["prefill_cache_tokens"] == 200_000
    for policy in ("conductor", "round_robin"):
        real = result["policies"][policy]["gateway"]
        sim = result["policies"][policy]["sim"]
        assert (real["requests"], real["completed"], real["rejected"]) == (4, 4, 0)
        assert (sim["requests"], sim["completed"], sim["rejected"]) == (4, 4, 0)
        assert real["policy"] == policy and sim["policy"] == policy
        engines = real["engines"]
        assert set(engines) == {"prefill", "decode"}
        for role in engines.values():
            assert role["steps"] > 0 and role["late_ms_per_step"] >= 0.0
            assert 0.0 <= role["prefix_hit_rate"] <= 1.0
        relay = real["relay"]  # every answer streamed more than one token: 4 observed
        assert relay["streams"] == 4 and relay["tbt_mean_ms"] > 0.0
        assert relay["client_tbt_mean_ms"] == round(real["tbt_ms"]["mean"], 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decode", "0"], "error: --decode must be >= 1, got 0"),
        (["--both", "-1"], "error: --both must be >= 0, got -1"),
        (["--both", "2", "--decode", "0"], "--prefill and --decode go together, got 4 and 0"),
        (["--policies", ","], "error: --policies names no policy: ','"),
        (["--policies", "conductor,bogus"], "got 'bogus'"),
        (["--prefill-cache-tokens", "8"], "error: --prefill-cache-tokens must be >= 32, got 8"),
    ],
)
def test_bad_values_are_named(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(message)
