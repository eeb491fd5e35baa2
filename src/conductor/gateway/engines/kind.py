"""The :class:`EngineKind` protocol: the seam between the gateway and one kind of engine.

A kind says how to subscribe to an engine's KV events, how to read the load it reports, how
to check its health, and how its prefill and decode legs carry one request in disaggregated
mode. Implementations are stateless objects registered by name in
:mod:`conductor.gateway.engines.registry`; the first is :mod:`conductor.gateway.engines.vllm`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import httpx
import zmq.asyncio

from conductor.core.events import KvEvent
from conductor.gateway.kv_feed import EngineKvIngest, KvFeed

if TYPE_CHECKING:
    from conductor.gateway.config import EngineConfig


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """What an engine says about itself (summed over its label sets, e.g. DP ranks)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """Fraction 0..1 of the KV cache in use."""


class EngineKind(Protocol):
    """One kind of engine, as the gateway sees it (see the module docstring).

    Disaggregated flow: the prefill leg's answer comes back before the decode leg is sent,
    and :meth:`decode_body` may read it (vLLM's ``kv_transfer_params``); ``transfer_params``
    is the gateway's ``upstream.kv_transfer_params`` switch (the connector needs them).
    """

    name: str

    def kv_feed(
        self,
        config: EngineConfig,
        ingest: EngineKvIngest,
        queue: asyncio.Queue[KvEvent],
        context: zmq.asyncio.Context,
    ) -> KvFeed | None:
        """The engine's KV-event feed into ``queue`` (None: it publishes no events)."""
        ...

    async def probe_health(
        self, client: httpx.AsyncClient, base_url: str, timeout_s: float
    ) -> str | None:
        """None if the engine is healthy, else a short reason (``timeout``, ``status 503``)."""
        ...

    async def read_load(
        self, client: httpx.AsyncClient, base_url: str, timeout_s: float
    ) -> ReportedLoad:
        """The load the engine reports; raises ``httpx.HTTPError`` or ``ValueError``."""
        ...

    def prefill_body(
        self, body: Mapping[str, object], model: str, *, transfer_params: bool
    ) -> dict[str, object]:
        """The prefill leg's request body (disaggregated mode)."""
        ...

    def decode_body(
        self,
        body: Mapping[str, object],
        model: str,
        prefill_answer: bytes,
        *,
        transfer_params: bool,
    ) -> dict[str, object]:
        """The decode leg's request body, given the prefill leg's answer."""
        ...
