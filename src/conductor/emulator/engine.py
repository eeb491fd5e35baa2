"""The emulated engine's scheduler and model, one step at a time (no clock, no asyncio).

Each :meth:`EngineCore.step` is one engine iteration, like vLLM v1's with chunked prefill
(and like the simulator's engines, :mod:`conductor.sim.engine`, whose step rule this is):

1. **Decoding requests first**, one token each, one token of the step's budget each
   (``max_batched_tokens``, vLLM's ``max_num_batched_tokens``).
2. **Running partial prefills**, oldest first, each taking as much of the rest of the
   budget as its prompt still needs.
3. **Waiting requests, FCFS**, admitted while the budget lasts, the batch has room
   (``max_batch_size``) and the block pool can reserve the request's blocks; the head of
   the queue blocks those behind it. An admitted prompt takes what is left of the budget
   and goes on in later steps (chunked prefill). A request reuses the longest cached prefix
   of its prompt in whole blocks, at most ``prompt - 1`` tokens (the last prompt token is
   always computed). A decode leg (``kv_transfer_params.do_remote_prefill``) gets the rest
   of its full prompt blocks from the remote prefill engine: counted as *external* hits,
   paid as a KV transfer in the step that admits it.
4. A decoding request emits its next token; a request whose prompt's last token was
   computed in this step emits its first token. Full blocks whose KV is computed (a
   partial prefill's chunks too) become cached and are published (``Stored``); requests
   that reached ``max_tokens`` finish and free their blocks.

**Step time**, from :class:`~conductor.core.costmodel.CostModel`, the simulator's rule:
one forward pass per step. With ``P(N, e)`` the prefill time of ``N`` prompt tokens of
which ``e`` are already computed and ``F = P(1, 0)`` its fixed per-pass part, the step
costs ``decode_step_s(B, context)`` for its ``B`` decoding requests (``F`` when it has
none), plus ``P(e + c, e) - F`` for each prompt chunk of ``c`` tokens after ``e`` earlier
ones, plus the transfers of the decode legs it admits. A prompt alone thus takes ``P(N,
e)`` in one step. The driver (:mod:`conductor.emulator.loop`) decides how long that is in
wall time.

Block hashes are the engine's own: ``core.hashing.hash_block`` chained per request with
``engine_hash_seed`` (not the scheduler's seed, as a real engine's hashes are not ours).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from conductor.core.costmodel import CostModel
from conductor.core.errors import InvalidInput
from conductor.core.hashing import hash_block, hash_blocks
from conductor.core.types import BlockHash
from conductor.emulator.blocks import BlockPool, CacheEvent, Stored


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True)
class EngineRequest:
    """One request's state inside the engine.

    ``tokens`` = prompt + emitted tokens. ``hashes`` are the engine hashes of the request's
    first ``len(hashes)`` blocks, all cached and pinned by it; ``n_blocks - len(hashes)``
    blocks are private. ``out_ids``/``out_texts`` are the whole (deterministic) completion,
    decided at arrival; ``emitted`` counts those sent.
    """

    request_id: str
    prompt_ids: list[int]
    out_ids: list[int]
    out_texts: list[str]
    remote_prefill: bool = False
    status: Status = Status.WAITING
    tokens: list[int] = field(default_factory=list)
    prompt_hashes: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    n_blocks: int = 0
    reserved: int = 0
    emitted: int = 0
    cached_tokens: int = 0
    external_tokens: int = 0
    computed: int = 0
    """Prompt tokens whose KV is here (reused, loaded or computed); the prompt is done at
    ``prompt_tokens``."""
    finish_reason: str | None = None
    final_hashes: tuple[int, ...] = ()
    """The cached blocks the request held when it finished (a prefill leg's KV to hand over)."""

    @property
    def max_tokens(self) -> int:
        return len(self.out_ids)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True, slots=True)
class TokenOutput:
    """One emitted token: its index in the completion, and whether the request is done."""

    request: EngineRequest
    index: int
    finished: bool


