"""What the scheduler keeps of a request it placed, until it leaves (:class:`InFlight`)."""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.nic import Transfers
from conductor.core.output_length import OutputEstimate
from conductor.core.types import InstanceId, Request


@dataclass(slots=True, init=False)
class InFlight:
    """A placed request: where it prefills (``cpp_nodes``: the pipelined group, if any) and
    decodes (None until chosen, ``baseline`` admission), its predicted output, whether its
    prefill ended, and the KV transfers its plan booked (what a replica publishes)."""

    request: Request
    prefill: InstanceId
    decode: InstanceId | None
    output: OutputEstimate
    cpp_nodes: tuple[InstanceId, ...]
    prefill_done: bool
    transfers: Transfers | None
    stall_s: float
    """How long its decode engine's step stalls loading its KV (``handoff="load"``)."""

    def __init__(
        self,
        request: Request,
        prefill: InstanceId,
        decode: InstanceId | None,
        output: OutputEstimate,
        cpp_nodes: tuple[InstanceId, ...] = (),
        prefill_done: bool = False,
        transfers: Transfers | None = None,
        stall_s: float = 0.0,
    ) -> None:
        self.request = request
        self.prefill = prefill
        self.decode = decode
        self.output = output
        self.cpp_nodes = cpp_nodes
        self.prefill_done = prefill_done
        self.transfers = transfers
        self.stall_s = stall_s
