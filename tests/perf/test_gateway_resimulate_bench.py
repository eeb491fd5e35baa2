"""bench/gateway_resimulate.py: a saved gateway run simulated again on its regenerated trace
(the same trace and settings bench/gateway_goodput.py simulated), the errors against the
gateway's figures, and bad input named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gateway_resimulate.py"


def _saved(path: Path, gateway_goodput: float, with_both: bool = True) -> Path:
    """A saved run as bench/gateway_goodput.py writes it (the fields re-simulation reads)."""
    cluster: dict[str, Any] = {"prefill": 1, "decode": 1, "preset": "llama3-70b-a800x8"}
    cluster["block_tokens"] = 32
    if with_both:
        cluster |= {"both": 0, "prefill_cache_tokens": None}
    stats = {"goodput_rps": gateway_goodput, "ttft_s": {"mean": 2.0}, "tbt_ms": {"mean": 50.0}}
    run = {
        "workload": {
            "kind": "agent",
            "requests": 6,
            "rate_rps": 2.5,
            "seed": 19,
            "speed": 4.0,
            "tie_gap_ms": 10,
        },
        "cluster": cluster,
        "policies": {
            p: {
                "gateway": {**stats, "engines": {"prefill": {"prefix_hit_rate": 0.5}}},
                "sim": {**stats, "cache_hit_rate": 0.5},
            }
            for p in ("conductor", "round_robin")
        },
    }
    path.write_text(json.dumps(run))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_simulates_the_saved_runs_trace_again(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    import gateway_goodput as gg
    import gateway_resimulate as gr

    saved = _saved(tmp_path / "run.json", 1.0, with_both=False)  # saved before --both existed
    out = tmp_path / "resim.json"
    done = _run(str(saved), "--policies", "round_robin", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["rows"]) == ["run.json:round_robin"]
    row = result["rows"]["run.json:round_robin"]
    # what bench/gateway_goodput.py would simulate for this run, computed here
    trace = gr.trace_of(gr.load_run(saved), tmp_path)
    opts = type(
        "Opts",
        (),
        {
            "preset": "llama3-70b-a800x8",
            "prefill": 1,
            "decode": 1,
            "both": 0,
            "prefill_cache_tokens": None,
        },
    )()
    expected = gg.simulated(trace, 4.0, "round_robin", opts)
    for key in ("goodput_rps", "completed", "rejected", "ttft_s", "cache_hit_rate"):
        assert row["sim"][key] == expected[key]
    assert row["sim"]["requests"] == 6
    assert row["gateway"]["goodput_rps"] == 1.0
    errors = result["mean_abs_error"]
    assert errors["goodput"] == pytest.approx(abs(expected["goodput_rps"] - 1.0))
    assert errors["hit_points"] == pytest.approx(abs(expected["cache_hit_rate"] - 0.5))
    lines = done.stdout.splitlines()
    assert lines[2].split()[:2] == ["run.json", "round_robin"]
    assert lines[3].startswith("over 1 rows, the simulation now against the gateway")


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        ("notjson", [], "not a readable JSON file"),
        ("list", [], "not a gateway_goodput run (a JSON object)"),
        ("nosim", [], "policies.conductor has no gateway and sim figures"),
        ("nokind", [], "no workload.kind (not a gateway_goodput run?)"),
        ("blocks", [], "cluster.block_tokens is 16, this bench's engines use 32"),
        (None, ["--policies", "bogus"], "no saved policy matched --policies"),
        (None, ["--policies", ","], "--policies names no policy: ','"),
    ],
)
def test_bad_input_is_named(
    tmp_path: Path, edit: str | None, args: list[str], message: str
) -> None:
    saved = _saved(tmp_path / "run.json", 1.0)
    run = json.loads(saved.read_text())
    if edit == "notjson":
        saved.write_text("{")
    elif edit == "list":
        saved.write_text("[]")
    elif edit == "nosim":
        del run["policies"]["conductor"]["sim"]
        saved.write_text(json.dumps(run))
    elif edit == "nokind":
        del run["workload"]["kind"]
        saved.write_text(json.dumps(run))
    elif edit == "blocks":
        run["cluster"]["block_tokens"] = 16
        saved.write_text(json.dumps(run))
    done = _run(str(saved), *args)
    assert done.returncode == 2 if edit is None else done.returncode == 1
    assert message in done.stderr
