"""The replica-sync messages on the wire (msgspec, msgpack) and the transport protocol.

Every replica publishes on one subject and hears every other replica there:

- :class:`Batch` — this replica's reservation events since its last batch (plans committed,
  decode chosen, prefills finished, requests released), numbered by ``seq`` (1, 2, ...; a
  receiver that sees a gap asks for a snapshot).
- :class:`Heartbeat` — "alive", with the ``seq`` of the last batch sent (so a lost last batch
  is noticed too) and the number of reservations it holds.
- :class:`SnapshotRequest` — "send me your reservations" (a gap, or a replica first heard of).
- :class:`Snapshot` — every reservation the replica holds, as of batch ``seq``.
- :class:`Bye` — the replica is leaving: drop its reservations now.

Messages are ``array_like`` tagged structs (compact, and decoded without a schema lookup).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from conductor.core.nic import Transfers
from conductor.core.replication import (
    DecodeReserved,
    PrefillDone,
    Released,
    ReservationEvent,
    Reserved,
)
from conductor.core.types import InstanceId, RequestId


class WTransfers(msgspec.Struct, array_like=True, frozen=True):
    prefill: str
    fetch_source: str | None
    fetch_s: float
    decode: str | None
    handoff_start_s: float
    handoff_request_s: float
    handoff_s: float


class WReserved(msgspec.Struct, tag="r", array_like=True, frozen=True):
    request_id: str
    prefill: list[str]
    prefill_s: float
    new_tokens: int
    decode: str | None
    prompt_tokens: int
    output_mean: float
    output_high: float
    output_cap: int
    ttft_s: float
    prefill_done: bool = False
    transfers: WTransfers | None = None


class WDecodeReserved(msgspec.Struct, tag="d", array_like=True, frozen=True):
    request_id: str
    decode: str


class WPrefillDone(msgspec.Struct, tag="p", array_like=True, frozen=True):
    request_id: str


class WReleased(msgspec.Struct, tag="f", array_like=True, frozen=True):
    request_id: str
    completed: bool
    output_tokens: int | None = None


WEvent = WReserved | WDecodeReserved | WPrefillDone | WReleased


class Batch(msgspec.Struct, tag="b", array_like=True, frozen=True):
    replica: str
    seq: int
    events: list[WEvent]


class Heartbeat(msgspec.Struct, tag="h", array_like=True, frozen=True):
    replica: str
    seq: int
    reservations: int


class SnapshotRequest(msgspec.Struct, tag="q", array_like=True, frozen=True):
    replica: str
    target: str


class Snapshot(msgspec.Struct, tag="s", array_like=True, frozen=True):
    replica: str
    seq: int
    reservations: list[WReserved]


class Bye(msgspec.Struct, tag="x", array_like=True, frozen=True):
    replica: str


Message = Batch | Heartbeat | SnapshotRequest | Snapshot | Bye

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    """One message; raises ``msgspec.DecodeError`` (a ``ValueError``) if malformed."""
    return _decoder.decode(data)


def reserved_to_wire(r: Reserved) -> WReserved:
    return WReserved(
        r.request_id,
        list(r.prefill),
        r.prefill_s,
        r.new_tokens,
        r.decode,
        r.prompt_tokens,
        r.output_mean,
        r.output_high,
        r.output_cap,
        r.ttft_s,
        r.prefill_done,
        None if r.transfers is None else transfers_to_wire(r.transfers),
    )


def transfers_to_wire(t: Transfers) -> WTransfers:
    return WTransfers(
        t.prefill,
        t.fetch_source,
        t.fetch_s,
        t.decode,
        t.handoff_start_s,
        t.handoff_request_s,
        t.handoff_s,
    )


def transfers_from_wire(w: WTransfers) -> Transfers:
    return Transfers(
        InstanceId(w.prefill),
        None if w.fetch_source is None else InstanceId(w.fetch_source),
        w.fetch_s,
        None if w.decode is None else InstanceId(w.decode),
        w.handoff_start_s,
        w.handoff_request_s,
        w.handoff_s,
    )


def to_wire(e: ReservationEvent) -> WEvent:
    match e:
        case Reserved():
            return reserved_to_wire(e)
        case DecodeReserved(rid, decode_):
            return WDecodeReserved(rid, decode_)
        case PrefillDone(rid):
            return WPrefillDone(rid)
        case Released(rid, completed, out):
            return WReleased(rid, completed, out)


def reserved_from_wire(w: WReserved) -> Reserved:
    return Reserved(
        RequestId(w.request_id),
        tuple(InstanceId(p) for p in w.prefill),
        w.prefill_s,
        w.new_tokens,
        None if w.decode is None else InstanceId(w.decode),
        w.prompt_tokens,
        w.output_mean,
        w.output_high,
        w.output_cap,
        w.ttft_s,
        w.prefill_done,
        None if w.transfers is None else transfers_from_wire(w.transfers),
    )


def from_wire(w: WEvent) -> ReservationEvent:
    match w:
        case WReserved():
            return reserved_from_wire(w)
        case WDecodeReserved(rid, decode_):
            return DecodeReserved(RequestId(rid), InstanceId(decode_))
        case WPrefillDone(rid):
            return PrefillDone(RequestId(rid))
        case WReleased(rid, completed, out):
            return Released(RequestId(rid), completed, out)


Handler = Callable[[bytes], None]
StateCallback = Callable[[bool, str], Awaitable[None] | None]


class Transport(Protocol):
    """What a sync backend provides (one module per transport; NATS first).

    ``start`` connects, retrying until it succeeds or the task is cancelled, and calls
    ``on_state(connected, why)`` on every change of connectivity; ``publish`` sends one
    message to every replica (returns False when it could not: disconnected); received
    messages (this replica's own excluded) go to ``on_message``."""

    @property
    def connected(self) -> bool: ...

    async def start(self, on_message: Handler, on_state: StateCallback) -> None: ...

    async def publish(self, data: bytes) -> bool: ...

    async def close(self) -> None: ...