@dataclass(frozen=True, slots=True)
class StepResult:
    duration_s: float
    outputs: list[TokenOutput]
    events: list[CacheEvent]
    prefilled: int
    """Requests with a prompt chunk in the step."""
    decoded: int


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters, in tokens unless named otherwise (vLLM's metric semantics)."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    busy_s: float = 0.0
    late_s: float = 0.0
    """Wall seconds by which steps' tokens were handed out after their planned end (the
    driver woke late or its own work ran over; :mod:`conductor.emulator.loop`)."""
    finished: dict[str, int] = field(default_factory=dict)


class EngineCore:
    """Chunked FCFS prefill + continuous-batching decode over a :class:`BlockPool`.

    Invariants: a request is in exactly one of ``waiting`` (FIFO), ``running`` (admission
    order) or neither (finished or aborted); a running request holds
    ``n_blocks - len(hashes)`` private blocks, pins its ``hashes`` and has ``reserved``
    blocks reserved, with ``n_blocks + reserved == ceil((prompt + max_tokens - 1) / block)``;
    a finished or aborted request holds nothing.
    """

    def __init__(
        self,
        cost: CostModel,
        *,
        block_size_tokens: int,
        cache_blocks: int,
        max_model_len: int,
        max_batch_size: int,
        max_batched_tokens: int,
        engine_hash_seed: int,
    ) -> None:
        self.cost = cost
        self.fixed_s = cost.prefill_s(1, 0)
        """The prefill model's fixed per-pass part (``F``), paid once per step."""
        self.block_size = block_size_tokens
        self.pool = BlockPool(cache_blocks)
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.max_batched_tokens = max_batched_tokens
        self.hash_seed = engine_hash_seed
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[str, EngineRequest] = {}
        self.counters = EngineCounters()

    # -- requests --------------------------------------------------------------------------

    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        """Blocks a request fills at most: the KV of every token but the last one sampled."""
        return -(-(prompt_tokens + max_tokens - 1) // self.block_size)

    def validate(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise :class:`InvalidInput` for a request this engine can never serve."""
        if prompt_tokens <= 0:
            raise InvalidInput("prompt", prompt_tokens, "the prompt must have at least 1 token")
        if max_tokens <= 0:
            raise InvalidInput("max_tokens", max_tokens, "must be at least 1")
        if prompt_tokens + max_tokens > self.max_model_len:
            raise InvalidInput(
                "max_tokens",
                max_tokens,
                f"this model's maximum context length is {self.max_model_len} tokens; "
                f"the request has {prompt_tokens} prompt tokens and asks for {max_tokens} more",
            )
        need = self.blocks_needed(prompt_tokens, max_tokens)
        if need > self.pool.capacity:
            raise InvalidInput(
                "max_tokens",
                max_tokens,
                f"the request needs {need} KV blocks; the cache has {self.pool.capacity}",
            )

    def add(self, request: EngineRequest) -> None:
        """Queue a request (validated first)."""
        self.validate(request.prompt_tokens, request.max_tokens)
        if request.status is not Status.WAITING or request.tokens:
            raise InvalidInput("request_id", request.request_id, "was already added")
        request.tokens = list(request.prompt_ids)
        request.prompt_hashes = [
            int(h) for h in hash_blocks(request.prompt_ids, self.block_size, seed=self.hash_seed)
        ]
        self.waiting.append(request)

    def abort(self, request: EngineRequest) -> None:
        """Drop a waiting or running request and free what it holds (no-op once finished)."""
        if request.status is Status.WAITING:
            try:
                self.waiting.remove(request)
            except ValueError:
                return
        elif request.status is Status.RUNNING:
            self._free(request)
            del self.running[request.request_id]
        else:
            return
        request.status = Status.ABORTED
        request.finish_reason = "abort"

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; refused (False) while requests hold blocks."""
        if self.running:
            return False
        return self.pool.clear()

    # -- the step --------------------------------------------------------------------------

    def step(self) -> StepResult:
        running = list(self.running.values())
        decoding = [r for r in running if r.computed >= r.prompt_tokens]
        budget = self.max_batched_tokens - len(decoding)
        chunks: list[tuple[EngineRequest, int]] = []
        for r in running:
            if budget <= 0:
                break
            if r.computed < r.prompt_tokens:
                c = min(r.prompt_tokens - r.computed, budget)
                chunks.append((r, c))
                budget -= c
        load_s = 0.0
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            req = self.waiting[0]
            planned = self._plan_prefill(req)
            if planned is None:
                break
            self.waiting.popleft()
            load_s += self._admit(req, *planned)
            c = min(req.prompt_tokens - req.computed, budget)
            chunks.append((req, c))
            budget -= c

        cost = self.cost
        fixed = self.fixed_s
        duration = load_s
        if decoding:
            context = sum(len(r.tokens) for r in decoding)
            duration += cost.decode_step_s(len(decoding), context)
        elif chunks:
            duration += fixed
        for r, c in chunks:
            duration += cost.prefill_s(r.computed + c, r.computed) - fixed
            r.computed += c
        outputs = [self._emit(r) for r in decoding]
        for r, _ in chunks:
            if r.computed >= r.prompt_tokens:
                outputs.append(self._emit(r))
            else:
                self._cache_full_blocks(r, computed=r.computed)
        self.counters.steps += 1
        self.counters.busy_s += duration
        return StepResult(
            duration_s=duration,
            outputs=outputs,
            events=self.pool.take_events(),
            prefilled=len(chunks),
            decoded=len(decoding),
        )

    def _plan_prefill(self, req: EngineRequest) -> tuple[int, int] | None:
        """``(local hit blocks, external blocks)`` if the pool can take ``req`` now."""
        max_reuse = (req.prompt_tokens - 1) // self.block_size
        hits = self.pool.match(req.prompt_hashes[:max_reuse])
        external = max_reuse - hits if req.remote_prefill else 0
        need = self.blocks_needed(req.prompt_tokens, req.max_tokens) - hits
        if not self.pool.can_admit(req.prompt_hashes[:hits], need):
            return None
        return hits, external

    def _admit(self, req: EngineRequest, hits: int, external_blocks: int) -> float:
        """Pin the reused prefix, reserve and allocate the prompt's blocks; the seconds its
        external blocks take to load (0 without)."""
        pool, bs = self.pool, self.block_size
        for h in req.prompt_hashes[:hits]:
            pool.pin(h)
        req.hashes = list(req.prompt_hashes[:hits])
        req.n_blocks = hits
        req.reserved = self.blocks_needed(req.prompt_tokens, req.max_tokens) - hits
        pool.reserve(req.reserved)
        while req.n_blocks * bs < req.prompt_tokens:
            self._take(req)
        req.cached_tokens = hits * bs
        req.external_tokens = external_blocks * bs
        req.status = Status.RUNNING
        self.running[req.request_id] = req
        c = self.counters
        c.prefix_queries += req.prompt_tokens
        c.prefix_hits += req.cached_tokens
        if req.remote_prefill:
            c.external_queries += req.prompt_tokens - req.cached_tokens
        c.external_hits += req.external_tokens
        c.prompt_tokens += req.prompt_tokens
        req.computed = req.cached_tokens + req.external_tokens
        return self.cost.transfer_s(req.external_tokens) if req.external_tokens else 0.0

    def _take(self, req: EngineRequest) -> None:
        self.pool.take()
        req.reserved -= 1
        req.n_blocks += 1

    def _emit(self, req: EngineRequest) -> TokenOutput:
        """Append the request's next token, cache newly computed full blocks, maybe finish."""
        index = req.emitted
        # This step computes the KV of every token so far (the last sampled one included).
        if len(req.tokens) > req.n_blocks * self.block_size:
            self._take(req)
        req.tokens.append(req.out_ids[index])
        req.emitted += 1
        self.counters.generation_tokens += 1
        # The KV of every token but the one just sampled is computed.
        self._cache_full_blocks(req, computed=len(req.tokens) - 1)
        finished = req.emitted >= req.max_tokens or len(req.tokens) >= self.max_model_len
        if finished:
            self._finish(req, "length")
        return TokenOutput(req, index, finished)

    def _cache_full_blocks(self, req: EngineRequest, computed: int) -> None:
        bs, pool = self.block_size, self.pool
        full = computed // bs
        start = len(req.hashes)
        if full <= start:
            return
        parent: int | None = req.hashes[-1] if req.hashes else None
        run: list[int] = []
        run_parent = parent
        run_start = start
        for i in range(start, full):
            if i < len(req.prompt_hashes):
                h = req.prompt_hashes[i]
            else:
                h = int(
                    hash_block(
                        None if parent is None else BlockHash(parent),
                        req.tokens[i * bs : (i + 1) * bs],
                        seed=self.hash_seed,
                    )
                )
            if pool.promote(h):
                if not run:
                    run_parent, run_start = parent, i
                run.append(h)
            elif run:
                self._publish_run(req, run, run_parent, run_start)
                run = []
            req.hashes.append(h)
            parent = h
        if run:
            self._publish_run(req, run, run_parent, run_start)

    def _publish_run(
        self, req: EngineRequest, run: Sequence[int], parent: int | None, start: int
    ) -> None:
        bs = self.block_size
        tokens = tuple(req.tokens[start * bs : (start + len(run)) * bs])
        self.pool.emit(Stored(tuple(run), parent, tokens))

    def _finish(self, req: EngineRequest, reason: str) -> None:
        req.final_hashes = tuple(req.hashes)
        self._free(req)
        del self.running[req.request_id]
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    def _free(self, req: EngineRequest) -> None:
        pool = self.pool
        pool.free_private(req.n_blocks - len(req.hashes))
        pool.release(reversed(req.hashes))
        pool.unreserve(req.reserved)
        req.reserved = 0
        req.n_blocks = 0
        req.hashes = []
