"""The processes under test: emulated engines, ``conductor serve`` in front of them (if this
checkout has it), their command lines, readiness and shutdown."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .spec import MODEL

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 32
MAX_MODEL_LEN = 8192


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
