"""The decode side: requests whose KV arrived join their engine's decoding set (see
:mod:`conductor.sim.engine`), leave it at their real output length, and each one's TBT is
computed afterwards from its engines' logs of step end times.

Per-request work happens only when a request joins, is preempted or leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from conductor.core.events import RequestFinished
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId, Request
from conductor.sim import decode_cache
from conductor.sim.decode_cache import Emit, held_tokens
from conductor.sim.engine import EngineLoop
from conductor.sim.nodes import Engine, Seq
from conductor.sim.records import RequestRecord, tail_mean_tbt


def _ignore(t: float) -> None:
    return None


class DecodeSide:
    """The decode-capable engines (``decode-*`` then ``both-*``).

    A request that joins with ``output_tokens`` to emit in all has had its first token
    from the prefill engine, so it decodes ``output_tokens - 1`` more (one per step) and
    then leaves, telling the scheduler how many tokens it really produced; with
    ``first_token="decode"`` it decodes all ``output_tokens`` here, the first of them the
    client's first token."""

    def __init__(
        self,
        scheduler: Scheduler,
        requests: Sequence[Request],
        records: list[RequestRecord],
        engines: dict[InstanceId, Engine],
        loop: EngineLoop,
        *,
        load_kv: bool = False,
        block: int = 1,
        emit: Emit | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.load_kv = load_kv
        """The decode engine reads a request's KV in the step that admits it
        (``SimConfig.handoff == "load"``)."""
        self.block = block
        """The trace's hash block, in tokens (the decode caches' unit)."""
        self.emit: Emit = emit or (lambda t, ev: scheduler.on_event(ev))
        """Publishes a decode cache's KV events (:mod:`conductor.sim.decode_cache`)."""
        self.requests = requests
        self.records = records
        self.engines = engines
        self.nodes = {iid: e for iid, e in engines.items() if e.role.decodes}
        self.loop = loop
        loop.on_finished = self.on_finished
        self.on_release: Callable[[float], None] = _ignore
        """Called when a request left (late binding may place a held one)."""

    def on_join(self, t: float, decode: InstanceId, i: int) -> None:
        node = self.engines[decode]
        rec = self.records[i]
        rec.decode_join_s = t
        tokens = rec.output_tokens if rec.decode_emits_first else rec.output_tokens - 1
        if tokens <= 0:
            rec.finish_s = t
            rec.tbt_s = 0.0
            self.finished(t, node, i)
            return
        prompt = rec.prompt_tokens
        seq = Seq(i, None, prompt, tokens, decodes=True, computed=prompt)
        if self.load_kv and rec.prefill != decode:
            hashes = self.requests[i].block_hashes
            held = held_tokens(node, hashes, self.block, prompt)
            rec.handoff_held_tokens = held
            seq.load_s = self.loop.engine_cost.nominal.transfer_s(prompt - held)
        decode_cache.on_join(t, node, self.block, prompt, self.emit)
        seq.started = True
        seq.factor = seq.noise = self.loop.engine_cost.job_factor(self.requests[i].request_id)
        self.loop.segments[i] = []
        self.loop.enqueue(t, node, seq)

    def on_finished(self, t: float, node: Engine, seq: Seq) -> None:
        self.records[seq.index].finish_s = t
        self.finished(t, node, seq.index)

    def finished(self, t: float, node: Engine, i: int) -> None:
        req = self.requests[i]
        decode_cache.on_leave(t, node, self.block, req.block_hashes, self.emit)
        rid = req.request_id
        out = self.records[i].output_tokens
        self.scheduler.on_event(RequestFinished(rid, node.iid, t, out))
        self.on_release(t)

    def finish_tbt(self) -> None:
        """Set every decoded request's ``tbt_s`` from its engines' step logs: its token
        times are its prefill's end (unless ``decode_emits_first``: then the first of the
        next, which is also its ``first_token_s``) and the ends of the steps it emitted
        tokens in (a preemption leaves a gap there)."""
        ends = {iid: np.asarray(e.step_ends) for iid, e in self.engines.items()}
        diffs = {iid: np.diff(a) for iid, a in ends.items()}
        for i, segs in self.loop.segments.items():
            rec = self.records[i]
            pe = rec.prefill_end_s
            if pe is None or rec.finish_s is None:
                continue
            if not segs:
                rec.tbt_s = 0.0
                continue
            node, a, b = segs[0]
            first = ends[node.iid][a]  # its first decode step's token
            if len(segs) == 1:
                rest = diffs[node.iid][a:b]
            else:
                rest = np.diff(np.concatenate([ends[n.iid][a : b + 1] for n, a, b in segs]))
            if rec.decode_emits_first:  # that token is the client's first
                rec.first_token_s = float(first)
                intervals = rest
            else:
                intervals = np.concatenate(([first - pe], rest))
            rec.tbt_s = tail_mean_tbt(intervals)
