"""Per-instance load bookkeeping: queued prefill work, decode batch, KV use, health.

Prefill (FCFS): ``busy_until_s`` is the predicted time at which the instance has drained
everything assigned to it, so ``queue_s(now) = max(0, busy_until_s - now)`` is "the prefill
times of all queued requests" (FAST §4.1) including what is left of the running one. When a
prefill ends, the rest of the queue is re-anchored at that moment (FCFS: the next one starts
now), so a prediction error moves the queue once and never accumulates.

Decode: the assigned requests (context tokens) and the KV tokens reserved for them
(prompt + predicted output, see :class:`DecodeState`), those of them already decoding
(``running``), so admission can check both TBT and KV room.

Invariants: ``queued_requests == len(_pred_s)``; ``_sum_pred_s == sum(_pred_s.values())``;
``batch_size == len(_ctx)``; ``context_tokens == sum(_ctx.values())``;
``kv_reserved_tokens == sum(_kv.values())``; ``running == len(_started)``;
``running_kv_tokens == sum(_kv[r] for r in _started)``; every key of ``pending_stalls`` is
in ``_ctx`` and not in ``_started``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from conductor.core.types import InstanceId, RequestId, Role

CACHE_CAPACITY_TOKENS = 3_000_000
"""A prefill instance's DRAM KV cache in FAST §5.3.2: the simulator's default, ``conductor
trace stats``' LRU and the decision bench's instances."""


SERIAL_PREFILL_LANES = 1
"""An engine's default ``prefill_lanes``: one prompt after another (vLLM without partial
prefills)."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Static facts about one engine instance."""

    instance_id: InstanceId
    role: Role
    kv_capacity_tokens: int | None = None  # None: the cost model's
    max_batch_size: int | None = None  # None: the cost model's
    nic_bytes_per_s: float | None = None
    rack: str = "rack0"
    cache_capacity_tokens: int | None = None
    pulls_kv: bool = True
    """Whether it can fetch KV blocks from another instance's cache (Algorithm 1's remote
    prefix). A gateway's engines cannot (no shared KV store between them): their plans reuse
    their own cache only, while their KV hand-offs to decode still take NIC time."""
    prefill_lanes: int = SERIAL_PREFILL_LANES
    """How many prompts its engine prefills side by side: vLLM with partial prefills caps a
    prompt's tokens per step (``long_prefill_token_threshold``), so ``max_num_batched_tokens
    // long_prefill_token_threshold`` prompts share each step and a short prompt does not
    wait for a long one to end; 1 (vLLM's default): one after another, first come first
    served. Read by :meth:`PrefillState.wait_s`."""
    prefill_chunk_tokens: int = 0
    """With ``prefill_lanes`` > 1, the most tokens of one prompt its engine computes per step
    (vLLM's ``long_prefill_token_threshold``): a prompt beside others then takes one step per
    chunk, each step as long as all their chunks together (:meth:`PrefillState.wait_s`); 0
    (unknown): processor sharing, as if chunks were infinitely small."""


@dataclass(slots=True)
class PrefillState:
    busy_until_s: float = 0.0
    queued_tokens: int = 0
    _pred_s: dict[RequestId, float] = field(default_factory=dict)
    _tokens: dict[RequestId, int] = field(default_factory=dict)
    _sum_pred_s: float = 0.0

    @property
    def queued_requests(self) -> int:
        return len(self._pred_s)

    def queue_s(self, now_s: float) -> float:
        q = self.busy_until_s - now_s
        return q if q > 0.0 else 0.0

    def wait_s(
        self, now_s: float, work_s: float, lanes: int, new_tokens: int = 0, chunk_tokens: int = 0
    ) -> float:
        """How long a new prefill of ``work_s`` seconds and ``new_tokens`` tokens would wait
        here: its predicted end less ``work_s``. With one lane, the queue (first come, first
        served). With ``lanes`` > 1, at most ``lanes`` prompts side by side, admitted first
        come first served, the queued ones' predicted times reduced, the oldest first, so
        that they sum to the backlog (what the running ones have done, their tokens in
        proportion), then :func:`lanes_end`: with ``chunk_tokens``, a short prompt beside a
        long one ends after one step, as long as its own chunk plus the long one's; without
        (0), processor sharing — it ends after about ``lanes x`` its own time."""
        q = self.queue_s(now_s)
        if q == 0.0 or lanes <= 1 or not self._pred_s:
            return q
        works = list(self._pred_s.values())
        tokens = [float(x) for x in self._tokens.values()]
        excess = self._sum_pred_s - q
        i = 0  # the oldest not done
        step_left = 0.0  # the part of the engine's current step still to run
        while excess > 0.0 and i < len(works):
            if works[i] <= excess:
                excess -= works[i]
                i += 1
            else:
                whole = tokens[i]
                tokens[i] *= (works[i] - excess) / works[i]
                works[i] -= excess
                excess = 0.0
                if chunk_tokens > 0:  # it is in the middle of a chunk: the step runs on
                    into = (whole - tokens[i]) % chunk_tokens
                    step_left = 1.0 - into / chunk_tokens if into > 0.0 else 0.0
        works.append(work_s)
        tokens.append(float(new_tokens))
        t = lanes_end(works, tokens, i, lanes, chunk_tokens, step_left)
        return t - work_s if t > work_s else 0.0

    def assign(self, rid: RequestId, predicted_s: float, new_tokens: int, now_s: float) -> float:
        """Queue ``rid``; returns its predicted prefill end."""
        start = self.busy_until_s if self.busy_until_s > now_s else now_s
        end = start + predicted_s
        self.busy_until_s = end
        self._pred_s[rid] = predicted_s
        self._sum_pred_s += predicted_s
        self._tokens[rid] = new_tokens
        self.queued_tokens += new_tokens
        return end

    def finish(self, rid: RequestId, now_s: float) -> None:
        """``rid``'s prefill ended at ``now_s``: FCFS, so what is left starts now and the
        instance is busy for the predicted time of the rest (prediction errors of finished
        requests do not accumulate)."""
        pred = self._pred_s.pop(rid, None)
        if pred is None:
            return
        self.queued_tokens -= self._tokens.pop(rid)
        if self._pred_s:
            self._sum_pred_s -= pred
            self.busy_until_s = now_s + self._sum_pred_s
        else:
            self._sum_pred_s = 0.0
            self.busy_until_s = now_s

    def drop(self, rid: RequestId) -> None:
        """Forget ``rid`` without it having run (cancelled, failed over)."""
        pred = self._pred_s.pop(rid, None)
        if pred is None:
            return
        self._sum_pred_s -= pred
        self.busy_until_s -= pred
        self.queued_tokens -= self._tokens.pop(rid)

    def clear(self, now_s: float) -> None:
        self._pred_s.clear()
        self._tokens.clear()
        self._sum_pred_s = 0.0
        self.queued_tokens = 0
        self.busy_until_s = now_s


