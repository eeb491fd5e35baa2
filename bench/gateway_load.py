"""Load test: completions straight to an emulated engine vs through ``conductor serve``.

Starts ``--engines`` emulated engines (``python -m conductor.cli.main emulate --instant``:
steps cost no time, so what is measured is HTTP and the gateway, not a model), sends
``--requests`` streaming completions (at most ``--duration-s`` seconds, ``--concurrency`` in
flight) straight to the first engine, then, if this checkout has ``conductor serve``, starts
the gateway in front of all engines and sends the same load through it. Prints both, the
latency the gateway adds (p50/p99 differences) and its sustained requests/s, and writes JSON.

Everything runs on 127.0.0.1; a ``--target`` URL must be a loopback address. The figures
depend on the machine: the load generator, the engines and the gateway share its cores
(``--procs`` spreads the load generator over several processes).

Run: ``.venv/bin/python bench/gateway_load.py [--engines 2] [--requests 2000]
[--concurrency 32] [--max-tokens 8] [--json out/gateway_load.json]``, or
``--target http://127.0.0.1:PORT`` to load a server that is already running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import numpy as np

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
MODEL = "bench"
BLOCK_SIZE = 32
MAX_MODEL_LEN = 8192
TARGET_ADDED_P50_MS = 1.0
TARGET_GATEWAY_RPS = 1000.0
RUN_OFFSET = 100_000_000
"""Run ``k`` numbers its requests (so its unique prompt suffixes) from ``k * RUN_OFFSET``, and
its warm-up from half that: no run finds another's suffixes in the engines' caches."""


# -- load generation ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str
    requests: int
    duration_s: float
    concurrency: int
    max_tokens: int
    prompt_tokens: int
    shared_prefix_tokens: int
    prefix_groups: int
    warmup: int
    timeout_s: float
    client: str = "raw"
    offset: int = 0
    """First request index (a process's share of the load)."""


@dataclass(slots=True)
class Samples:
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0

    def merge(self, other: Samples) -> None:
        self.ttft_s += other.ttft_s
        self.e2e_s += other.e2e_s
        self.errors += other.errors
        self.error_examples = (self.error_examples + other.error_examples)[:5]
        self.wall_s = max(self.wall_s, other.wall_s)
        self.tokens += other.tokens


def prompt_for(i: int, spec: LoadSpec) -> str:
    """Request ``i``'s prompt: its group's shared prefix, then a unique suffix (1 char = 1
    token for the emulator's byte tokenizer)."""
    group = i % spec.prefix_groups
    prefix = (f"[group {group}] shared system prompt. " * 64)[: spec.shared_prefix_tokens]
    suffix = (f" request {i} asks something unique." * 64)[
        : max(1, spec.prompt_tokens - len(prefix))
    ]
    return prefix + suffix


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        raise SystemExit(f"refusing to load {url}: only loopback addresses are allowed")


async def _one_httpx(client: httpx.AsyncClient, i: int, spec: LoadSpec, out: Samples) -> None:
    body = {
        "model": MODEL,
        "prompt": prompt_for(i, spec),
        "max_tokens": spec.max_tokens,
        "stream": True,
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                raise RuntimeError(f"HTTP {r.status_code}: {text}")
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                if first is None:
                    first = time.perf_counter()
                chunks += 1
            if not done or first is None:
                raise RuntimeError(f"stream ended early after {chunks} chunks")
    except (httpx.HTTPError, RuntimeError) as exc:
        out.errors += 1
        if len(out.error_examples) < 5:
            out.error_examples.append(f"{type(exc).__name__}: {exc}")
        return
    end = time.perf_counter()
    out.ttft_s.append(first - start)
    out.e2e_s.append(end - start)
    out.tokens += chunks


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client for one connection: much cheaper per request than
    httpx (which costs a few ms of CPU per streamed request), so that the load generator is
    not what limits the measurement. Understands chunked and Content-Length bodies."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post_stream(self, path: str, body: bytes) -> tuple[float | None, int]:
        """POST and read an SSE body; returns (time of the first data event, data events)."""
        reader, writer = await self._connect()
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
            b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.port, len(body), body)
        )
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("connection closed before the response")
        status = int(status_line.split(b" ", 2)[1])
        chunked, length, close = False, None, False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection" and value == b"close":
                close = True
        first: float | None = None
        events = 0
        done = False
        pending = b""
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                data = await reader.readexactly(size + 2)
                if status != 200:
                    pending += data[:-2]
                    continue
                pending += data[:-2]
                *complete, pending = pending.split(b"\n\n")
                for event in complete:
                    if event.startswith(b"data: [DONE]"):
                        done = True
                    elif event.startswith(b"data: "):
                        if first is None:
                            first = time.perf_counter()
                        events += 1
        else:
            pending = await reader.readexactly(length or 0)
        if close:
            self.close()
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {pending[:200].decode(errors='replace')}")
        if not done:
            raise RuntimeError(f"stream ended without [DONE] after {events} events")
        return first, events


