"""What the scheduler keeps of a request it placed, until it leaves (:class:`InFlight`)."""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.nic import Transfers
from conductor.core.output_length import OutputEstimate
from conductor.core.types import InstanceId, Request


@dataclass(slots=True)
class InFlight:
    """A placed request: where it prefills (``cpp_nodes``: the pipelined group, if any) and
    decodes (None until chosen, ``baseline`` admission), its predicted output, whether its
    prefill ended, and the KV transfers its plan booked (what a replica publishes)."""

    request: Request
    prefill: InstanceId
    decode: InstanceId | None
    output: OutputEstimate
    cpp_nodes: tuple[InstanceId, ...] = ()
    prefill_done: bool = False
    transfers: Transfers | None = None
    stall_s: float = 0.0
    """How long its decode engine's step stalls loading its KV (``handoff="load"``)."""
