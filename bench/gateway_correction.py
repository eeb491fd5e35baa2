"""Does the gateway learn how slow its engines are? Its predicted TTFT against the observed
one, over a run of requests, with engines slower than the cost model it predicts with.

    python bench/gateway_correction.py [--slowdown 2] [--requests 40] [--json OUT]

Starts two emulated engines (role both) that run the default preset's times ``--slowdown``
times slower (``conductor emulate --speedup 1/S``) and ``conductor serve`` in front of them
with the preset itself, then sends ``--requests`` streaming completions one at a time, each a
new ~1,500-token prompt (nothing cached), and reads, after each, the gateway's
``conductor_predicted_ttft_seconds`` and ``conductor_observed_ttft_seconds`` sums from
``/metrics``. Prints, per window of requests, mean predicted and observed TTFT and their
ratio; the gateway's online correction (``PrefillFinished.duration_s`` from
``gateway/prefill_times.py``) should bring the ratio from ~1/S towards 1. Figures only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen.cluster import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    conductor_cmd,
    engines,
    find_serve,
    free_ports,
    gateway_args,
    make_tokenizer_dir,
    start,
    stop,
    wait_ready,
)
from loadgen.spec import MODEL


def sums(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of histogram ``name`` over all its label sets."""
    total = count = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}_(sum|count)(\{{.*\}})? ([0-9.e+-]+)$", line)
        if m:
            if m.group(1) == "sum":
                total += float(m.group(3))
            else:
                count += float(m.group(3))
    return total, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()
    if not args.slowdown > 0:
        ap.error(f"--slowdown must be > 0, got {args.slowdown}")
    for name in ("requests", "window"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    log_dir = Path(tempfile.mkdtemp(prefix="gw-correction-"))
    model_path = make_tokenizer_dir(log_dir / "tokenizer")
    emu = ["--speedup", str(1.0 / args.slowdown), "--block-size", str(BLOCK_SIZE)]
    emu += ["--max-model-len", str(MAX_MODEL_LEN), "--model-path", str(model_path)]
    serve, why = find_serve(conductor_cmd())
    if serve is None:
        raise SystemExit(why)
    rows = []
    with engines(2, log_dir, emu) as eng:
        (port,) = free_ports(1)
        url = f"http://127.0.0.1:{port}"
        cmd = gateway_args(
            serve, eng, port, "conductor", model_path=model_path,
            max_model_len=MAX_MODEL_LEN, extra=[],
        )  # fmt: skip
        gw = start("gateway", cmd, url, log_dir)
        try:
            wait_ready(gw, 120, paths=("/health", "/v1/models"))
            with httpx.Client(base_url=url, timeout=120) as client:
                last = (0.0, 0.0, 0.0, 0.0)
                window: list[tuple[float, float]] = []
                for i in range(args.requests):
                    words = " ".join(f"w{i}x{j}" for j in range(500))  # a new prompt each time
                    body = {"model": MODEL, "prompt": words, "max_tokens": 2, "stream": True}
                    with client.stream("POST", "/v1/completions", json=body) as resp:
                        resp.read()
                    time.sleep(0.05)
                    text = client.get("/metrics").text
                    ps, pc = sums(text, "conductor_predicted_ttft_seconds")
                    os_, oc = sums(text, "conductor_observed_ttft_seconds")
                    if pc > last[1] and oc > last[3]:
                        window.append((ps - last[0], os_ - last[2]))
                    last = (ps, pc, os_, oc)
                    if len(window) == args.window:
                        p = sum(w[0] for w in window) / len(window)
                        o = sum(w[1] for w in window) / len(window)
                        row = {"requests": i + 1, "predicted_ttft_s": p, "observed_ttft_s": o,
                               "ratio": p / o if o > 0 else None}  # fmt: skip
                        rows.append(row)
                        print(f"requests {i + 1 - len(window) + 1:>3}-{i + 1:<3} predicted "
                              f"{p:.3f} s observed {o:.3f} s ratio {row['ratio']:.3f}",
                              flush=True)  # fmt: skip
                        window = []
        finally:
            stop(gw)
    out = {"config": vars(args) | {"json_path": None}, "windows": rows}
    if args.json_path:
        args.json_path.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
