"""Simulator fidelity against replayed engines (issue 12 items 4-5): the pure parts.

A fidelity run replays one slice of a trace against real engines (``conductor replay``
through ``conductor serve``) and simulates the same slice; this module holds what both sides
share and what compares them:

* :func:`scale_records`: the slice with its lengths scaled to a small model (the prompts'
  trace blocks become ``block_tokens``-token blocks, so the hash ids keep their meaning;
  prompts cut so prompt plus output fit ``max_model_len``). Written as a trace file, it is
  what the replay sends (``--token-scale 1 --trace-block-size B --block-size B``) and what the
  simulator reads with the same block size: both see the same token counts and shared blocks.
* :class:`EngineShape` and :func:`sim_config`: the simulated cluster matching the real one
  (``n`` engines of role ``both``, or ``n_prefill`` + ``n_decode`` for the P/D scenario;
  vLLM's scheduler knobs, the KV room, the block size).
* :func:`pd_intervals`: a P/D request's time on its prefill engine (sent to first token)
  and on its decode engine (first token to done), for :func:`busy_fraction`.
* :func:`with_transfer`: the cost model's KV transfer set from the measured P/D hand-off
  (TTFT through the gateway minus the prefill engine's own time and the decode step; its
  line in the prompt length is ``conductor.profiling.handoff.fit_handoff``).
* :func:`simulate_slice`: a trace file (the slice as the replay sends it) through the
  simulator at a replay speed, outputs as in the trace.
* :func:`busy_fraction`: utilisation as the share of the trace's span an engine had at least
  one request in flight, computed the same way from replay rows and simulated records.
* :func:`compare`: per-request and aggregate TTFT/TBT errors of one run against another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.profiling.handoff import HandoffFit, transfer_of
from conductor.sim.config import EngineConfig, SimConfig
from conductor.sim.records import RequestRecord
from conductor.sim.simulator import SimResult, simulate
from conductor.workload.max_tokens import MaxTokens
from conductor.workload.trace import generated_tokens, read_trace, records_to_requests
from conductor.workload.trace_format import TraceRecord


@dataclass(frozen=True, slots=True)
class Scaling:
    """How a trace slice is shrunk to a small model. ``token_scale``: prompt lengths x this
    (``trace_block_tokens * token_scale`` must be the engine block ``block_tokens``);
    ``output_scale`` and ``max_output_tokens``: the outputs; ``max_model_len``: prompt plus
    output never exceed it."""

    token_scale: float = 1 / 16
    output_scale: float = 0.1
    max_output_tokens: int = 64
    max_model_len: int = 2048
    trace_block_tokens: int = 512
    block_tokens: int = 32

    def __post_init__(self) -> None:
        per = self.trace_block_tokens * self.token_scale
        if abs(per - self.block_tokens) > 1e-9:
            raise ValueError(
                f"trace block {self.trace_block_tokens} x token scale {self.token_scale}"
                f" = {per} tokens, not the engine block {self.block_tokens}"
            )
        if self.max_output_tokens >= self.max_model_len:
            raise ValueError("max_output_tokens must be below max_model_len")


def scale_records(records: Iterable[TraceRecord], s: Scaling) -> list[TraceRecord]:
    """``records`` shrunk by ``s``: each 512-token trace block one ``block_tokens`` block
    (the same hash id), the prompt cut to ``max_model_len - output`` tokens."""
    out: list[TraceRecord] = []
    for r in records:
        output = min(s.max_output_tokens, max(1, math.ceil(r.output_length * s.output_scale)))
        prompt = max(1, math.ceil(r.input_length * s.token_scale))
        prompt = min(prompt, s.max_model_len - output)
        blocks = -(-prompt // s.block_tokens)
        out.append(TraceRecord(r.timestamp_ms, prompt, output, r.hash_ids[:blocks], r.line_no))
    return out


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The real engines, as the simulator needs them: how many of role ``both`` (``n``),
    of role ``prefill`` and ``decode`` (``n_prefill``, ``n_decode``: the P/D scenario),
    vLLM's ``--max-num-batched-tokens``, ``--max-num-seqs``, ``--block-size`` and KV room
    (tokens; ``num_gpu_blocks * block_size``), and the chunk cap (vLLM's
    ``long_prefill_token_threshold``, 0 when partial prefills are off, its default)."""

    n: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_tokens: int
    kv_capacity_tokens: int
    long_prefill_token_threshold: int = 0
    n_prefill: int = 0
    n_decode: int = 0


