"""The serving stack's P/D protocol in the simulator (``SimConfig.handoff``,
``first_token``): a hand-off streamed during the prefill or started after it, and the
client's first token from the prefill engine (Mooncake) or from the decode engine's first
step once the KV is there (vLLM's P/D proxy, ``conductor serve``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.sim import SimConfig, simulate
from conductor.sim.records import RequestRecord

PROMPT = 4096


def _cfg(handoff: str, first_token: str, n_both: int = 0) -> SimConfig:
    """Round robin, no admission, one prefill and one decode engine (or ``n_both``)."""
    return SimConfig(
        policy="round_robin",
        n_prefill=0 if n_both else 1,
        n_decode=0 if n_both else 1,
        n_both=n_both,
        scheduler=SchedulerConfig(admission="off"),
        handoff=handoff,
        first_token=first_token,
    )


def _one(handoff: str, first_token: str, out: int = 4, n_both: int = 0) -> RequestRecord:
    cfg = _cfg(handoff, first_token, n_both)
    blocks = tuple(BlockHash(b) for b in range(PROMPT // 512))
    req = Request(RequestId("r0"), PROMPT, blocks, out, 0.0)
    return simulate([req], cfg, outputs=[out]).records[0]


def _step(context: int) -> float:
    return SimConfig().cost.decode_step_s(1, context)


def _transfer() -> float:
    return SimConfig().cost.transfer_s(PROMPT)


def test_a_streamed_hand_off_hides_behind_the_prefill_a_serial_one_follows_it() -> None:
    streamed = _one("stream", "prefill")
    serial = _one("serial", "prefill")
    assert streamed.prefill_end_s == serial.prefill_end_s
    assert streamed.decode_join_s == streamed.prefill_end_s  # 16 ms of KV in a 0.63 s prefill
    assert serial.prefill_end_s is not None
    assert serial.decode_join_s == pytest.approx(serial.prefill_end_s + _transfer(), abs=1e-12)


def test_with_the_prefill_s_first_token_the_hand_off_is_the_first_interval() -> None:
    """Three tokens after the first, one per step; the serial hand-off lengthens the first
    interval only, and with three intervals TBT (the longest 10%) is that one."""
    rec = _one("serial", "prefill")
    assert rec.first_token_s is None
    assert rec.prefill_end_s is not None and rec.decode_join_s is not None
    assert rec.ttft_s == rec.prefill_end_s
    first = rec.decode_join_s + _step(PROMPT + 1) - rec.prefill_end_s
    assert rec.tbt_s == pytest.approx(first, abs=1e-12)


@pytest.mark.parametrize("handoff", ["stream", "serial"])
def test_with_the_decode_s_first_token_ttft_holds_the_hand_off_and_one_step(handoff: str) -> None:
    """All four tokens come from the decode engine: the first at the end of its first step
    after the KV arrived (TTFT), then one per step, so TBT is the step alone."""
    rec = _one(handoff, "decode")
    pre = _one(handoff, "prefill")
    assert rec.decode_join_s == pre.decode_join_s
    assert rec.decode_join_s is not None and rec.first_token_s is not None
    step = _step(PROMPT + 1)
    assert rec.first_token_s == pytest.approx(rec.decode_join_s + step, abs=1e-12)
    assert rec.ttft_s == rec.first_token_s
    assert rec.finish_s is not None and pre.finish_s is not None
    # one more token here, its step at the longest context
    assert rec.finish_s == pytest.approx(pre.finish_s + _step(PROMPT + 4), abs=1e-12)
    assert rec.tbt_s == pytest.approx(step, rel=1e-3)  # the context grows a token a step


def test_a_kv_load_holds_no_nic_and_lengthens_the_step_that_admits_it() -> None:
    """``handoff="load"`` (ExampleConnector): the request joins the decode engine when the
    prefill ends, and its first step there takes the KV read on top of the decode step."""
    rec = _one("load", "decode")
    assert rec.decode_join_s == rec.prefill_end_s
    assert rec.decode_join_s is not None and rec.first_token_s is not None
    step = _step(PROMPT + 1)
    assert rec.first_token_s == pytest.approx(rec.decode_join_s + _transfer() + step, abs=1e-12)
    assert rec.tbt_s == pytest.approx(step, rel=1e-3)


def _pair(handoff: str) -> tuple[RequestRecord, RequestRecord]:
    """A request decoding 100 tokens, and a second one answering one token that reaches
    the same decode engine while it decodes."""
    cfg = _cfg(handoff, "decode")
    reqs = [
        Request(RequestId("r0"), 512, (BlockHash(1),), 100, 0.0),
        Request(RequestId("r1"), PROMPT, tuple(BlockHash(100 + b) for b in range(8)), 1, 1.0),
    ]
    a, b = simulate(reqs, cfg, outputs=[100, 1]).records
    return a, b


def test_a_kv_load_stalls_the_requests_decoding_beside_it() -> None:
    """The second's KV read runs in the decode engine's step, so the first, decoding there,
    finishes that much later than when the KV comes over a NIC (``serial``)."""
    over_nic, _ = _pair("serial")
    loaded, b = _pair("load")
    assert loaded.finish_s is not None and over_nic.finish_s is not None
    assert loaded.finish_s - over_nic.finish_s == pytest.approx(_transfer(), abs=1e-9)
    assert b.decode_join_s == b.prefill_end_s


def test_a_one_token_answer_from_the_decode_engine_has_no_interval() -> None:
    rec = _one("serial", "decode", out=1)
    assert rec.decode_join_s is not None and rec.first_token_s is not None
    assert rec.first_token_s == pytest.approx(rec.decode_join_s + _step(PROMPT + 1), abs=1e-12)
    assert rec.finish_s == rec.first_token_s
    assert rec.tbt_s == 0.0


def test_a_request_decoded_where_it_was_prefilled_is_not_affected() -> None:
    both = _one("serial", "decode", n_both=1)
    plain = _one("stream", "prefill", n_both=1)
    assert both.first_token_s is None and not both.decode_emits_first
    assert (both.ttft_s, both.tbt_s, both.finish_s) == (plain.ttft_s, plain.tbt_s, plain.finish_s)


def test_unknown_protocols_are_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="handoff"):
        SimConfig(handoff="layerwise")
    with pytest.raises(InvalidInput, match="first_token"):
        SimConfig(first_token="client")
    r = CliRunner().invoke(app, ["simulate", "--limit", "5", "--first-token", "client"])
    assert r.exit_code == 2
    assert "invalid --first-token='client': must be one of: prefill, decode" in r.output
