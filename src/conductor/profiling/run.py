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
from conductor.hf.tokenizer import HfTokenizer
from conductor.hf.words import WORDS
from conductor.profiling.config import (
    FALLBACK_BLOCK_SIZE,
    FALLBACK_KV_CAPACITY_TOKENS,
    ProfileConfig,
)
from conductor.profiling.engine import EngineFacts, engine_facts, model_spec
from conductor.profiling.fit import Fit, cost_model, fit, measured_table
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
    block = cfg.block_size_tokens or facts.block_size_tokens or FALLBACK_BLOCK_SIZE
    profiler = Profiler(cfg, facts.model, block, pool, step)
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
    extra = {
        "model_path": str(model_path),
        "block_size_from": "option"
        if cfg.block_size_tokens
        else ("vllm:cache_config_info" if facts.block_size_tokens else "fallback"),
        "kv_capacity_from": "option"
        if cfg.kv_capacity_tokens
        else ("vllm:cache_config_info" if facts.kv_capacity_tokens else "default (not measured)"),
        "transfer": "not measured (option values)",
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
    return ProfileResult(cost, f, measurements, facts, block, render_cost_file(doc, header), wall)
