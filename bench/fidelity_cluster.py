"""Processes for bench/fidelity.py: engines (real vLLM CPU or ``conductor emulate``), the
gateway (``conductor serve``), the replay (``conductor replay``), and what they cost.

Every process runs in its own process group (``start_new_session``) and is stopped by its
group id, so nothing outlives a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.engines.fixtures import (  # noqa: E402
    BLOCK_SIZE_TOKENS,
    SERVED_MODEL_NAME,
    TINY_MODEL,
    VllmEngine,
    engine_dtype,
    free_ports,
    profile_args,
    start_vllm_engine,
)

CLI = [sys.executable, "-m", "conductor.cli.main"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PREFIX_METRICS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
EXTERNAL_METRICS = (
    "vllm:external_prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
)
"""The KV connector's hits (a P/D decode engine: the blocks it loaded from the prefill's)."""


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """What every engine of a run is started with (vLLM's flags; the emulator's equivalents)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 2048
    block_size: int = BLOCK_SIZE_TOKENS
    enforce_eager: bool = True
    model: Path = TINY_MODEL


@dataclass
class Engine:
    """One running engine: its id, URL, KV event ports, process group and gateway role."""

    engine_id: str
    url: str
    kv_port: int
    replay_port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    vllm: VllmEngine | None = None
    info: dict[str, Any] = field(default_factory=dict)
    role: str = "both"

    @property
    def spec(self) -> str:
        """This engine as ``conductor serve --engine`` takes it."""
        return (
            f"{self.url},role={self.role},id={self.engine_id},kv_events=tcp://127.0.0.1:{self.kv_port},"
            f"replay=tcp://127.0.0.1:{self.replay_port},block_size={BLOCK_SIZE_TOKENS}"
        )

    def stop(self) -> None:
        if self.vllm is not None:
            self.vllm.stop()
            return
        stop_group(self.proc)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL what is left after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in group ``pgid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields[0] is state; pgrp is the 5th stat field
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def metric_sums(url: str, names: Sequence[str]) -> dict[str, float]:
    """Those Prometheus series of ``url``/metrics, each summed over its label sets."""
    out = dict.fromkeys(names, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def counters(url: str) -> dict[str, float]:
    """The engine's ``vllm:prefix_cache_{hits,queries}_total`` and
    ``vllm:external_prefix_cache_{hits,queries}_total`` (summed over label sets)."""
    return metric_sums(url, (*PREFIX_METRICS, *EXTERNAL_METRICS))


def kv_tokens(engine: Engine) -> int:
    """A started vLLM engine's KV room in tokens (``num_gpu_blocks * block_size``)."""
    cc = engine.info["cache_config"]
    return int(cc["num_gpu_blocks"]) * int(cc["block_size"])


def vllm_cache_info(url: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` (block size, KV blocks, ...)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = line[line.index("{") + 1 : line.rindex("}")]
            out: dict[str, str] = {}
            for part in labels.split('",'):
                k, _, v = part.partition("=")
                out[k.strip()] = v.strip('"')
            return out
    return {}


def reset_prefix_cache(engines: Sequence[Engine]) -> list[int]:
    """``POST /reset_prefix_cache`` on each engine; the HTTP statuses."""
    codes = []
    for e in engines:
        try:
            codes.append(httpx.post(f"{e.url}/reset_prefix_cache", timeout=30).status_code)
        except httpx.HTTPError:
            codes.append(0)
    return codes


def start_vllm(
    n: int,
    flags: EngineFlags,
    work: Path,
    pin: bool,
    *,
    roles: Sequence[tuple[str, str]] = (),
    extra_args: Sequence[Sequence[str]] = (),
) -> list[Engine]:
    """``n`` real vLLM CPU engines started in parallel, engine ``i``'s OpenMP thread bound to
    core ``i mod cores`` (two engines each spinning threads on every core fight otherwise),
    with ``pin`` its whole process group too (``taskset``). ``roles``: engine ``i``'s (id,
    gateway role), default (``e{i}``, both); ``extra_args``: engine ``i``'s extra flags."""
    cores = os.cpu_count() or 1
    engines: list[Engine] = []
    try:
        for i in range(n):
            port, kv, rp = free_ports(3)
            core = i % cores
            args = ["--enable-prompt-tokens-details", *(extra_args[i] if extra_args else ())]
            args += ["--max-num-batched-tokens", str(flags.max_num_batched_tokens)]
            args += ["--max-num-seqs", str(flags.max_num_seqs)]
            if flags.enforce_eager:
                args.append("--enforce-eager")
            env = {"VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_SERVER_DEV_MODE": "1"}
            log = work / f"vllm-{i}.log"
            v = start_vllm_engine(
                port,
                kv,
                args,
                env,
                replay_port=rp,
                model=flags.model,
                block_size=flags.block_size,
                max_model_len=flags.max_model_len,
                log_path=log,
            )
            if pin:
                subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(v.proc.pid)],
                               check=False, capture_output=True)  # fmt: skip
            engine_id, role = roles[i] if roles else (f"e{i}", "both")
            engines.append(Engine(engine_id, v.base_url, kv, rp, v.proc, log, vllm=v, role=role))
        for e in engines:
            assert e.vllm is not None
            e.info["healthy_after_s"] = round(e.vllm.wait_healthy(), 1)
            e.info["cache_config"] = vllm_cache_info(e.url)
            e.info["dtype"] = engine_dtype() or "vLLM's default"
            if pin:  # threads started after the first taskset: pin them all again
                for pid in _group_pids(e.proc.pid):
                    subprocess.run(["taskset", "-a", "-p", "-c", str(engines.index(e) % cores),
                                    str(pid)], check=False, capture_output=True)  # fmt: skip
    except BaseException:
        for e in engines:
            e.stop()
        raise
    return engines


def pd_connector_args(shared: Path) -> list[list[str]]:
    """vLLM's ``ExampleConnector`` flags for a prefill (``kv_producer``) and a decode
    (``kv_consumer``) engine handing KV over through the folder ``shared``
    (tests/gateway/test_gateway_vllm_pd.py)."""

    def one(role: str) -> list[str]:
        cfg = {
            "kv_connector": "ExampleConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(shared)},
        }
        return ["--kv-transfer-config", json.dumps(cfg)]

    return [one("kv_producer"), one("kv_consumer")]


def clear_folder(path: Path) -> int:
    """Remove everything under ``path`` (the connector's KV files); how many entries."""
    import shutil

    n = 0
    for entry in path.iterdir():
        n += 1
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return n


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(text[text.rindex(")") + 2 :].split()[2]) == pgid:
                pids.append(int(entry))
    return pids


def start_emulated(
    n: int, flags: EngineFlags, cost_file: Path, kv_blocks: int, work: Path, pin: bool
) -> list[Engine]:
    """``n`` ``conductor emulate`` engines timed by ``cost_file``, with the real engines'
    limits, block size and KV blocks."""
    cores = os.cpu_count() or 1
    engines: list[Engine] = []
    try:
        for i in range(n):
            port, kv, rp = free_ports(3)
            cmd = [*CLI, "emulate", "--port", str(port), "--kv-events-port", str(kv)]
            cmd += ["--replay-port", str(rp), "--role", "both", "--engine-id", f"e{i}"]
            cmd += ["--model", SERVED_MODEL_NAME, "--model-path", str(flags.model)]
            cmd += ["--block-size", str(flags.block_size), "--cache-blocks", str(kv_blocks)]
            cmd += ["--max-model-len", str(flags.max_model_len), "--cost-file", str(cost_file)]
            cmd += ["--max-batched-tokens", str(flags.max_num_batched_tokens)]
            cmd += ["--max-batch-size", str(flags.max_num_seqs), "--log-level", "warning"]
            if pin:
                cmd = ["taskset", "-c", str(i % cores), *cmd]
            log = work / f"emu-{i}.log"
            with log.open("wb") as f:
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                        start_new_session=True)  # fmt: skip
            engines.append(Engine(f"e{i}", f"http://127.0.0.1:{port}", kv, rp, proc, log))
        for e in engines:
            wait_http(e.url, e.proc, e.log_path, 60)
    except BaseException:
        for e in engines:
            e.stop()
        raise
    return engines


@contextlib.contextmanager
def gateway(
    engines: Sequence[Engine],
    cost_file: Path,
    policy: str,
    admission: str,
    flags: EngineFlags,
    work: Path,
    *,
    ttft_slo_s: float,
    tbt_slo_ms: float,
    extra_args: Sequence[str] = (),
    log_name: str | None = None,
) -> Iterator[str]:
    """``conductor serve`` in front of ``engines`` with ``policy`` (and ``extra_args``);
    yields its URL. Its log is ``work/gateway-<log_name or policy>.log``."""
    (port,) = free_ports(1)
    cmd = [*CLI, "serve", "--port", str(port), "--model-path", str(flags.model)]
    cmd += ["--model-name", SERVED_MODEL_NAME, "--block-size", str(flags.block_size)]
    cmd += ["--max-model-len", str(flags.max_model_len), "--cost-file", str(cost_file)]
    cmd += ["--policy", policy, "--admission", admission, "--log-level", "warning"]
    cmd += ["--ttft-slo-s", str(ttft_slo_s), "--tbt-slo-ms", str(tbt_slo_ms), *extra_args]
    for e in engines:
        cmd += ["--engine", e.spec]
    log = work / f"gateway-{log_name or policy}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url, proc, log, 60)
        yield url
    finally:
        stop_group(proc)


def replay(
    url: str,
    trace: Path,
    speed: float,
    seed: int,
    engines: Sequence[Engine],
    out: Path,
    label: str,
    model: Path = TINY_MODEL,
) -> dict[str, Any]:
    """``conductor replay`` of ``trace`` (already scaled: block 32, lengths as sent) against
    ``url``; the summary, the per-request rows, the engines' prefix-cache counters and CPU
    seconds over the run, and the load average around it."""
    before = {e.engine_id: counters(e.url) for e in engines}
    cpu0 = {e.engine_id: group_cpu_s(e.proc.pid) for e in engines}
    load0 = os.getloadavg()
    rows_path = out.with_suffix(".requests.json")
    cmd = [*CLI, "replay", "--url", url, "--trace", str(trace), "--speed", str(speed)]
    cmd += ["--token-scale", "1", "--output-scale", "1", "--trace-block-size"]
    cmd += [str(BLOCK_SIZE_TOKENS), "--block-size", str(BLOCK_SIZE_TOKENS)]
    cmd += ["--model-path", str(model), "--seed", str(seed), "--label", label]
    cmd += ["--json", str(out), "--requests-json", str(rows_path), "--timeout-s", "120"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = {e.engine_id: counters(e.url) for e in engines}
    cpu = {e.engine_id: round(group_cpu_s(e.proc.pid) - cpu0[e.engine_id], 2) for e in engines}
    hits = sum(after[k][PREFIX_METRICS[0]] - before[k][PREFIX_METRICS[0]] for k in after)
    queries = sum(after[k][PREFIX_METRICS[1]] - before[k][PREFIX_METRICS[1]] for k in after)
    delta = {k: {m: after[k][m] - before[k][m] for m in after[k]} for k in after}
    return {
        "engine_counters": delta,
        "summary": json.loads(out.read_text()),
        "rows": json.loads(rows_path.read_text()),
        "engine_hits": hits,
        "engine_queries": queries,
        "engine_hit_rate": hits / queries if queries else None,
        "engine_cpu_s": cpu,
        "wall_s": round(wall, 2),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


QUICK_PROFILE = (
    "--lengths", "64,256,768,1536", "--cached-fractions", "0.5", "--repeats", "2",
    "--warmup", "2", "--batch-sizes", "1,4,8", "--contexts", "64,768", "--decode-tokens", "16",
)  # fmt: skip
"""A shorter ``conductor profile`` (fewer points, the same fit) for the CI test."""


def profile(engine: Engine, model: Path, out: Path, extra: Sequence[str] = ()) -> None:
    """``conductor profile`` of one engine (idle) serving ``model``, written to ``out``."""
    cmd = [*CLI, "profile", "--url", engine.url, "--model-path", str(model)]
    cmd += ["--out", str(out), "--name", model.name, *profile_args(), *extra]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def profile_together(engines: Sequence[Engine], model: Path, out: Path, work: Path) -> None:
    """``conductor profile`` of every engine at once; engine 0's file is written to ``out``,
    the others' next to it in ``work``."""
    procs = []
    for i, e in enumerate(engines):
        target = out if i == 0 else work / f"cost-{e.engine_id}.toml"
        cmd = [*CLI, "profile", "--url", e.url, "--model-path", str(model)]
        cmd += ["--out", str(target), "--name", model.name, *profile_args()]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"conductor profile exited with {codes}")


def other_load() -> list[str]:
    """The busiest processes that are not ours (command names and CPU %), as ``ps`` shows."""
    ps = subprocess.run(["ps", "-eo", "pcpu,pgid,args", "--sort=-pcpu"], capture_output=True,
                        text=True, check=False).stdout.splitlines()[1:12]  # fmt: skip
    mine = os.getpgid(0)
    out = []
    for line in ps:
        parts = line.split(None, 2)
        if len(parts) == 3 and int(parts[1]) != mine and float(parts[0]) >= 5:
            out.append(f"{parts[0]}% {parts[2][:90]}")
    return out


def _timed(
    client: httpx.Client, url: str, prompt: list[int], max_tokens: int, stream: bool
) -> float:
    """Seconds from sending a completion of ``prompt`` to its first token (``stream``) or to
    its whole answer; the answer is read to its end either way."""
    body: dict[str, Any] = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens}
    body.update({"ignore_eos": True, "temperature": 0.0, "stream": stream})
    t0 = time.perf_counter()
    first: float | None = None
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                first = time.perf_counter()
    end = time.perf_counter()
    if stream and first is None:
        raise RuntimeError(f"{url}: no token streamed")
    return (first if stream and first is not None else end) - t0


def handoff_probe(
    prefill: Engine,
    decode: Engine,
    gateway_url: str,
    lengths: Sequence[int],
    samples: int,
    seed: int,
    vocab: int = 1024,
) -> list[dict[str, float]]:
    """The P/D hand-off at low load, one request at a time, each with a prompt of random
    token ids seen by no engine before. Per length and sample:

    * ``prefill_s``: the prefill leg as the gateway sends it, straight to the prefill engine
      (``max_tokens`` 1, not streamed; its connector writes the prompt's KV files);
    * ``decode_leg_ttft_s``: the same prompt straight to the decode engine, streamed (its
      connector loads those files, then the engine computes the last partial block and the
      first token): the hand-off's read side;
    * ``pd_ttft_s``: a fresh prompt of the same length through the gateway (prefill leg,
      then the decode leg, streamed); ``handoff_s = pd_ttft_s - prefill_s``.

    One unmeasured round of the three first (vLLM's CPU kernels meet each shape once)."""
    import random

    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    out: list[dict[str, float]] = []
    with httpx.Client(timeout=120) as c:
        for k in range(samples + 1):
            for n in lengths:
                p = fresh(n)
                t_pre = _timed(c, prefill.url, p, 1, stream=False)
                t_dec = _timed(c, decode.url, p, 2, stream=True)
                t_pd = _timed(c, gateway_url, fresh(n), 2, stream=True)
                if k == 0:
                    continue
                out.append(
                    {
                        "prompt_tokens": n,
                        "prefill_s": round(t_pre, 6),
                        "decode_leg_ttft_s": round(t_dec, 6),
                        "pd_ttft_s": round(t_pd, 6),
                        "handoff_s": round(t_pd - t_pre, 6),
                    }
                )
    return out
