"""Soak: ``conductor serve`` before two emulated engines under steady streamed load mixed
with hostile requests, for a bounded time; reports the gateway's RSS and open fds over time
and their growth per hour (least-squares slope after a warm-up, and once the prefix index
has filled: it grows, bounded, until the engines' caches are full).

The cluster is the reliability suite's (tests/reliability/cluster.py: the tiny-cpu cost
model, tight limits). The hostile mix, every ``--hostile-every-s``: 120 duplicate headers
(431), a 200-deep JSON body (400), a client template (400), a slowloris head (408 at the
head deadline), a connection that sends nothing (closed when idle).

Run: ``.venv/bin/python bench/soak.py [--minutes 5] [--concurrency 4] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.reliability.cluster import MODEL, cluster, make_model_dir  # noqa: E402
from tests.reliability.load import one  # noqa: E402
from tests.reliability.rawhttp import address, send  # noqa: E402

MAX_MINUTES = 120.0


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t_s, value)`` points, per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mt) * (v - mv) for t, v in points)
    return cov / var * 3600.0


def indexed_blocks(url: str) -> float:
    """The prefix index's size over all engines (it grows until the engines' caches fill)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("conductor_engine_indexed_blocks{")
    )


def hostile_round(url: str, counts: Counter[str]) -> None:
    cases = {
        "dup_headers": b"GET /health HTTP/1.1\r\nHost: s\r\n" + b"X-D: 1\r\n" * 120 + b"\r\n",
        "deep_json": b"POST /v1/completions HTTP/1.1\r\nHost: s\r\nContent-Length: 400\r\n\r\n"
        + b"[" * 200
        + b"]" * 200,
    }
    template = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": {"chat_template": "{{ 1 }}"},
        }
    ).encode()
    cases["client_template"] = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nContent-Length: %d\r\n\r\n%b"
        % (len(template), template)
    )
    for name, raw in cases.items():
        try:
            counts[f"{name}:{send(url, raw).status}"] += 1
        except OSError as exc:
            counts[f"{name}:{type(exc).__name__}"] += 1

    def slow(partial: bytes, name: str) -> None:
        try:
            with socket.create_connection(address(url), timeout=15) as s:
                s.sendall(partial)
                data = s.recv(4096)
                counts[f"{name}:{data[9:12].decode() or 'closed'}"] += 1
        except OSError as exc:
            counts[f"{name}:{type(exc).__name__}"] += 1

    threading.Thread(target=slow, args=(b"GET /health HTTP/1.1\r\nHost", "slowloris")).start()
    threading.Thread(target=slow, args=(b"", "silent")).start()


async def steady_load(url: str, concurrency: int, until: float, outcomes: Counter[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < until:
                # a few shared prefixes (cache hits) and a unique tail
                prompt = f"conversation {i % 7} keeps talking about the weather, turn {w}-{i}"
                kind, _ = await one(client, prompt, 32)
                outcomes[kind] += 1
                i += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="how long (at most 120)")
    ap.add_argument("--warmup-s", type=float, default=30.0, help="not in the slopes")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--hostile-every-s", type=float, default=2.0)
    ap.add_argument(
        "--cache-blocks", type=int, default=512, help="per engine (small: the index fills fast)"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not 0 < args.minutes <= MAX_MINUTES:
        ap.error(f"--minutes must be in (0, {MAX_MINUTES:g}], got {args.minutes}")
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    model_dir = make_model_dir(work / "model")
    outcomes: Counter[str] = Counter()
    hostile: Counter[str] = Counter()
    samples: list[dict[str, float]] = []
    with cluster(work, model_dir, cache_blocks=args.cache_blocks) as c:
        t0 = time.monotonic()
        until = t0 + args.minutes * 60
        loader = threading.Thread(
            target=lambda: asyncio.run(steady_load(c.url, args.concurrency, until, outcomes))
        )
        loader.start()
        next_hostile = next_sample = t0
        while (now := time.monotonic()) < until:
            if now >= next_hostile:
                hostile_round(c.url, hostile)
                next_hostile += args.hostile_every_s
            if now >= next_sample:
                samples.append(
                    {
                        "t_s": now - t0,
                        "rss_mib": c.gateway.rss_bytes() / 2**20,
                        "fds": c.gateway.fds(),
                        "indexed_blocks": indexed_blocks(c.url),
                    }
                )
                next_sample += args.sample_s
            time.sleep(0.05)
        loader.join()
        time.sleep(3)  # let idle and lingering connections close
        final = {"rss_mib": c.gateway.rss_bytes() / 2**20, "fds": c.gateway.fds()}
    steady = [s for s in samples if s["t_s"] >= args.warmup_s]
    full_at = 0.95 * max(s["indexed_blocks"] for s in samples)
    full = [s for s in steady if s["indexed_blocks"] >= full_at]
    report = {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "cache_blocks_per_engine": args.cache_blocks,
        "requests": dict(outcomes),
        "hostile": dict(sorted(hostile.items())),
        "rss_mib_first": samples[0]["rss_mib"],
        "rss_mib_after_warmup": steady[0]["rss_mib"] if steady else None,
        "rss_mib_last": samples[-1]["rss_mib"],
        "rss_mib_per_hour": slope_per_hour([(s["t_s"], s["rss_mib"]) for s in steady]),
        "indexed_blocks_last": samples[-1]["indexed_blocks"],
        "index_full_from_s": full[0]["t_s"] if full else None,
        "rss_mib_per_hour_index_full": slope_per_hour([(s["t_s"], s["rss_mib"]) for s in full]),
        "fds_first": samples[0]["fds"],
        "fds_max": max(s["fds"] for s in samples),
        "fds_final": final["fds"],
        "fds_per_hour": slope_per_hour([(s["t_s"], s["fds"]) for s in steady]),
        "samples": samples,
    }
    text = json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
