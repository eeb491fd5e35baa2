"""The state of simulated instances: one :class:`Engine` per instance (whatever its role),
the requests it holds (:class:`Seq`), chunked-pipeline groups and NICs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from conductor.core.plan import Plan
from conductor.core.types import InstanceId, Role
from conductor.sim.cache import LruBlockCache


@dataclass(slots=True)
class CppGroup:
    """The nodes of one chunked-pipeline prefill: ``remaining`` stages still running, each
    for ``compute_s`` (the whole pipelined time)."""

    remaining: int
    compute_s: float


class Seq:
    """One request on one engine (vLLM's ``Request`` in its scheduler).

    Prefill phase: ``computed`` of ``target`` tokens have KV here (``base`` of them were
    there when it was admitted: cached prefix, or 0 for a recompute); the step that computes
    the last of them emits a token. ``decodes``: it then decodes here (``remaining`` tokens
    still to emit, that one included); otherwise it leaves (a prefill-only engine).
    Decode phase: before step ``k`` it holds ``tok0 + (k - step0)`` tokens of KV, and step
    ``k`` writes one more; it emits its last token in step ``last``; its current run of
    token-emitting steps began at ``seg_first``. ``order``: when it was (last) admitted to
    the running set — the newest is preempted first. ``exclusive_s > 0``: a chunked-pipeline
    stage that runs alone for that long (``group``). ``load_s``: a decode that reads its
    prompt's KV itself (``handoff="load"``) adds this to the step that admits it.
    ``stored``: how many of its prompt's blocks its engine's prefix cache holds from it so
    far (a prefill's computed chunks are cached as they are computed, as in vLLM).
    ``fetch_pending``: waits for remote
    prefix blocks (skipped by admission until they arrive). ``factor``: its engine-cost job
    factor (:mod:`conductor.sim.perturb`); ``noise``: what its prefill chunks are multiplied
    by (the factor, times ``prefill_noise``'s draw)."""

    __slots__ = (
        "base",
        "blocks",
        "computed",
        "decodes",
        "exclusive_s",
        "factor",
        "fetch_pending",
        "group",
        "helper",
        "index",
        "last",
        "load_s",
        "noise",
        "order",
        "plan",
        "remaining",
        "seg_first",
        "started",
        "step0",
        "stored",
        "target",
        "tok0",
    )

    def __init__(
        self,
        index: int,
        plan: Plan | None,
        target: int,
        remaining: int,
        *,
        decodes: bool,
        computed: int = 0,
    ) -> None:
        self.index = index
        self.plan = plan
        self.target = target
        self.computed = computed
        self.base = computed
        self.remaining = remaining
        self.decodes = decodes
        self.blocks = 0
        self.order = 0
        self.tok0 = 0
        self.step0 = 0
        self.last = 0
        self.seg_first = 0
        self.noise = 1.0
        self.factor = 1.0
        self.started = False
        self.stored = 0
        self.fetch_pending = False
        self.exclusive_s = 0.0
        self.load_s = 0.0
        self.group: CppGroup | None = None
        self.helper = False


@dataclass(slots=True)
class Engine:
    """One instance under iteration-level scheduling (see :mod:`conductor.sim.engine`).

    ``waiting`` (FCFS; preempted requests go back to its front), ``prefilling`` (running
    partial prefills, in admission order) and ``decoding`` (running decodes by admission
    ``order``, oldest first). ``ctx``: the decoding requests' KV tokens *after* the next
    step (what the decode step time reads); ``pre_blocks``: blocks held by prefilling
    requests. ``finish_heap``: ``(last step, order)``, stale entries skipped.
    ``step_ends``: every step's end time (the TBT log). ``cache``: the prefix cache of a
    prefill-capable instance (DRAM, LRU). ``nic_in_free_s`` / ``nic_out_free_s``: when its
    NIC's ingress / egress is next free (FIFO per direction). ``fsum``: the decoding requests'
    job factors summed; ``obs``: decode steps, busy seconds, batch and context sums since the
    last ``DecodeStepsObserved`` report. ``ahead_t`` / ``ahead_d``: decode-only steps run
    ahead (:mod:`conductor.sim.cruise`): the end times of steps not yet applied to the
    fields above, and the duration of the step each one starts."""

    iid: InstanceId
    role: Role
    cache: LruBlockCache | None
    kv_blocks: int
    max_seqs: int
    budget: int
    long_threshold: int
    block: int
    waiting: deque[Seq] = field(default_factory=deque)
    prefilling: list[Seq] = field(default_factory=list)
    decoding: dict[int, Seq] = field(default_factory=dict)
    finish_heap: list[tuple[int, int]] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    ctx: int = 0
    pre_blocks: int = 0
    chunks: list[tuple[Seq, int]] = field(default_factory=list)
    exclusive: Seq | None = None
    stepping: bool = False
    preemptions: int = 0
    fsum: float = 0.0
    obs: list[float] = field(default_factory=lambda: [0, 0.0, 0, 0])
    nic_in_free_s: float = 0.0
    nic_out_free_s: float = 0.0
    ahead_t: list[float] = field(default_factory=list)
    ahead_d: list[float] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return len(self.decoding)

    @property
    def context_tokens(self) -> int:
        return self.ctx

    def free_bound(self) -> int:
        """Free blocks, counting each decoding request's partial block as full (a lower
        bound: exact when it says enough)."""
        n = len(self.decoding)
        return self.kv_blocks - self.pre_blocks - (self.ctx + n * (self.block - 1)) // self.block

    def decode_blocks(self, k: int) -> int:
        """The decoding requests' blocks after step ``k`` (exact)."""
        bs = self.block
        return sum(-(-(s.tok0 + 1 + k - s.step0) // bs) for s in self.decoding.values())

    def newest(self) -> Seq | None:
        """The running request admitted last (the next to preempt)."""
        p = self.prefilling[-1] if self.prefilling else None
        d = self.decoding[next(reversed(self.decoding))] if self.decoding else None
        if p is None or (d is not None and d.order > p.order):
            return d
        return p


def transfer(src: Engine, dst: Engine, earliest_s: float, seconds: float) -> float:
    """Move ``seconds`` of data from ``src`` to ``dst``: it holds ``src``'s egress and
    ``dst``'s ingress together, starting when both are free and not before ``earliest_s``
    (FIFO per NIC direction, in the order transfers are requested); returns its end."""
    start = max(earliest_s, src.nic_out_free_s, dst.nic_in_free_s)
    end = start + seconds
    src.nic_out_free_s = end
    dst.nic_in_free_s = end
    return end
