"""A gateway's two legs in the simulator (``SimConfig.dispatch_latency_s``,
``report_latency_s``): a placed request reaches its engine later, and the scheduler (the
hold queue with it) and the client see its first token later."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.sim import SimConfig, simulate


def _req(i: int, t: float, prompt: int) -> Request:
    blocks = tuple(BlockHash(1000 * i + b) for b in range(-(-prompt // 512)))
    return Request(RequestId(f"r{i}"), prompt, blocks, 4, t)


def _ttfts(policy: str, dispatch_s: float, report_s: float, bias: float = 0.0) -> list[float]:
    cfg = SimConfig(
        policy=policy,
        cost_bias=bias,
        n_prefill=1,
        n_decode=1,
        scheduler=SchedulerConfig(admission="off"),
        dispatch_latency_s=dispatch_s,
        report_latency_s=report_s,
    )
    reqs = [_req(0, 0.0, 4096), _req(1, 0.0, 4096)]
    out = [r.ttft_s for r in simulate(reqs, cfg, outputs=[4, 4]).records]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


def test_both_legs_add_to_the_ttft_of_a_request_sent_at_once() -> None:
    """Round robin places both at arrival on the one prefill engine: each reaches it 0.05 s
    later and is seen 0.02 s after its first token, so each TTFT grows by 0.07 s."""
    plain = _ttfts("round_robin", 0.0, 0.0)
    legs = _ttfts("round_robin", 0.05, 0.02)
    assert legs == pytest.approx([t + 0.07 for t in plain], abs=1e-9)


def test_a_held_request_goes_when_the_one_before_it_is_predicted_done() -> None:
    """``conductor`` holds the second until the first's prefill is predicted over (its
    wakeup), not until that first token is seen: with the engines on the model, the first's
    report leg delays nothing else, and each TTFT grows by its own two legs (0.05 + 0.1).
    The report leg holds the queue back only when an engine finishes before the model says."""
    plain = _ttfts("conductor", 0.0, 0.0)
    legs = _ttfts("conductor", 0.05, 0.1)
    assert legs == pytest.approx([plain[0] + 0.15, plain[1] + 0.15], abs=1e-9)


def test_on_engines_faster_than_the_model_the_queue_waits_for_the_report() -> None:
    """Engines 30% faster than the model: the first's prefill ends before its predicted
    end, and the queue hears of it only when it is seen: the second's TTFT grows by the
    first's two legs (it started later, it is seen later) and then its own (0.05 + 0.1 +
    0.05 + 0.1)."""
    plain = _ttfts("conductor", 0.0, 0.0, bias=-0.3)
    legs = _ttfts("conductor", 0.05, 0.1, bias=-0.3)
    assert legs == pytest.approx([plain[0] + 0.15, plain[1] + 0.3], abs=1e-9)


def test_a_negative_leg_is_refused() -> None:
    with pytest.raises(InvalidInput, match="dispatch_latency_s"):
        SimConfig(dispatch_latency_s=-0.001)
    with pytest.raises(InvalidInput, match="report_latency_s"):
        SimConfig(report_latency_s=-1.0)
