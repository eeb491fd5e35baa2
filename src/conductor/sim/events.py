"""The simulator's events and their queue: what happens next, in one total order.

Each kind of event is a small slotted class with typed fields. The queue is a heap of
``(time, seq, event)``: ``seq`` counts pushes, so it is unique and breaks every tie and the
event itself is never compared; a run is a pure function of (requests, config).
"""

from __future__ import annotations

from heapq import heappop, heappush

from conductor.core.events import Event
from conductor.core.types import BlockHash, InstanceId
from conductor.sim.nodes import Engine, Seq


class Arrival:
    """Request ``index`` of the trace arrives."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class FetchDone:
    """``fetched`` blocks of ``seq``'s prefix arrived at its prefill engine."""

    __slots__ = ("fetched", "seq")

    def __init__(self, seq: Seq, fetched: tuple[BlockHash, ...]) -> None:
        self.seq = seq
        self.fetched = fetched


class DecodeJoin:
    """Request ``index``'s KV cache reached decode instance ``decode``."""

    __slots__ = ("decode", "index")

    def __init__(self, decode: InstanceId, index: int) -> None:
        self.decode = decode
        self.index = index


class EngineStep:
    """A step (one scheduler iteration: prefill chunks and decode tokens) of ``engine``
    ended.

    One per engine, made once and pushed again for every step: an engine has at most one
    step in flight, so no two copies are ever in the queue (no allocation on the
    simulator's hottest path). ``live`` is False once the step it stood for was cut short
    (:mod:`conductor.sim.cruise`): the copy left in the queue is then skipped."""

    __slots__ = ("engine", "live")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.live = True


class KvEventDue:
    """The scheduler now sees ``event`` (published ``kv_event_delay_s`` earlier)."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


class CopyDone:
    """A background replica copy of ``hashes`` reached ``engine``."""

    __slots__ = ("engine", "hashes")

    def __init__(self, engine: Engine, hashes: tuple[BlockHash, ...]) -> None:
        self.engine = engine
        self.hashes = hashes


class Dispatch:
    """A placed request reaches its prefill engine (``dispatch_latency_s`` after its plan)."""

    __slots__ = ("node", "seq")

    def __init__(self, node: Engine, seq: Seq) -> None:
        self.node = node
        self.seq = seq


class Reported:
    """The scheduler hears that ``seq``'s prefill ended on ``node`` (``report_latency_s``
    after it did)."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


class Wakeup:
    """Late binding: a held request may be placed now (:mod:`conductor.core.late_binding`)."""

    __slots__ = ()


SimEvent = (
    Arrival
    | FetchDone
    | DecodeJoin
    | EngineStep
    | KvEventDue
    | CopyDone
    | Wakeup
    | Dispatch
    | Reported
)


class EventQueue:
    """Events by ``(time, seq)``; ``seq`` is the number of pushes so far (unique)."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, SimEvent]] = []
        self.seq = 0

    def push(self, t: float, event: SimEvent) -> None:
        self.seq += 1
        heappush(self.heap, (t, self.seq, event))

    def pop(self) -> tuple[float, int, SimEvent]:
        return heappop(self.heap)