JOIN_LOG = 512
"""How many recent decode starts a decode instance remembers: more than join it during any
one request's decode at the loads the cost models allow."""


@dataclass(slots=True)
class DecodeState:
    """The requests assigned to a decode instance, vLLM-style: each holds its prompt's KV now
    and a headroom for the output it is predicted to still generate (``prompt +
    max(expected output, generated so far)``), not its cap. ``running``: those whose decode
    has started (prefill done), the instance's *current* load; the others are reserved."""

    context_tokens: int = 0
    kv_reserved_tokens: int = 0
    running: int = 0
    running_kv_tokens: int = 0
    _ctx: dict[RequestId, int] = field(default_factory=dict)
    _kv: dict[RequestId, int] = field(default_factory=dict)
    _prompt: dict[RequestId, int] = field(default_factory=dict)
    _started: set[RequestId] = field(default_factory=set)
    join_times: list[float] = field(default_factory=list)
    """When the latest requests whose decode started here started, oldest first (never
    decreasing); at least the last :data:`JOIN_LOG`, at most twice as many."""
    join_stalls: list[float] = field(default_factory=list)
    """The seconds each one's KV load stalled the instance's step (``handoff="load"``; see
    :mod:`conductor.core.policies.join_stalls`), parallel to ``join_times``."""
    pending_stalls: dict[RequestId, float] = field(default_factory=dict)
    """The stalls of the requests assigned here whose decode has not started yet: each will
    stall the step when it joins (``handoff="load"``)."""
    pending_version: int = 0
    """Counts the changes of :attr:`pending_stalls` (for ``pending_memo``)."""
    pending_memo: tuple[int, int, int, int, float] = (-1, -1, -1, -1, 0.0)
    """``(first, end, k, pending_version, share)``: the last share computed with the
    pending stalls (:func:`~conductor.core.policies.join_stalls.join_stall_s`)."""
    stall_memo: tuple[int, int, int, float, list[float]] = field(
        default_factory=lambda: (-1, -1, -1, 0.0, [])
    )
    """``(first, end, k, share, top)``: the last stall share computed, of
    ``join_stalls[first:end]`` with ``k``, and the stalls it summed (newest first, or the
    ``k`` longest, longest first) (:func:`~conductor.core.policies.join_stalls.join_stall_s`)."""

    @property
    def batch_size(self) -> int:
        return len(self._ctx)

    def admit(
        self,
        rid: RequestId,
        prompt_tokens: int,
        output_tokens: int,
        *,
        started: bool = False,
        stall_s: float = 0.0,
    ) -> None:
        """Reserve ``prompt_tokens + output_tokens`` (the expected output) for ``rid``; its
        join will stall the step by ``stall_s`` (:attr:`pending_stalls`)."""
        if stall_s > 0.0 and not started:
            self.pending_stalls[rid] = stall_s
            self.pending_version += 1
        self._ctx[rid] = prompt_tokens
        self._prompt[rid] = prompt_tokens
        self._kv[rid] = prompt_tokens + output_tokens
        self.context_tokens += prompt_tokens
        self.kv_reserved_tokens += prompt_tokens + output_tokens
        if started:
            self.start(rid)

    def _unbook(self, rid: RequestId) -> None:
        """``rid`` no longer has a join to come: out of :attr:`pending_stalls`."""
        if self.pending_stalls and self.pending_stalls.pop(rid, None) is not None:
            self.pending_version += 1

    def start(self, rid: RequestId) -> None:
        """``rid``'s decode started (its prefill ended)."""
        self._unbook(rid)
        kv = self._kv.get(rid)
        if kv is None or rid in self._started:
            return
        self._started.add(rid)
        self.running += 1
        self.running_kv_tokens += kv

    def record_join(self, now_s: float, stall_s: float) -> None:
        """A request's decode started here at ``now_s``, its KV load stalling the step by
        ``stall_s`` (none: nothing to remember)."""
        if stall_s <= 0.0:
            return
        times = self.join_times
        if times and now_s < times[-1]:
            now_s = times[-1]  # an event out of order: the log stays sorted
        if len(times) >= 2 * JOIN_LOG:  # forget the oldest half, at once
            del times[:JOIN_LOG]
            del self.join_stalls[:JOIN_LOG]
            self.stall_memo = (-1, -1, -1, 0.0, [])
        times.append(now_s)
        self.join_stalls.append(stall_s)

    @property
    def joins(self) -> list[tuple[float, float]]:
        """``(time, stall_s)`` of the last :data:`JOIN_LOG` joins, oldest first."""
        return list(zip(self.join_times[-JOIN_LOG:], self.join_stalls[-JOIN_LOG:], strict=True))

    def progress(self, rid: RequestId, generated_tokens: int, expected_tokens: int) -> None:
        """``rid`` produced ``generated_tokens`` so far and is now expected to produce
        ``expected_tokens`` in all: its context grows, its reservation follows."""
        old = self._ctx.get(rid)
        if old is None:
            return
        prompt = self._prompt[rid]
        new = prompt + generated_tokens
        self._ctx[rid] = new
        self.context_tokens += new - old
        kv = prompt + max(expected_tokens, generated_tokens)
        grow = kv - self._kv[rid]
        self._kv[rid] = kv
        self.kv_reserved_tokens += grow
        if rid in self._started:
            self.running_kv_tokens += grow

    def release(self, rid: RequestId) -> None:
        self._unbook(rid)
        ctx = self._ctx.pop(rid, None)
        if ctx is None:
            return
        self._prompt.pop(rid)
        self.context_tokens -= ctx
        kv = self._kv.pop(rid)
        self.kv_reserved_tokens -= kv
        if rid in self._started:
            self._started.discard(rid)
            self.running -= 1
            self.running_kv_tokens -= kv

    def requests(self) -> list[RequestId]:
        return list(self._ctx)


