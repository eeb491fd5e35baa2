"""Small builders for hand-made clusters in core tests."""

from __future__ import annotations

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel, LinearDecode, PolynomialPrefill, preset
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role

# 1 ms per new token, nothing else: easy arithmetic in tests.
LINEAR_COST: CostModel = preset("llama3-70b-a800x8").with_(
    name="linear-test",
    prefill=PolynomialPrefill(0.0, 0.001, 0.0, 0.0),
    decode=LinearDecode(0.010, 0.001, 0.0),
    transfer_bytes_per_s=327680 * 100_000,  # 10 us per token
    transfer_latency_s=0.0,
    kv_capacity_tokens=100_000,
)


def make_conductor(
    n_prefill: int,
    n_decode: int,
    *,
    policy: str = "mooncake",
    block_size: int = 4,
    cost: CostModel = LINEAR_COST,
    **cfg: object,
) -> Scheduler:
    cfg.setdefault("output_prior_tokens", 10)  # requests are predicted to generate 10 tokens
    config = SchedulerConfig(block_size_tokens=block_size, **cfg)  # type: ignore[arg-type]
    c = Scheduler(cost, policy=policy, config=config)
    for i in range(n_prefill):
        c.add_instance(InstanceSpec(InstanceId(f"p{i}"), Role.PREFILL))
    for i in range(n_decode):
        c.add_instance(InstanceSpec(InstanceId(f"d{i}"), Role.DECODE))
    return c


def hashes(*ids: int) -> tuple[BlockHash, ...]:
    return tuple(BlockHash(i) for i in ids)


def req(
    rid: str, blocks: tuple[BlockHash, ...], tokens: int, max_tokens: int | None = None
) -> Request:
    return Request(RequestId(rid), tokens, blocks, max_tokens=max_tokens)


def iid(name: str) -> InstanceId:
    return InstanceId(name)