def sim_config(
    policy: str,
    cost: CostModel,
    shape: EngineShape,
    *,
    admission: str,
    ttft_slo_s: float,
    tbt_slo_s: float,
    seed: int = 0,
    gateway_latency_s: float = 0.0,
    handoff: str = "stream",
    first_token: str = "prefill",
    hold_horizon_s: float | None = None,
) -> SimConfig:
    """``conductor simulate --both n --prefill P --decode D --cost-file F
    --max-num-batched-tokens .. --max-num-seqs .. --kv-block-tokens B --long-prefill-tokens ..
    --cache-tokens KV --admission A --no-cpp --no-kv-fetch --max-tokens trace`` with the
    scheduler's block (and the trace's) ``B`` tokens, as the gateway's is (``serve
    --block-size B``). The prefix cache is the engines' KV room: vLLM caches prefixes in its
    free KV blocks. No fetches between engines: behind ``conductor serve`` each reuses its
    own cache only.
    ``gateway_latency_s``: what the gateway adds to a request's TTFT on idle engines (its two
    legs), split evenly into the simulator's dispatch and report latencies. ``handoff`` and
    ``first_token``: the P/D protocol (``--handoff``, ``--first-token``; the scheduler is
    told ``first_token`` as ``conductor serve``'s is). ``hold_horizon_s``: the hold queue's
    horizon (``serve --set hold_horizon_ms``; None: the policy's)."""
    sched = SchedulerConfig(
        block_size_tokens=shape.block_tokens,
        ttft_slo_s=ttft_slo_s,
        tbt_slo_s=tbt_slo_s,
        admission=admission,
        cpp_enabled=False,
        seed=seed,
        first_token=first_token,
        handoff=handoff,
        policy_params={} if hold_horizon_s is None else {"late_binding_horizon_s": hold_horizon_s},
    )
    engine = EngineConfig(
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_num_seqs=shape.max_num_seqs,
        block_size_tokens=shape.block_tokens,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        kv_capacity_tokens=shape.kv_capacity_tokens,
    )
    return SimConfig(
        policy=policy,
        n_prefill=shape.n_prefill,
        n_decode=shape.n_decode,
        n_both=shape.n,
        engine=engine,
        cost=cost,
        scheduler=sched,
        cache_capacity_tokens=shape.kv_capacity_tokens,
        seed=seed,
        dispatch_latency_s=gateway_latency_s / 2,
        report_latency_s=gateway_latency_s / 2,
        handoff=handoff,
        first_token=first_token,
        kv_fetch=False,
    )


def simulate_slice(trace: Path, speed: float, cfg: SimConfig) -> SimResult:
    """``trace`` simulated with ``cfg`` at replay ``speed``: read with the scheduler's block
    size, each request's ``max_tokens`` and output as in the trace (``--max-tokens trace``,
    what the replay sends)."""
    block = cfg.scheduler.block_size_tokens
    records = read_trace(trace, block_size_tokens=block).records
    mt = MaxTokens.parse("trace")
    requests = records_to_requests(records, speed=speed, block_size_tokens=block, max_tokens=mt)
    return simulate(requests, cfg, outputs=generated_tokens(records, mt))


Interval = tuple[str, float, float]
"""(engine, start, end): a request in flight on an engine."""


def busy_fraction(intervals: Iterable[Interval], window: tuple[float, float]) -> dict[str, float]:
    """Per engine, the share of ``window`` during which it had at least one request in
    flight (the union of its intervals, clipped to the window)."""
    lo, hi = window
    span = hi - lo
    by: dict[str, list[tuple[float, float]]] = {}
    for engine, start, end in intervals:
        a, b = max(start, lo), min(end, hi)
        if b > a:
            by.setdefault(engine, []).append((a, b))
    out: dict[str, float] = {}
    for engine, spans in sorted(by.items()):
        spans.sort()
        total, cur_a, cur_b = 0.0, spans[0][0], spans[0][1]
        for a, b in spans[1:]:
            if a > cur_b:
                total += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        total += cur_b - cur_a
        out[engine] = round(total / span, 4) if span > 0 else 0.0
    return out


def _stats(xs: Sequence[float]) -> dict[str, float] | None:
    if not xs:
        return None
    a = np.asarray(xs, dtype=float)
    return {
        "mean": round(float(a.mean()), 6),
        "p50": round(float(np.percentile(a, 50)), 6),
        "p90": round(float(np.percentile(a, 90)), 6),
    }


def _rel(pred: float | None, ref: float | None) -> float | None:
    if pred is None or ref is None or ref == 0:
        return None
    return round((pred - ref) / ref, 4)


Row = Mapping[str, object]
"""A per-request row: ``request_id``, ``ttft_s``, ``tbt_s`` (None when it has none)."""


