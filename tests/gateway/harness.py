"""Helpers for in-process gateway tests: a deterministic tokenizer, gateway factories, and
HTTP servers (:mod:`conductor.web`) on 127.0.0.1 running in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Sequence

import httpx

from conductor.core.config import SchedulerConfig
from conductor.core.policies import policy_config_defaults
from conductor.core.policies.colocated import ColocatedDecode
from conductor.core.scheduler import Scheduler
from conductor.core.types import Role
from conductor.gateway import app as gateway_app
from conductor.gateway.config import EngineConfig, GatewayConfig, MonitorConfig, UpstreamConfig
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.service import Gateway
from conductor.gateway.tokenizer import PromptTokenizer
from conductor.web.router import Router
from conductor.web.server import running
from tests.engines.costs import committed_cost

BLOCK = 4
MODEL = "tiny"
TOKEN = "test-admin-token"
MAX_MODEL_LEN = 256


class FakeTokenizer:
    """One token per character (ids 100 + ord % 1000), BOS 1 with special tokens; chat is
    ``<role>content\\n`` per message, then ``<assistant>`` for the generation prompt."""

    vocab_size = 1200

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids = [100 + ord(c) % 1000 for c in text]
        return [1, *ids] if add_special_tokens else ids

    def render_chat(
        self,
        messages: Sequence[dict[str, object]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: Sequence[object] | None,
        template_kwargs: dict[str, object],
    ) -> str:
        text = "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def engine(
    engine_id: str,
    url: str,
    role: Role = Role.BOTH,
    kv_events: str | None = None,
    model: str | None = None,
) -> EngineConfig:
    return EngineConfig(
        engine_id=engine_id,
        url=url,
        role=role,
        kv_events=kv_events,
        model=model,
        block_size_tokens=BLOCK,
    )


def make_gateway(
    engines: Sequence[EngineConfig],
    *,
    policy: str = "conductor",
    ttft_slo_s: float = 30.0,
    admission: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    admin_token: str | None = TOKEN,
    upstream: UpstreamConfig | None = None,
    monitor: MonitorConfig | None = None,
    max_body_bytes: int = 64 * 1024,
    clock: Callable[[], float] | None = None,
) -> Gateway:
    defaults = policy_config_defaults(policy)
    sched = SchedulerConfig(
        block_size_tokens=BLOCK,
        ttft_slo_s=ttft_slo_s,
        admission=admission or str(defaults.get("admission", "off")),
        cpp_enabled=False,
    )
    conductor = Scheduler(committed_cost(), policy=policy, config=sched)
    conductor.decode_policy = ColocatedDecode(conductor.decode_policy)
    cfg = GatewayConfig(
        model_name=MODEL,
        max_model_len=MAX_MODEL_LEN,
        block_size_tokens=BLOCK,
        engines=tuple(engines),
        admin_token=admin_token,
        max_body_bytes=max_body_bytes,
        upstream=upstream or UpstreamConfig(connect_timeout_s=2.0, request_timeout_s=20.0),
        monitor=monitor
        or MonitorConfig(health_interval_s=0.2, health_timeout_s=1.0, load_interval_s=0.2),
    )
    if clock is not None:
        return Gateway(cfg, conductor, FakeTokenizer(), transport=transport, clock=clock)
    return Gateway(cfg, conductor, FakeTokenizer(), transport=transport)


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def serve(app: Router) -> AsyncIterator[str]:
    """Serve ``app`` in this loop on a free port; yields its base URL."""
    async with running(app) as server:
        yield f"http://127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def client_for(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway served over real HTTP (its background tasks running), and a client."""
    server = gateway_app.server(gateway)
    async with gateway_app.lifespan(gateway):
        await server.start()
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{server.port}", timeout=30.0
            ) as client:
                yield client
        finally:
            await server.shutdown(2.0)


def closed_port_url() -> str:
    """An http URL on which nothing listens (connection refused)."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def admin_headers(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_models_gateway(
    models: Sequence[tuple[ModelConfig, PromptTokenizer]],
    engines: Sequence[EngineConfig],
    *,
    policy: str = "conductor",
    admin_token: str | None = TOKEN,
    monitor: MonitorConfig | None = None,
    ttft_slo_s: float = 30.0,
) -> Gateway:
    """A gateway serving several models (``[[models]]``): one scheduler (committed cost
    model, ``policy``, ``ttft_slo_s``) and tokenizer each."""
    pools: dict[str, tuple[Scheduler, PromptTokenizer]] = {}
    for model, tokenizer in models:
        defaults = policy_config_defaults(policy)
        sched = SchedulerConfig(
            block_size_tokens=model.block_size_tokens,
            ttft_slo_s=ttft_slo_s,
            admission=str(defaults.get("admission", "off")),
            cpp_enabled=False,
            context_tokens=model.max_model_len,
        )
        conductor = Scheduler(committed_cost(), policy=policy, config=sched)
        conductor.decode_policy = ColocatedDecode(conductor.decode_policy)
        pools[model.name] = (conductor, tokenizer)
    cfg = GatewayConfig.for_models(
        tuple(m for m, _ in models),
        engines=tuple(engines),
        admin_token=admin_token,
        upstream=UpstreamConfig(connect_timeout_s=2.0, request_timeout_s=20.0),
        monitor=monitor
        or MonitorConfig(health_interval_s=0.1, health_timeout_s=1.0, load_interval_s=0.2),
    )
    return Gateway(cfg, pools=pools)
