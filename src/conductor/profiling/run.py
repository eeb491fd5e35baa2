"""One ``conductor profile`` run: learn the engine's facts, time it, fit, and render the cost
file (:mod:`conductor.core.cost_file`)."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from pathlib import Path

import httpx

from conductor.core.cost_file import cost_to_mapping, render_cost_file
from conductor.core.costmodel import CostModel
from conductor.core.errors import InvalidInput
from conductor.hf.tokenizer import HfTokenizer
from conductor.hf.words import WORDS
from conductor.profiling.config import (
    FALLBACK_BLOCK_SIZE,
    FALLBACK_KV_CAPACITY_TOKENS,
    ProfileConfig,
)
from conductor.profiling.engine import EngineFacts, engine_facts, model_spec, served_model
from conductor.profiling.fit import Fit, cost_model, fit, measured_table
from conductor.profiling.handoff import (
    HandoffFit,
    fit_handoff,
    kv_moves,
    per_length_medians,
    transfer_of,
)
from conductor.profiling.measure import Measurements, Profiler, Step
from conductor.workload.prompts import word_pool


@dataclass(frozen=True, slots=True)
class ProfileResult:
    cost: CostModel
    fit: Fit
    measurements: Measurements
    facts: EngineFacts
    block_size_tokens: int
    text: str
    """The cost file."""
    wall_s: float
    handoff_fit: HandoffFit | None = None
    """The hand-off's line (``--handoff-url``); None when it was not measured."""
    transfer_measured: bool = False
    """The cost file's ``[transfer]`` comes from ``handoff_fit`` (else the options')."""


def profile(
    cfg: ProfileConfig, model_path: Path, *, name: str | None = None, step: Step | None = None
) -> ProfileResult:
    """Profile the engine at ``cfg.url`` serving the model in ``model_path``."""
    started = datetime.datetime.now(datetime.UTC)
    model = model_spec(model_path, bytes_per_elem=cfg.kv_bytes_per_elem)
    tokenizer = HfTokenizer.load(model_path)
    pool = word_pool(lambda t: tokenizer.encode(t, add_special_tokens=False), WORDS)
    with httpx.Client(timeout=10.0) as client:
        facts = engine_facts(client, cfg.url, cfg.model)
        via_model = None
        if cfg.handoff_url is not None:
            try:
                via_model = served_model(client, cfg.handoff_url)
            except InvalidInput as exc:
                raise InvalidInput("handoff_url", cfg.handoff_url, exc.why) from None
            except httpx.HTTPError as exc:
                why = f"GET /v1/models failed: {exc}"
                raise InvalidInput("handoff_url", cfg.handoff_url, why) from None
    block = cfg.block_size_tokens or facts.block_size_tokens or FALLBACK_BLOCK_SIZE
    profiler = Profiler(cfg, facts.model, block, pool, step, handoff_model=via_model)
    measurements = asyncio.run(profiler.run())
    f = fit(measurements)
    capacity = cfg.kv_capacity_tokens or facts.kv_capacity_tokens
    at = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    wall = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    cost = cost_model(
        name or f"{model.name}-profiled",
        model,
        f,
        kv_capacity_tokens=capacity or FALLBACK_KV_CAPACITY_TOKENS,
        max_batch_size=cfg.max_batch_size,
        transfer_bytes_per_s=cfg.transfer_bytes_per_s,
        transfer_latency_s=cfg.transfer_latency_s,
        source=f"conductor profile {cfg.url} ({facts.model}) at {at}",
    )
    hfit = None
    measured = False
    transfer = "not measured (option values)"
    if measurements.handoff:
        hfit = fit_handoff(kv_moves(per_length_medians(measurements.handoff), cost))
        read = transfer_of(hfit, cost.kv_bytes_per_token)
        if read is None:
            transfer = (
                f"measured through {cfg.handoff_url}, fit unusable ({hfit.s_per_token:.3e} s per"
                " token: the hand-off did not grow with the prompt): option values kept"
            )
        else:
            cost = cost.with_(transfer_bytes_per_s=read[0], transfer_latency_s=read[1])
            measured = True
            transfer = f"measured through {cfg.handoff_url} (hand-off fit)"
    extra = {
        "model_path": str(model_path),
        "block_size_from": "option"
        if cfg.block_size_tokens
        else ("vllm:cache_config_info" if facts.block_size_tokens else "fallback"),
        "kv_capacity_from": "option"
        if cfg.kv_capacity_tokens
        else ("vllm:cache_config_info" if facts.kv_capacity_tokens else "default (not measured)"),
        "transfer": transfer,
        **(_handoff_table(measurements, hfit) if hfit is not None else {}),
        "repeats": cfg.repeats,
        "wall_s": round(wall, 3),
    }
    doc = cost_to_mapping(
        cost,
        measured=measured_table(
            measurements, f, at=at, url=cfg.url, served_model=facts.model, extra=extra
        ),
        block_size_tokens=block,
    )
    header = (
        f"Cost model measured by `conductor profile` at {at}",
        f"from {cfg.url} serving {model_path} ({facts.model}).",
        "Prefill: T = c0 + c1 m + c2 N + c3 m N (m new tokens of N); decode step:",
        "T = c0 + c1 B + c2 C (B requests holding C context tokens). [measured] keeps the",
        "samples and the fit's residuals. Read with --cost-file (docs/profile_replay.md).",
    )
    text = render_cost_file(doc, header)
    return ProfileResult(cost, f, measurements, facts, block, text, wall, hfit, measured)


def _handoff_table(m: Measurements, fit: HandoffFit) -> dict[str, object]:
    return {
        "handoff_samples": [
            [h.prompt_tokens, round(h.prefill_s, 6), round(h.pd_ttft_s, 6)] for h in m.handoff
        ],
        "handoff_samples_columns": "prompt_tokens, prefill-engine seconds, gateway P/D seconds"
        " to the first token",
        "handoff_fit": [round(fit.latency_s, 6), fit.s_per_token, round(fit.max_residual_s, 6)],
        "handoff_fit_columns": "latency s, s per prompt token, max residual s (through the"
        " median hand-off per length less the profiled decode step: the KV move)",
    }