def _num(row: Row, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else None


def compare(pred: Sequence[Row], ref: Sequence[Row]) -> dict[str, object]:
    """``pred`` (a simulated or emulated run) against ``ref`` (the measured one), matched by
    ``request_id``: the aggregate errors (``(pred - ref) / ref`` of the mean, p50 and p90
    over the requests both finished), the per-request relative errors' absolute values
    (mean, p50, p90) and their signed mean, for TTFT and TBT; and the per-request pairs."""
    by_id = {str(r["request_id"]): r for r in pred}
    pairs: list[tuple[str, float, float]] = []
    tbt_pairs: list[tuple[float, float]] = []
    for r in ref:
        p = by_id.get(str(r["request_id"]))
        if p is None:
            continue
        rt, pt = _num(r, "ttft_s"), _num(p, "ttft_s")
        if rt is None or pt is None or rt <= 0:
            continue
        pairs.append((str(r["request_id"]), pt, rt))
        rb, pb = _num(r, "tbt_s"), _num(p, "tbt_s")
        if rb is not None and pb is not None and rb > 0:
            tbt_pairs.append((pb, rb))
    out: dict[str, object] = {"requests_compared": len(pairs)}
    for name, got in (("ttft", [(p, r) for _, p, r in pairs]), ("tbt", tbt_pairs)):
        pv = [p for p, _ in got]
        rv = [r for _, r in got]
        sp, sr = _stats(pv), _stats(rv)
        out[f"{name}_pred"] = sp
        out[f"{name}_ref"] = sr
        for stat in ("mean", "p50", "p90"):
            out[f"{name}_{stat}_error"] = _rel(
                None if sp is None else sp[stat], None if sr is None else sr[stat]
            )
        errs = [(p - r) / r for p, r in got]
        out[f"{name}_per_request_abs_error"] = _stats([abs(e) for e in errs])
        out[f"{name}_per_request_signed_mean"] = round(float(np.mean(errs)), 4) if errs else None
    out["pairs"] = [[rid, round(p, 6), round(r, 6)] for rid, p, r in pairs]
    return out


def ordering(means: Mapping[str, float]) -> list[str]:
    """Policies from the lowest mean TTFT to the highest (ties by name)."""
    return [k for k, _ in sorted(means.items(), key=lambda kv: (kv[1], kv[0]))]


def sim_rows(records: Iterable[RequestRecord]) -> list[dict[str, object]]:
    """Simulated records as ``conductor replay --requests-json`` rows (the keys
    :func:`compare` and :func:`row_intervals` read)."""
    rows: list[dict[str, object]] = []
    for r in records:
        rows.append(
            {
                "request_id": r.request_id,
                "arrival_s": r.arrival_s,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "cached_tokens": r.cached_tokens,
                "ttft_s": r.ttft_s,
                "tbt_s": r.tbt_s,
                "prefill": r.prefill,
                "decode": r.decode,
                "sent_s": r.arrival_s,
                "done_s": r.finish_s,
            }
        )
    return rows


def row_intervals(rows: Iterable[Row], key: str = "decode") -> list[Interval]:
    """Each finished row as (its ``key`` engine, sent, done)."""
    out: list[Interval] = []
    for r in rows:
        engine, a, b = r.get(key), _num(r, "sent_s"), _num(r, "done_s")
        if isinstance(engine, str) and a is not None and b is not None:
            out.append((engine, a, b))
    return out


def pd_intervals(rows: Iterable[Row]) -> list[Interval]:
    """Each finished P/D row as two intervals: (its prefill engine, sent, first token) and
    (its decode engine, first token, done). The first token is ``arrival_s + ttft_s`` (the
    TTFT is counted from the due time, as :func:`compare` reads it)."""
    out: list[Interval] = []
    for r in rows:
        pre, dec = r.get("prefill"), r.get("decode")
        sent, done, ttft = _num(r, "sent_s"), _num(r, "done_s"), _num(r, "ttft_s")
        due = _num(r, "arrival_s")
        if sent is None or done is None or ttft is None or due is None:
            continue
        first = due + ttft
        if isinstance(pre, str):
            out.append((pre, sent, first))
        if isinstance(dec, str):
            out.append((dec, first, done))
    return out


def with_transfer(cost: CostModel, fit: HandoffFit) -> CostModel | None:
    """``cost`` with its KV transfer read from ``fit`` (``conductor.profiling.handoff``'s
    reading, as ``conductor profile --handoff-url`` writes it); None when the hand-off did
    not grow with the prompt (a slope at or below zero)."""
    read = transfer_of(fit, cost.kv_bytes_per_token)
    if read is None:
        return None
    return cost.with_(transfer_bytes_per_s=read[0], transfer_latency_s=read[1])


def alone_slowdown(rows: Sequence[Row], cost: CostModel) -> dict[str, float] | None:
    """For the requests that had their engine to themselves from their send to their first
    token (no other request in flight there), measured TTFT over the cost model's prefill
    time for their prompt and cached tokens: how much slower (> 1) the engine ran than
    profiled, without queueing. None when no request was alone."""
    spans = [(r, row_intervals([r])) for r in rows]
    ratios: list[float] = []
    for r, mine in spans:
        ttft, sent = _num(r, "ttft_s"), _num(r, "sent_s")
        prompt, cached = _num(r, "prompt_tokens"), _num(r, "cached_tokens")
        if not mine or ttft is None or sent is None or prompt is None:
            continue
        engine, a, _ = mine[0]
        first = _num(r, "arrival_s")
        end = (first if first is not None else a) + ttft
        crowded = any(
            o is not r and iv and iv[0][0] == engine and iv[0][1] < end and iv[0][2] > a
            for o, iv in spans
        )
        if not crowded:
            ratios.append(ttft / cost.prefill_s(int(prompt), int(cached or 0)))
    stats = _stats(ratios)
    return None if stats is None else {**stats, "n": float(len(ratios))}