async def _one_raw(conn: RawConnection, i: int, spec: LoadSpec, out: Samples) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": prompt_for(i, spec),
            "max_tokens": spec.max_tokens,
            "stream": True,
        }
    ).encode()
    start = time.perf_counter()
    try:
        first, events = await conn.post_stream("/v1/completions", body)
    except (OSError, RuntimeError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        conn.close()
        out.errors += 1
        if len(out.error_examples) < 5:
            out.error_examples.append(f"{type(exc).__name__}: {exc}")
        return
    end = time.perf_counter()
    if first is None:
        out.errors += 1
        return
    out.ttft_s.append(first - start)
    out.e2e_s.append(end - start)
    out.tokens += events


async def _drive(spec: LoadSpec, count: int, first_index: int, deadline: float | None) -> Samples:
    out = Samples()
    next_index = first_index
    stop = first_index + count
    workers = min(spec.concurrency, max(1, count))

    def take() -> int | None:
        nonlocal next_index
        if next_index >= stop or (deadline is not None and time.perf_counter() >= deadline):
            return None
        next_index += 1
        return next_index - 1

    start = time.perf_counter()
    if spec.client == "httpx":
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        timeout = httpx.Timeout(spec.timeout_s)
        async with httpx.AsyncClient(base_url=spec.url, limits=limits, timeout=timeout) as client:

            async def httpx_worker() -> None:
                while (i := take()) is not None:
                    await _one_httpx(client, i, spec, out)

            async with asyncio.TaskGroup() as tg:
                for _ in range(workers):
                    tg.create_task(httpx_worker())
    else:
        host, port = _host_port(spec.url)

        async def raw_worker() -> None:
            conn = RawConnection(host, port)
            try:
                while (i := take()) is not None:
                    async with asyncio.timeout(spec.timeout_s):
                        await _one_raw(conn, i, spec, out)
            finally:
                conn.close()

        async with asyncio.TaskGroup() as tg:
            for _ in range(workers):
                tg.create_task(raw_worker())
    out.wall_s = time.perf_counter() - start
    return out


async def run_paired_async(direct: LoadSpec, through: LoadSpec) -> tuple[Samples, Samples]:
    """One request to the engine, one through the gateway, alternately (which goes first
    alternates too), each on its own keep-alive connection: both paths see the same machine
    at the same moments, so the difference of their latencies is the gateway's own, not the
    drift of a shared machine between two runs. Each ``wall_s`` is its path's busy time."""
    specs = (direct, through)
    conns = [RawConnection(*_host_port(s.url)) for s in specs]
    outs = (Samples(), Samples())
    try:
        for k in range(direct.warmup):
            for j in (0, 1):
                await _one_raw(conns[j], specs[j].offset + RUN_OFFSET // 2 + k, specs[j], Samples())
        deadline = time.perf_counter() + direct.duration_s
        for k in range(direct.requests):
            if time.perf_counter() >= deadline:
                break
            for j in (0, 1) if k % 2 == 0 else (1, 0):
                start = time.perf_counter()
                async with asyncio.timeout(specs[j].timeout_s):
                    await _one_raw(conns[j], specs[j].offset + k, specs[j], outs[j])
                outs[j].wall_s += time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    return outs


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


async def run_load_async(spec: LoadSpec) -> Samples:
    if spec.warmup:
        await _drive(spec, spec.warmup, RUN_OFFSET // 2 + spec.offset, None)
    return await _drive(spec, spec.requests, spec.offset, time.perf_counter() + spec.duration_s)


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _run_in_process(spec: LoadSpec) -> Samples:
    return _run_async(run_load_async(spec))


def run_load(spec: LoadSpec, procs: int) -> Samples:
    """Run ``spec`` from ``procs`` processes (each with its share of requests and
    concurrency) and merge their samples."""
    check_loopback(spec.url)
    if procs <= 1:
        return _run_in_process(spec)
    shares = []
    for p in range(procs):
        shares.append(
            LoadSpec(
                **{
                    **asdict(spec),
                    "requests": spec.requests // procs + (p < spec.requests % procs),
                    "concurrency": max(1, spec.concurrency // procs),
                    "warmup": spec.warmup // procs,
                    "offset": spec.offset + p * spec.requests,
                }
            )
        )
    merged = Samples()
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        for samples in pool.map(_run_in_process, shares):
            merged.merge(samples)
    return merged


WRK_SCRIPT = REPO_ROOT / "bench" / "wrk_completions.lua"


def run_wrk(spec: LoadSpec, threads: int) -> dict[str, Any]:
    """``spec`` driven by wrk (a standard C load generator; far cheaper per request than any
    Python client): ``--duration-s`` seconds (whole seconds), the bench's prompts
    (bench/wrk_completions.lua). wrk measures whole answers, so only E2E latencies."""
    check_loopback(spec.url)
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("--client wrk needs wrk on the PATH (Debian/Ubuntu: apt-get install wrk)")
    threads = max(1, min(threads, spec.concurrency))

    def command(offset: int, duration_s: int) -> list[str]:
        return [
            wrk,
            f"-t{threads}",
            f"-c{spec.concurrency}",
            f"-d{duration_s}s",
            "--timeout",
            f"{max(1, round(spec.timeout_s))}s",
            "-s",
            str(WRK_SCRIPT),
            spec.url,
            "--",
            str(offset),
            str(spec.prefix_groups),
            str(spec.prompt_tokens),
            str(spec.shared_prefix_tokens),
            str(spec.max_tokens),
            MODEL,
        ]

    duration_s = max(1, round(spec.duration_s))
    done = subprocess.run(
        command(spec.offset, duration_s),
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + spec.timeout_s + 30,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith('{"wrk"')), None)
    if line is None:
        raise SystemExit(f"wrk printed no result:\n{done.stdout}\n{done.stderr}")
    out = json.loads(line)["wrk"]
    errors = sum(out["errors"].values())
    wall_s = out["duration_us"] / 1e6
    ok = out["requests"] - out["errors"]["status"]
    lat = out["latency_us"]
    return {
        "ok": ok,
        "errors": errors,
        "error_examples": [f"wrk errors: {out['errors']}"] if errors else [],
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(ok / wall_s, 1) if wall_s > 0 else None,
        "tokens_per_s": round(ok * spec.max_tokens / wall_s, 1) if wall_s > 0 else None,
        "ttft_p50_ms": None,
        "ttft_p99_ms": None,
        "e2e_p50_ms": round(lat["p50"] / 1e3, 3),
        "e2e_p99_ms": round(lat["p99"] / 1e3, 3),
        "e2e_p90_ms": round(lat["p90"] / 1e3, 3),
        "client": "wrk",
    }


def warm_up(spec: LoadSpec, args: argparse.Namespace) -> None:
    """Unmeasured requests first (their own prompts): connections, caches, code paths."""
    if spec.warmup <= 0:
        return
    warm = replace(spec, offset=spec.offset + RUN_OFFSET // 2)
    if spec.client == "wrk":
        run_wrk(replace(warm, duration_s=1.0), args.procs)
    else:
        run_load(replace(warm, requests=spec.warmup, warmup=0), args.procs)


def measure(spec: LoadSpec, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``spec`` (its warm-up not included) with the chosen client, summarised."""
    spec = replace(spec, warmup=0)
    if spec.client == "wrk":
        return run_wrk(spec, args.procs)
    return summarize(run_load(spec, args.procs))


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(np.asarray(values), q)) * 1e3, 3)


def summarize(samples: Samples) -> dict[str, Any]:
    ok = len(samples.e2e_s)
    return {
        "ok": ok,
        "errors": samples.errors,
        "error_examples": samples.error_examples,
        "wall_s": round(samples.wall_s, 3),
        "requests_per_s": round(ok / samples.wall_s, 1) if samples.wall_s > 0 else None,
        "tokens_per_s": round(samples.tokens / samples.wall_s, 1) if samples.wall_s > 0 else None,
        "ttft_p50_ms": percentile_ms(samples.ttft_s, 50),
        "ttft_p99_ms": percentile_ms(samples.ttft_s, 99),
        "e2e_p50_ms": percentile_ms(samples.e2e_s, 50),
        "e2e_p99_ms": percentile_ms(samples.e2e_s, 99),
    }


# -- processes ----------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def conductor_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "conductor.cli.main", *args]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def start(name: str, args: list[str], url: str, log_dir: Path) -> Proc:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    return Proc(name, popen, url, log_path)


def wait_ready(proc: Proc, timeout_s: float, paths: Sequence[str] = ("/health",)) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        while True:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited early:\n{proc.log_tail()}")
            for path in paths:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(proc.url + path).status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} not ready after {timeout_s:.0f} s")
            time.sleep(0.1)


def stop(proc: Proc) -> None:
    if proc.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGTERM)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)


@contextlib.contextmanager
def engines(n: int, log_dir: Path, emulator_args: Sequence[str]) -> Iterator[list[dict[str, Any]]]:
    procs: list[Proc] = []
    out: list[dict[str, Any]] = []
    try:
        for k in range(n):
            http, kv, replay = free_ports(3)
            url = f"http://127.0.0.1:{http}"
            args = conductor_cmd(
                "emulate",
                "--port",
                str(http),
                "--kv-events-port",
                str(kv),
                "--replay-port",
                str(replay),
                "--role",
                "both",
                "--model",
                MODEL,
                "--engine-id",
                f"bench-{k}",
                *emulator_args,
            )
            procs.append(start(f"engine-{k}", args, url, log_dir))
            out.append(
                {
                    "url": url,
                    "kv_events": f"tcp://127.0.0.1:{kv}",
                    "replay": f"tcp://127.0.0.1:{replay}",
                    "pid": procs[-1].popen.pid,
                }
            )
        for p in procs:
            wait_ready(p, 60)
        yield out
    finally:
        for p in procs:
            stop(p)


@dataclass(frozen=True, slots=True)
class Serve:
    """How to run ``conductor serve`` here, and which of its options exist."""

    prefix: list[str]
    help_text: str

    def has(self, option: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", self.help_text) is not None


def find_serve(prefix: list[str]) -> tuple[Serve | None, str]:
    """``conductor serve`` if this checkout has it (its help lists ``--engine``), else why not."""
    try:
        r = subprocess.run(
            [*prefix, "serve", "--help"],
            cwd=REPO_ROOT,
            capture_output=True,
            timeout=120,
            check=False,
            text=True,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run {' '.join(prefix)} serve --help: {exc}"
    if r.returncode == 0 and "--engine" in r.stdout:
        return Serve(prefix, r.stdout), ""
    return None, (
        "this checkout has no `conductor serve` yet (it is being built on another branch); "
        "the gateway run is skipped"
    )


def make_tokenizer_dir(path: Path) -> Path:
    """A small local Hugging Face tokenizer (the one the real-vLLM tests use) for a gateway
    that needs ``--model-path``; the engines then load it too, so both tokenize alike."""
    if not (path / "tokenizer.json").exists():
        sys.path.insert(0, str(REPO_ROOT))
        from tests.engines.make_tiny_model import make_tokenizer

        path.mkdir(parents=True, exist_ok=True)
        make_tokenizer(path)
    return path


def gateway_args(
    serve: Serve,
    eng: Sequence[dict[str, Any]],
    port: int,
    policy: str,
    *,
    model_path: Path | None,
    max_model_len: int,
    extra: Sequence[str],
) -> list[str]:
    """``conductor serve --engine URL,role=both,kv_events=... --port P --policy NAME``, plus
    the options this version of serve has that the emulated engines need to match."""
    args = [*serve.prefix, "serve"]
    for e in eng:
        args += ["--engine", f"{e['url']},role=both,kv_events={e['kv_events']}"]
    args += ["--port", str(port), "--policy", policy]
    optional = [
        ("--model-path", None if model_path is None else str(model_path)),
        ("--model-name", MODEL),
        ("--block-size", str(BLOCK_SIZE)),
        ("--max-model-len", str(max_model_len)),
        ("--log-level", "warning"),
    ]
    for option, value in optional:
        if value is not None and serve.has(option) and option not in extra:
            args += [option, value]
    return [*args, *extra]


COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def engine_counters(eng: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The engines' prefix-cache and token counters, summed (from ``GET /metrics``)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    with httpx.Client(timeout=5.0) as client:
        for e in eng:
            for line in client.get(f"{e['url']}/metrics").text.splitlines():
                name = line.split("{", 1)[0]
                if name in total:
                    total[name] += float(line.rsplit(" ", 1)[1])
    return total


def cpu_s(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds the processes have used so far (Linux ``/proc``)."""
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def cpu_ms_per_request(before: float | None, after: float | None, ok: int) -> float | None:
    if before is None or after is None or ok == 0:
        return None
    return round((after - before) * 1e3 / ok, 3)


def cache_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    queries = after[COUNTERS[0]] - before[COUNTERS[0]]
    hits = after[COUNTERS[1]] - before[COUNTERS[1]]
    return {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "generation_tokens": after[COUNTERS[3]] - before[COUNTERS[3]],
    }


# -- main ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "uvloop": importlib.util.find_spec("uvloop") is not None,
        "httptools": importlib.util.find_spec("httptools") is not None,
    }


def print_row(label: str, s: dict[str, Any]) -> None:
    print(
        f"{label:>8s}: {s['ok']:6d} ok {s['errors']:4d} err  {s['requests_per_s']!s:>8s} req/s  "
        f"TTFT p50 {s['ttft_p50_ms']!s:>8s} p99 {s['ttft_p99_ms']!s:>8s} ms  "
        f"E2E p50 {s['e2e_p50_ms']!s:>8s} p99 {s['e2e_p99_ms']!s:>8s} ms"
    )
    engines_ = s.get("engines") or {}
    extra = []
    if engines_.get("cpu_ms_per_request") is not None:
        extra.append(f"engine CPU {engines_['cpu_ms_per_request']} ms/req")
    if s.get("gateway_cpu_ms_per_request") is not None:
        extra.append(f"gateway CPU {s['gateway_cpu_ms_per_request']} ms/req")
    if engines_.get("prefix_cache_hit_rate") is not None:
        extra.append(f"prefix-cache hit rate {engines_['prefix_cache_hit_rate']}")
    if extra:
        print(f"{'':>10s}{', '.join(extra)}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=2, help="emulated engines to start")
    p.add_argument("--requests", type=int, default=2000, help="requests per run (at most)")
    p.add_argument("--duration-s", type=float, default=60.0, help="seconds per run (at most)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured requests first")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per completion")
    p.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt")
    p.add_argument("--shared-prefix-tokens", type=int, default=128, help="of which shared")
    p.add_argument("--prefix-groups", type=int, default=8, help="distinct shared prefixes")
    p.add_argument("--procs", type=int, default=1, help="load generator processes")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request timeout")
    p.add_argument(
        "--client",
        choices=("raw", "httpx", "wrk"),
        default="raw",
        help="raw: a minimal keep-alive HTTP/1.1 client (default; measures TTFT too);\n"
        "wrk: the wrk load generator (C; the least CPU per request, E2E latency only,\n"
        "runs --duration-s seconds, --procs threads); httpx: httpx.AsyncClient (costs a few\n"
        "ms of CPU per streamed request)",
    )
    p.add_argument(
        "--speedup", type=float, default=None, help="pace engines at cost model / X (not instant)"
    )
    p.add_argument("--policy", default="conductor", help="gateway scheduling policy")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra `conductor serve` argument"
    )
    p.add_argument("--no-gateway", action="store_true", help="only the direct run")
    p.add_argument(
        "--paired",
        action="store_true",
        help="latency at concurrency 1 with the raw client: alternate single requests to the\n"
        "engine and through the gateway in one run (the fairest added-latency figure on a\n"
        "shared machine; req/s is then 1 / mean latency of each path)",
    )
    p.add_argument(
        "--gateway-cmd",
        default=f"{shlex.quote(sys.executable)} -m conductor.cli.main",
        help="command that `serve ...` is appended to (default: this checkout's CLI)",
    )
    p.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="tokenizer folder for engines and gateway (default: none for the engines'\n"
        "byte tokenizer; a generated one if the gateway needs --model-path)",
    )
    p.add_argument("--target", default=None, help="load this running server instead")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--log-dir", type=Path, default=REPO_ROOT / "out" / "gateway_load")
    args = p.parse_args(argv)
    for name in (
        "engines",
        "requests",
        "concurrency",
        "max_tokens",
        "prompt_tokens",
        "prefix_groups",
        "procs",
    ):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("warmup", "shared_prefix_tokens"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.duration_s <= 0 or args.timeout_s <= 0:
        p.error("--duration-s and --timeout-s must be > 0")
    if args.speedup is not None and args.speedup <= 0:
        p.error("--speedup must be > 0")
    if args.shared_prefix_tokens > args.prompt_tokens:
        p.error("--shared-prefix-tokens must be <= --prompt-tokens")
    if args.target is not None:
        check_loopback(args.target)
    if args.paired and (args.client != "raw" or args.concurrency != 1 or args.procs != 1):
        p.error("--paired needs --client raw, --concurrency 1 and --procs 1")
    if args.paired and (args.no_gateway or args.target is not None):
        p.error("--paired compares the engine with the gateway: drop --no-gateway/--target")
    return args


def spec_for(url: str, args: argparse.Namespace, run: int = 0) -> LoadSpec:
    return LoadSpec(
        url=url,
        requests=args.requests,
        duration_s=args.duration_s,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        shared_prefix_tokens=args.shared_prefix_tokens,
        prefix_groups=args.prefix_groups,
        warmup=args.warmup,
        timeout_s=args.timeout_s,
        client=args.client,
        offset=run * RUN_OFFSET,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load_cfg = {
        k: getattr(args, k)
        for k in (
            "engines",
            "requests",
            "duration_s",
            "concurrency",
            "warmup",
            "max_tokens",
            "prompt_tokens",
            "shared_prefix_tokens",
            "prefix_groups",
            "procs",
            "speedup",
            "policy",
            "client",
        )
    }
    result: dict[str, Any] = {"config": load_cfg, "machine": machine()}
    if args.target is not None:
        spec = spec_for(args.target, args)
        warm_up(spec, args)
        result["target"] = measure(spec, args)
        print_row("target", result["target"])
        return _finish(result, args)

    args.log_dir.mkdir(parents=True, exist_ok=True)
    serve: Serve | None = None
    why = "--no-gateway"
    if not args.no_gateway:
        serve, why = find_serve(shlex.split(args.gateway_cmd))
    model_path: Path | None = args.model_path
    if model_path is None and serve is not None and serve.has("--model-path"):
        model_path = make_tokenizer_dir(args.log_dir / "tokenizer")
    emulator_args = ["--instant"] if args.speedup is None else ["--speedup", str(args.speedup)]
    emulator_args += ["--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN)]
    if model_path is not None:
        emulator_args += ["--model-path", str(model_path)]
    result["config"]["model_path"] = None if model_path is None else str(model_path)
    with engines(args.engines, args.log_dir, emulator_args) as eng:
        result["engines"] = eng
        pids = [e["pid"] for e in eng]
        direct: dict[str, Any] = {}
        if not args.paired:
            spec = spec_for(eng[0]["url"], args)
            warm_up(spec, args)
            before, cpu0 = engine_counters(eng), cpu_s(pids)
            direct = measure(spec, args)
            direct["engines"] = cache_delta(before, engine_counters(eng))
            direct["engines"]["cpu_ms_per_request"] = cpu_ms_per_request(
                cpu0, cpu_s(pids), direct["ok"]
            )
            result["direct"] = direct
            print_row("direct", direct)
        if serve is None:
            result["gateway"] = {"skipped": why}
            print(f"gateway: skipped: {why}")
            return _finish(result, args)
        port = free_ports(1)[0]
        url = f"http://127.0.0.1:{port}"
        cmd = gateway_args(
            serve,
            eng,
            port,
            args.policy,
            model_path=model_path,
            max_model_len=MAX_MODEL_LEN,
            extra=args.gateway_arg,
        )
        result["gateway_cmd"] = cmd
        gw = start("gateway", cmd, url, args.log_dir)
        try:
            wait_ready(gw, 120, paths=("/health", "/v1/models"))
            spec = spec_for(url, args, run=1)
            if args.paired:
                before, cpu0, gw_cpu0 = engine_counters(eng), cpu_s(pids), cpu_s([gw.popen.pid])
                pair = _run_async(run_paired_async(spec_for(eng[0]["url"], args), spec))
                direct, through = summarize(pair[0]), summarize(pair[1])
                direct["paired"] = through["paired"] = True
                result["direct"] = direct
                print_row("direct", direct)
            else:
                warm_up(spec, args)
                before, cpu0, gw_cpu0 = engine_counters(eng), cpu_s(pids), cpu_s([gw.popen.pid])
                through = measure(spec, args)
            through["engines"] = cache_delta(before, engine_counters(eng))
            served = through["ok"] + (direct["ok"] if args.paired else 0)
            through["engines"]["cpu_ms_per_request"] = cpu_ms_per_request(cpu0, cpu_s(pids), served)
            through["gateway_cpu_ms_per_request"] = cpu_ms_per_request(
                gw_cpu0, cpu_s([gw.popen.pid]), through["ok"]
            )
        finally:
            stop(gw)
        result["gateway"] = through
        print_row("gateway", through)
        added = {
            key: (
                round(through[key] - direct[key], 3)
                if through[key] is not None and direct[key] is not None
                else None
            )
            for key in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
        }
        result["added_latency_ms"] = added
        result["targets"] = {  # latency is judged at concurrency 1, throughput under load
            "added_e2e_p50_ms_at_most": TARGET_ADDED_P50_MS,
            "added_e2e_p50_met": added["e2e_p50_ms"] is not None
            and added["e2e_p50_ms"] <= TARGET_ADDED_P50_MS,
            "gateway_requests_per_s_at_least": TARGET_GATEWAY_RPS,
            "gateway_requests_per_s_met": (through["requests_per_s"] or 0) >= TARGET_GATEWAY_RPS,
        }
        print(
            f"  added: TTFT p50 {added['ttft_p50_ms']} p99 {added['ttft_p99_ms']} ms, "
            f"E2E p50 {added['e2e_p50_ms']} p99 {added['e2e_p99_ms']} ms; "
            f"gateway sustained {through['requests_per_s']} req/s"
        )
    return _finish(result, args)


def _finish(result: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}")
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
