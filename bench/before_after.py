"""Before/after: the project's benchmarks on two source trees, alternating, in one run.

    git worktree add /tmp/before <old-commit>
    .venv/bin/python bench/before_after.py --before /tmp/before [--rounds 3] [--json out.json]

Each round runs every benchmark once on the ``--before`` tree and once on this tree (the order
flips every round, so drift on a shared machine hits both sides alike). Each tree runs its own
``bench/`` scripts against its own ``src/`` (``PYTHONPATH``), with this interpreter. Printed:
the median of each figure per side and the after/before ratio; ``--json`` keeps every run.

Benchmarks and the figures kept (lower is better for all of them):

- ``conductor bench decision`` at 16+16 (policy ``--policy``): p50 and p99 of ``schedule()``;
- ``bench/sim_speed.py``: wall seconds of the full conversation trace at 8+8;
- ``bench/hot_paths.py``: tokenizing a prompt (fast BPE) and decoding a KV-event batch (typed);
- ``bench/gateway_load.py --paired`` (concurrency 1): the gateway's added TTFT and E2E p50,
  and its CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

Figures = dict[str, float]


def _run(tree: Path, args: list[str], out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONUNBUFFERED="1")
    subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if not out.exists():
        raise RuntimeError(f"{args} wrote no {out}")


def _load(path: Path) -> object:
    return json.loads(path.read_text())


def decision(tree: Path, tmp: Path, policy: str) -> Figures:
    out = tmp / "decision.json"
    _run(
        tree,
        ["-m", "conductor.cli.main", "bench", "decision", "--policy", policy, "--json", str(out)],
        out,
    )
    d = _load(out)
    assert isinstance(d, dict)
    return {"decision_p50_us": float(d["p50_us"]), "decision_p99_us": float(d["p99_us"])}


def sim_speed(tree: Path, tmp: Path, policy: str) -> Figures:
    out = tmp / "sim.json"
    _run(tree, ["bench/sim_speed.py", "--policy", policy, "--json", str(out)], out)
    rows = _load(out)
    assert isinstance(rows, list)
    full = [
        r
        for r in rows
        if r["instances_each_side"] == 8 and r["requests"] == max(x["requests"] for x in rows)
    ]
    return {"sim_full_trace_8x8_s": float(full[0]["wall_s"])}


def hot_paths(tree: Path, tmp: Path, policy: str) -> Figures:
    out = tmp / "hot.json"
    _run(tree, ["bench/hot_paths.py", "--n", "1000", "--json", str(out)], out)
    d = _load(out)
    assert isinstance(d, dict)
    return {
        "tokenize_fast_bpe_us": float(d["tokenize_us"]["fast_bpe"]),
        "kv_batch_decode_typed_us": float(d["kv_batch_decode_us"]["typed (decode_payload)"]),
    }


def gateway(tree: Path, tmp: Path, policy: str) -> Figures:
    out = tmp / "gateway.json"
    args = ["bench/gateway_load.py", "--paired", "--requests", "1000", "--concurrency", "1"]
    _run(tree, [*args, "--json", str(out)], out)
    d = _load(out)
    assert isinstance(d, dict)
    added = d["added_latency_ms"]
    return {
        "gateway_added_ttft_p50_ms": float(added["ttft_p50_ms"]),
        "gateway_added_e2e_p50_ms": float(added["e2e_p50_ms"]),
        "gateway_cpu_ms_per_request": float(d["gateway"]["gateway_cpu_ms_per_request"]),
    }


BENCHES: dict[str, Callable[[Path, Path, str], Figures]] = {
    "decision": decision,
    "sim_speed": sim_speed,
    "hot_paths": hot_paths,
    "gateway": gateway,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the older source tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policy", default="mooncake", help="policy of the decision/sim benches")
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="a subset of benches")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    if not (a.before / "src" / "conductor").is_dir():
        ap.error(f"--before {a.before} holds no src/conductor")
    trees = {"before": a.before.resolve(), "after": HERE}
    runs: dict[str, list[Figures]] = {"before": [], "after": []}
    names = a.only or list(BENCHES)
    for r in range(a.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for side in order:
            figures: Figures = {}
            for name in names:
                with tempfile.TemporaryDirectory() as tmp:
                    figures |= BENCHES[name](trees[side], Path(tmp), a.policy)
            runs[side].append(figures)
            print(f"round {r + 1} {side}: {json.dumps(figures)}", flush=True)
    keys = list(runs["after"][0])
    medians = {s: {k: statistics.median(f[k] for f in runs[s]) for k in keys} for s in runs}
    print(
        f"\n{'figure (median of ' + str(a.rounds) + ')':<34}{'before':>10}{'after':>10}{'ratio':>8}"
    )
    for k in keys:
        b, f = medians["before"][k], medians["after"][k]
        print(f"{k:<34}{b:>10.3f}{f:>10.3f}{f / b if b else float('nan'):>8.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {"trees": {k: str(v) for k, v in trees.items()}, "runs": runs, "medians": medians},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
