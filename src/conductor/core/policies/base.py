"""The policy interface: one small protocol, a context with the shared estimators, and the
candidate types policies return.

A prefill policy looks at a :class:`SchedulingContext` (request, prefix match, cluster state,
cost model) and returns a :class:`PrefillChoice`. Decode placement is a second, smaller
protocol; most policies use :func:`conductor.core.policies.decode.least_tbt`, and a
prefill policy may bring its own (see :class:`PrefillPolicy`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Protocol

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.core.decode_holdings import DecodeHoldings
from conductor.core.nic import NicBook
from conductor.core.output_length import UNKNOWN_OUTPUT, OutputEstimate
from conductor.core.prefix_index import PrefixIndex, PrefixMatch
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, Request


@dataclass(slots=True, init=False, unsafe_hash=True)
class PrefillChoice:
    """Where prefill runs and what it reuses; times are predictions in seconds."""

    instance: Final[InstanceId]
    local_tokens: Final[int]
    fetch_tokens: Final[int]
    fetch_source: Final[InstanceId | None]
    queue_s: Final[float]
    transfer_s: Final[float]
    prefill_s: Final[float]

    def __init__(
        self,
        instance: InstanceId,
        local_tokens: int,
        fetch_tokens: int,
        fetch_source: InstanceId | None,
        queue_s: float,
        transfer_s: float,
        prefill_s: float,
    ) -> None:
        self.instance = instance
        self.local_tokens = local_tokens
        self.fetch_tokens = fetch_tokens
        self.fetch_source = fetch_source
        self.queue_s = queue_s
        self.transfer_s = transfer_s
        self.prefill_s = prefill_s

    @property
    def cached_tokens(self) -> int:
        return self.local_tokens + self.fetch_tokens

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.transfer_s + self.prefill_s


@dataclass(slots=True, init=False, unsafe_hash=True)
class DecodeChoice:
    instance: Final[InstanceId]
    tbt_s: Final[float]
    fits: Final[bool]

    def __init__(self, instance: InstanceId, tbt_s: float, fits: bool) -> None:
        self.instance = instance
        self.tbt_s = tbt_s
        self.fits = fits


@dataclass(slots=True, init=False)
class SchedulingContext:
    """What a policy may read. Estimators are methods so that policies share one formula.

    A context lives for one decision: :meth:`prefill_s` memoises the cost model for it
    (many instances share a prefix length, so the same prediction recurs).
    """

    request: Request
    now_s: float
    match: PrefixMatch
    prefill_pool: Sequence[InstanceState]
    decode_pool: Sequence[InstanceState]
    cost: CostModel
    config: SchedulerConfig
    rng: random.Random
    round_robin_counter: int
    output: OutputEstimate = UNKNOWN_OUTPUT
    """The request's predicted output (:mod:`conductor.core.output_length`), never its
    true length."""
    nic: NicBook | None = None
    """Booked NIC transfers (:mod:`conductor.core.nic`): a fetch's wait is priced in."""
    decode_index: DecodeHoldings | None = None
    """What the decode-only instances hold (their KV events), read by
    :meth:`decode_cached_tokens`."""
    index: PrefixIndex | None = None
    """The prefix index (what each instance's cache holds), read by :meth:`evicted_blocks`."""
    eviction_regret: float = 0.0
    """The measured chance that a block an engine evicts is needed again
    (:mod:`conductor.core.eviction_regret`)."""
    _prefill_memo: dict[int, float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _decode_held: dict[InstanceId, int] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __init__(
        self,
        request: Request,
        now_s: float,
        match: PrefixMatch,
        prefill_pool: Sequence[InstanceState],
        decode_pool: Sequence[InstanceState],
        cost: CostModel,
        config: SchedulerConfig,
        rng: random.Random,
        round_robin_counter: int,
        output: OutputEstimate = UNKNOWN_OUTPUT,
        nic: NicBook | None = None,
        decode_index: DecodeHoldings | None = None,
        index: PrefixIndex | None = None,
        eviction_regret: float = 0.0,
    ) -> None:
        self.request = request
        self.now_s = now_s
        self.match = match
        self.prefill_pool = prefill_pool
        self.decode_pool = decode_pool
        self.cost = cost
        self.config = config
        self.rng = rng
        self.round_robin_counter = round_robin_counter
        self.output = output
        self.nic = nic
        self.decode_index = decode_index
        self.index = index
        self.eviction_regret = eviction_regret
        self._prefill_memo = {}
        self._decode_held = None

    @property
    def ttft_slo_s(self) -> float:
        """The request's TTFT SLO, else the configuration's."""
        return self.request.ttft_slo_s or self.config.ttft_slo_s

    @property
    def tbt_slo_s(self) -> float:
        """The request's TBT SLO, else the configuration's."""
        return self.request.tbt_slo_s or self.config.tbt_slo_s

    def prefill_s(self, cached_tokens: int) -> float:
        """``cost.prefill_s(prompt_tokens, cached_tokens)`` for this request (memoised)."""
        t = self._prefill_memo.get(cached_tokens)
        if t is None:
            t = self.cost.prefill_s(self.request.prompt_tokens, cached_tokens)
            self._prefill_memo[cached_tokens] = t
        return t

    def decode_cached_tokens(self, decode: InstanceId) -> int:
        """Prompt tokens whose KV ``decode`` already holds (its own prefix cache, e.g. an
        earlier turn of the conversation it decoded): a hand-off to it carries only the
        rest. 0 for an instance that publishes no KV events, or one that prefills."""
        held = self.decode_held_blocks()
        blocks = held.get(decode, 0) if held else 0
        return self.tokens(blocks) if blocks else 0

    def decode_held_blocks(self) -> dict[InstanceId, int]:
        """Leading blocks of the prompt each decode-only instance holds (absent: none)."""
        held = self._decode_held
        if held is None:
            index = self.decode_index
            held = {} if index is None else index.held_blocks(self.request.block_hashes)
            self._decode_held = held
        return held

    def handoff_tokens(self, decode: InstanceId) -> int:
        """Prompt tokens a hand-off to ``decode`` carries (all but what it holds)."""
        return self.request.prompt_tokens - self.decode_cached_tokens(decode)

    def nic_wait_s(self, source: InstanceId | None, target: InstanceId) -> float:
        """How long a fetch from ``source`` to ``target`` would wait for their NICs."""
        return 0.0 if self.nic is None else self.nic.wait_s(source, target, self.now_s)

    def evicted_blocks(self, inst: InstanceState, stored_blocks: int) -> int:
        """Blocks of other prompts ``inst``'s prefix cache would evict to store
        ``stored_blocks`` more: beyond its size less what it holds (KV events) and what its
        queued prefills will store (0 when its size is unknown)."""
        cap = inst.spec.cache_capacity_tokens
        if cap is None or self.index is None or stored_blocks <= 0:
            return 0
        bs = self.config.block_size_tokens
        held = self.index.local_count(inst.spec.instance_id)
        room = cap // bs - held - -(-inst.prefill.queued_tokens // bs)
        over = stored_blocks - (room if room > 0 else 0)
        return over if over > 0 else 0

    def tokens(self, blocks: int) -> int:
        """Reusable tokens covered by ``blocks`` leading blocks: the last block may be
        partial, and the last prompt token is always computed (it yields the first token)."""
        t = blocks * self.config.block_size_tokens
        most = self.request.prompt_tokens - 1
        return t if t < most else most

    def local_tokens(self, inst: InstanceState) -> int:
        return self.tokens(self.match.local_blocks.get(inst.spec.instance_id, 0))

    def best_tokens(self) -> int:
        return self.tokens(self.match.best_blocks)

    def fetch_source(self, target: InstanceId) -> InstanceId | None:
        """The holder of the best prefix to fetch from (the first that is not ``target``)."""
        for h in self.match.best_holders:
            if h != target:
                return h
        return None

    def wait_s(self, inst: InstanceState, compute_s: float, cached_tokens: int) -> float:
        """How long a prefill of ``compute_s`` seconds, reusing ``cached_tokens`` of the
        prompt, would wait on ``inst`` now: its queue, or with an engine that prefills
        several prompts side by side (``prefill_lanes``) the wait beside the others
        (:meth:`~conductor.core.state.PrefillState.wait_s`)."""
        spec = inst.spec
        lanes = spec.prefill_lanes
        if lanes > 1:
            new = self.request.prompt_tokens - cached_tokens
            chunk = spec.prefill_chunk_tokens
            return inst.prefill.wait_s(self.now_s, compute_s, lanes, new, chunk)
        return inst.prefill.queue_s(self.now_s)

    def local_choice(self, inst: InstanceState) -> PrefillChoice:
        """Compute on ``inst`` reusing only its own cache."""
        local = self.local_tokens(inst)
        compute = self.prefill_s(local)
        return PrefillChoice(
            inst.spec.instance_id,
            local,
            0,
            None,
            self.wait_s(inst, compute, local),
            0.0,
            compute,
        )

    def fetch_choice(self, inst: InstanceState) -> PrefillChoice:
        """Fetch the best remote prefix to ``inst`` and compute the rest there (the transfer
        time includes the wait for the two NICs)."""
        iid = inst.spec.instance_id
        local = self.local_tokens(inst)
        best = self.best_tokens()
        source = self.fetch_source(iid)
        if source is None or best <= local or not inst.spec.pulls_kv:
            return self.local_choice(inst)
        fetch = best - local
        bw = inst.spec.nic_bytes_per_s
        compute = self.prefill_s(best)
        return PrefillChoice(
            iid,
            local,
            fetch,
            source,
            self.wait_s(inst, compute, best),
            self.cost.transfer_s(fetch, bw) + self.nic_wait_s(source, iid),
            compute,
        )


class PrefillPolicy(Protocol):
    """Chooses the prefill instance. A policy object that also has a ``choose_decode``
    method (the :class:`DecodePolicy` signature) brings its own decode placement:
    :class:`~conductor.core.scheduler.Scheduler` uses it unless a decode policy is passed
    explicitly; otherwise decode placement is :func:`~conductor.core.policies.decode.least_tbt`.
    """

    name: ClassVar[str]

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice: ...


class DecodePolicy(Protocol):
    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice: ...


def argmin_ttft(choices: Sequence[PrefillChoice]) -> PrefillChoice:
    """The smallest predicted TTFT; ties go to the earliest candidate (deterministic)."""
    best = choices[0]
    best_t = best.ttft_s
    for c in choices[1:]:
        t = c.ttft_s
        if t < best_t:
            best, best_t = c, t
    return best
