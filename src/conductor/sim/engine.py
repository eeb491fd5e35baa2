"""vLLM-like iteration-level scheduling of one simulated engine (after vLLM v1's scheduler).

Every step (one iteration of the engine) is formed when the previous one ends:

1. **Decoding requests first**, one token each. Their KV grows by a token per step and is
   allocated in blocks of ``block`` tokens as it grows; when the engine's ``kv_blocks`` run
   out, the **newest** running request is preempted (recompute, vLLM's default): it frees
   all its blocks and goes back to the front of ``waiting``, to recompute its prompt and
   the tokens it had produced as a prefill when it is admitted again. The last running
   request is never preempted (it runs over capacity rather than livelock).
2. **Running partial prefills**, oldest first, each taking up to
   ``long_threshold`` (0 = no cap) tokens of what is left of the step's token budget
   (``budget`` = vLLM's ``max_num_batched_tokens``), preempting like decodes when their
   chunk's blocks do not fit.
3. **Waiting requests** (none in a step that preempted, as in vLLM), FCFS, admitted while
   the budget, ``max_seqs`` and free blocks allow (a request whose blocks do not fit stops
   admission unless the engine is empty; one waiting for remote prefix blocks is skipped).
   A request whose KV arrived from a prefill engine joins decoding directly (its prompt's
   blocks and one token of budget).

**Step time** (from the engines' cost, :class:`~conductor.sim.perturb.EngineCost`: the
scheduler's nominal model, scaled by ``1 + cost_bias`` and each request's job factor): with
``P(N, e)`` the prefill model's time for ``N`` prompt tokens of which ``e`` are already
computed, and ``F = P(1, 0)`` its fixed per-pass part, a chunk of ``c`` tokens after ``e``
earlier ones (cached or computed in earlier steps) adds ``P(e + c, e) - F``; the step costs
the decode model's ``step(B, sum_ctx)`` for its ``B`` decoding requests when ``B > 0`` (its
fixed part covers the pass) else ``F``, plus its chunks. A prompt alone thus takes ``P(e +
c, e)`` per step: unchunked exactly ``P(N, e)``; chunked, about one fixed per-pass overhead
per extra step more. With a perturbed engine cost a chunk's part is multiplied by its
request's factor, the decode part by the mean factor of the decoding requests, ``F`` (in a
step without decodes) by the chunks' mean factor, and the step by ``1 + cost_bias``. Every
``REPORT_EVERY_STEPS`` steps without prefill chunks an engine reports their statistics
(``DecodeStepsObserved``) to the scheduler, the input of its decode-cost correction. A
chunked-pipeline stage (``Seq.exclusive_s``) runs alone, once nothing else is running, for
its planned time; waiting requests behind it wait (FCFS).

The step that computes a prompt's last token emits a token (the first, or after a
recompute the next one); a decoding request emits one per step; a chunk's full blocks are
cached when its step ends (as vLLM's are). Decodes are kept as sums (``Engine.ctx``) and a
finish heap (exact per-request blocks are counted only when the sum says they might not
fit), and runs of decode-only steps go without an event per step (:mod:`conductor.sim.cruise`).
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush

from conductor.core.cost_forms import LinearDecode
from conductor.core.events import DecodeStepsObserved, Event
from conductor.core.types import InstanceId
from conductor.sim.cruise import REPORT_EVERY_STEPS, apply, cut, run_ahead
from conductor.sim.events import EngineStep, EventQueue
from conductor.sim.nodes import Engine, Seq
from conductor.sim.perturb import EngineCost
from conductor.sim.records import RequestRecord

Hook = Callable[[float, Engine, Seq], None]
Segment = tuple[Engine, int, int]
"""``(engine, first step, last step)``: a run of steps in which a request emitted a token."""


def _noop(t: float, e: Engine, s: Seq) -> None:
    return None


def _ignore(event: Event) -> None:
    return None


class EngineLoop:
    """Forms and ends the steps of every engine. The shell sets the hooks: ``on_start``
    (a request is first considered for admission: set its cached prefix), ``on_chunk`` (a
    chunk computed, the prompt not done: cache its blocks), ``on_first_token`` (a prompt's
    prefill finished: hand off, or keep decoding here), ``on_finished`` (its last token)
    and ``on_stage_done`` (a pipeline stage ended)."""

    def __init__(
        self, engine_cost: EngineCost, records: list[RequestRecord], events: EventQueue
    ) -> None:
        cost = engine_cost.nominal
        self.engine_cost = engine_cost
        self.exact = engine_cost.exact
        self.scale = engine_cost.scale
        self.prefill_time = cost.prefill.time_s
        self.step_s = cost.decode.step_s
        self.linear = cost.decode if type(cost.decode) is LinearDecode else None
        self.fixed_s = cost.prefill.time_s(1, 0)
        self.report: Callable[[Event], None] = _ignore
        self.records = records
        self.push = events.push
        self.queue = events
        self.order = 0
        self.preempted = False
        self.step_load_s = 0.0
        """KV loads of the requests the step being formed admits (``Seq.load_s``)."""
        self.segments: dict[int, list[Segment]] = {}
        self.steps: dict[InstanceId, EngineStep] = {}
        self.on_start: Hook = _noop
        self.on_first_token: Hook = _noop
        self.on_finished: Hook = _noop
        self.on_stage_done: Hook = _noop
        self.on_chunk: Hook = _noop

    def add(self, e: Engine) -> None:
        self.steps[e.iid] = EngineStep(e)

    def enqueue(self, t: float, e: Engine, s: Seq) -> None:
        e.waiting.append(s)
        if not e.stepping:
            self.form(t, e)
        elif e.ahead_t and (te := cut(e, t)) is not None:
            self.steps[e.iid].live = False
            ev = self.steps[e.iid] = EngineStep(e)
            self.push(te, ev)

    def kick(self, t: float, e: Engine) -> None:
        if not e.stepping:
            self.form(t, e)

    # -- forming a step ------------------------------------------------------------------
    def form(self, t: float, e: Engine) -> None:
        self.preempted = False
        self.step_load_s = 0.0
        k = len(e.step_ends)
        n = len(e.decoding)
        if n and e.pre_blocks + (e.ctx + n * (e.block - 1)) // e.block > e.kv_blocks:
            self.make_room(e, k, 0, None)
            n = len(e.decoding)
        budget = e.budget - n
        chunks = e.chunks
        if e.prefilling:
            budget = self.schedule_prefills(e, k, budget, chunks)
            n = len(e.decoding)
        if e.waiting and budget > 0 and not self.preempted:  # vLLM: none after a preemption
            self.admit(t, e, k, budget, chunks)
            if e.exclusive is not None:
                e.stepping = True
                self.push(t + e.exclusive.exclusive_s, self.steps[e.iid])
                return
            n = len(e.decoding)
        if not n and not chunks:
            e.stepping = False
            return
        fixed = self.fixed_s
        exact = self.exact
        load = self.step_load_s
        if n:
            dur = self.step_s(n, e.ctx)
            if not exact:
                dur *= self.scale * e.fsum / n
            if not chunks and not load:
                self.observe(e, t, dur, n)
            dur += load
        else:
            dur = fixed
        if chunks:
            pt = self.prefill_time
            records = self.records
            scale = self.scale
            if not n and not exact:
                dur = fixed * scale * sum(s.noise for s, _ in chunks) / len(chunks)
            share = 0.0 if n else dur / len(chunks)
            for s, c in chunks:
                x = (pt(s.computed + c, s.computed) - fixed) * s.noise
                if not exact:
                    x *= scale
                dur += x
                records[s.index].prefill_compute_s += x + share
        e.stepping = True
        self.push(t + dur, self.steps[e.iid])

    def observe(self, e: Engine, t: float, seconds: float, n: int) -> None:
        """Count a decode-only step of ``e`` from ``t``; report every ``REPORT_EVERY_STEPS``."""
        w = e.obs
        w[0] += 1
        w[1] += seconds
        w[2] += n
        w[3] += e.ctx
        if w[0] >= REPORT_EVERY_STEPS:
            steps, busy, b, c = w
            w[:] = [0, 0.0, 0, 0]
            self.report(DecodeStepsObserved(e.iid, int(steps), busy, int(b), int(c), t))

    def make_room(self, e: Engine, k: int, need: int, requester: Seq | None) -> bool:
        """Preempt the newest running requests until ``need`` more blocks fit beside the
        decodes of step ``k``; False when ``requester`` itself had to go."""
        dec = e.decode_blocks(k)
        while e.pre_blocks + dec + need > e.kv_blocks:
            if len(e.prefilling) + len(e.decoding) <= 1:
                return True  # never the last one: it runs over capacity
            victim = e.newest()
            if victim is None:
                return True
            dec -= self.preempt(e, k, victim)
            if victim is requester:
                return False
        return True

    def preempt(self, e: Engine, k: int, s: Seq) -> int:
        """Recompute preemption of ``s`` before step ``k``; returns the decode blocks freed."""
        self.records[s.index].preemptions += 1
        e.preemptions += 1
        self.preempted = True
        freed = 0
        if e.decoding.get(s.order) is s:
            del e.decoding[s.order]
            done = k - s.step0
            c = s.tok0 + 1 + done
            e.ctx -= c
            e.fsum -= s.factor
            freed = -(-c // e.block)
            if k - 1 >= s.seg_first:
                self.segments[s.index].append((e, s.seg_first, k - 1))
            s.remaining -= done
            s.target = s.tok0 + done + 1
            s.computed = s.base = 0
        else:
            e.prefilling.remove(s)
            e.pre_blocks -= s.blocks
            s.computed = s.base
        s.blocks = 0
        s.order = 0
        e.waiting.appendleft(s)
        return freed

    def schedule_prefills(
        self, e: Engine, k: int, budget: int, chunks: list[tuple[Seq, int]]
    ) -> int:
        bs = e.block
        thr = e.long_threshold
        running = e.prefilling
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            i += 1
            c = s.target - s.computed
            if thr and c > thr:
                c = thr
            if c > budget:
                c = budget
            need = -(-(s.computed + c) // bs) - s.blocks
            if need > 0 and need > e.free_bound() and not self.make_room(e, k, need, s):
                i -= 1  # it preempted itself: the next one moved into its place
                continue
            s.blocks += need
            e.pre_blocks += need
            chunks.append((s, c))
            budget -= c
        return budget

    def admit(
        self, t: float, e: Engine, k: int, budget: int, chunks: list[tuple[Seq, int]]
    ) -> None:
        w = e.waiting
        bs = e.block
        thr = e.long_threshold
        running = len(e.prefilling) + len(e.decoding)
        i = 0
        while i < len(w) and budget > 0 and running < e.max_seqs:
            s = w[i]
            if s.fetch_pending:
                i += 1
                continue
            if s.exclusive_s > 0:
                if running == 0:
                    del w[i]
                    if not s.started:
                        self.on_start(t, e, s)
                        s.started = True
                    e.exclusive = s
                break  # FCFS: the stage waits for the engine to empty, and so do those behind
            if not s.started:
                self.on_start(t, e, s)
            joins = s.decodes and s.computed >= s.target
            c = 1 if joins else s.target - s.computed
            if thr and c > thr:
                c = thr
            if c > budget:
                c = budget
            need = -(-(s.computed + c) // bs)
            if (
                running
                and need > e.free_bound()
                and need > e.kv_blocks - e.pre_blocks - e.decode_blocks(k)
            ):
                break
            del w[i]
            s.started = True
            running += 1
            budget -= c
            if joins:
                if s.load_s:
                    self.step_load_s += s.load_s
                    s.load_s = 0.0
                self.start_decode(e, s, k)
                s.seg_first = k
                continue
            self.order += 1
            s.order = self.order
            s.blocks = need
            e.pre_blocks += need
            e.prefilling.append(s)
            chunks.append((s, c))
            if self.records[s.index].prefill_start_s is None:
                self.records[s.index].prefill_start_s = t

    def start_decode(self, e: Engine, s: Seq, step0: int) -> None:
        """``s`` (``target`` tokens of KV here) decodes from step ``step0`` on."""
        self.order += 1
        s.order = self.order
        s.tok0 = s.target
        s.step0 = step0
        s.last = step0 + s.remaining - 1
        e.ctx += s.tok0 + 1
        e.fsum += s.factor
        e.decoding[s.order] = s
        heappush(e.finish_heap, (s.last, s.order))

    # -- a step ends ---------------------------------------------------------------------
    def on_step_end(self, t: float, ev: EngineStep) -> None:
        if not ev.live:
            return
        e = ev.engine
        if e.ahead_t:
            apply(e, len(e.ahead_t))
        ends = e.step_ends
        k = len(ends)
        ends.append(t)
        if e.exclusive is not None:
            s = e.exclusive
            e.exclusive = None
            self.on_stage_done(t, e, s)
            self.form(t, e)
            return
        dec = e.decoding
        n = len(dec)
        ctx = e.ctx + n
        e.ctx = ctx
        fh = e.finish_heap
        if fh and fh[0][0] <= k:
            while fh and fh[0][0] <= k:
                o = heappop(fh)[1]
                f = dec.pop(o, None)
                if f is None:
                    continue  # preempted since
                e.ctx -= f.tok0 + 2 + k - f.step0
                e.fsum -= f.factor
                self.segments[f.index].append((e, f.seg_first, k))
                f.order = 0
                self.on_finished(t, e, f)
            n = len(dec)
            ctx = e.ctx
        chunks = e.chunks
        if chunks:
            done = []
            for s, c in chunks:
                s.computed += c
                if s.computed >= s.target:
                    done.append(s)
                else:
                    self.on_chunk(t, e, s)
            chunks.clear()
            for s in done:
                self.prefill_complete(t, e, s, k)
        elif n and not e.waiting and not e.prefilling:
            # the hot path: decodes only, and their blocks surely fit (see ``form``)
            block = e.block
            if (ctx + n * (block - 1)) // block <= e.kv_blocks:
                d = self.step_s(n, ctx)
                if not self.exact:
                    d *= self.scale * e.fsum / n
                self.observe(e, t, d, n)
                mul = None if self.exact else self.scale * e.fsum / n
                te = run_ahead(e, t + d, k, ctx, self.step_s, self.linear, mul)
                q = self.queue
                q.seq += 1
                heappush(q.heap, (te, q.seq, ev))
                return
        self.form(t, e)

    def prefill_complete(self, t: float, e: Engine, s: Seq, k: int) -> None:
        e.prefilling.remove(s)
        e.pre_blocks -= s.blocks
        s.blocks = 0
        s.order = 0
        if not s.decodes:
            self.on_first_token(t, e, s)
            return
        first = self.records[s.index].prefill_end_s is None
        s.remaining -= 1
        if first:
            self.on_first_token(t, e, s)
        if s.remaining <= 0:
            if not first:
                self.segments[s.index].append((e, k, k))
            self.on_finished(t, e, s)
            return
        self.start_decode(e, s, k + 1)
        s.seg_first = k + 1 if first else k