@dataclass(slots=True)
class InstanceState:
    spec: InstanceSpec
    prefill: PrefillState = field(default_factory=PrefillState)
    decode: DecodeState = field(default_factory=DecodeState)
    healthy: bool = True
    draining: bool = False

    @property
    def instance_id(self) -> InstanceId:
        return self.spec.instance_id

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.draining


def lanes_end(
    works: list[float],
    tokens: list[float],
    i: int,
    lanes: int,
    chunk: int,
    step_left: float = 0.0,
) -> float:
    """When the last prefill of ``works`` (seconds; ``tokens`` to compute) ends, those from
    index ``i`` on taking at most ``lanes`` lanes side by side, first come first served.
    Each step computes a chunk of at most ``chunk`` tokens of every prompt in a lane and
    lasts as long as their chunks together (a prompt's chunks taken as equal shares of its
    time: the engine's step is the sum of its chunks' costs); ``step_left``: the fraction of
    a step the prompts in lanes are in the middle of, which the last one joins only after.
    ``chunk`` 0: processor sharing (each of the ``k`` prompts in a lane at ``1/k`` of the
    engine's speed). ``works`` is consumed."""
    me = len(works) - 1
    n = len(works)
    if chunk > 0:
        left = [max(1.0, math.ceil(x / chunk)) for x in tokens]
        if step_left > 0.0:
            left[i] += step_left - 1.0  # its current chunk is partly done
    else:
        left = [0.0] * n
    active = list(range(i, min(i + lanes, n)))
    nxt = i + len(active)
    t = 0.0
    partial = step_left if chunk > 0 else 0.0
    while True:
        if chunk > 0:
            if partial > 0.0:  # the step under way, without the newcomer
                stepping = [a for a in active if a != me]
                m = partial
                partial = 0.0
            else:
                stepping = active
                m = min(left[a] for a in active)
            step = 0.0
            for a in stepping:
                step += works[a] / left[a]
            t += m * step
            for a in stepping:
                works[a] -= m * works[a] / left[a]
                left[a] -= m
            done = [a for a in stepping if left[a] <= 1e-12]
        else:
            j = min(active, key=works.__getitem__)
            w = works[j]
            t += w * len(active)
            for a in active:
                works[a] -= w
            done = [j]
        if me in done:
            return t
        for a in done:
            active.remove(a)
        while len(active) < lanes and nxt < n:
            active.append(nxt)
            nxt += 1
