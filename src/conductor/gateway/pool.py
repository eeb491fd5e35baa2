"""One model's pool: its scheduler, tokenizer, engines and the parts around them.

A :class:`ModelPool` is what one model needs to be served: its own
:class:`~conductor.core.scheduler.Scheduler` (prefix index, load, admission, output-length
prediction: a hot model cannot starve another's decisions), its tokenizer and chat
template, its engines (:class:`~conductor.gateway.membership.EngineSet`), their KV-event
pump, their monitor loops, its late-binding queue (:class:`~conductor.gateway.hold.Hold`,
released when its engines change too), its request path and its metrics. :class:`Pools`
holds them by model name, in config order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from conductor.core.errors import InvalidInput
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId
from conductor.gateway.config import GatewayConfig
from conductor.gateway.engines.handle import EngineHandle
from conductor.gateway.errors import NotFound
from conductor.gateway.hold import Hold
from conductor.gateway.kv_pump import KvPump
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import GatewayMetrics
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.monitor import Monitor
from conductor.gateway.request_path import RequestPath
from conductor.gateway.tokenizer import PromptTokenizer

Clock = Callable[[], float]


class ModelPool:
    """One model's scheduler, tokenizer, engines, monitor, request path and metrics."""

    def __init__(
        self,
        config: GatewayConfig,
        model: ModelConfig,
        conductor: Scheduler,
        tokenizer: PromptTokenizer,
        metrics: GatewayMetrics,
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        if conductor.config.block_size_tokens != model.block_size_tokens:
            raise InvalidInput(
                "block_size",
                conductor.config.block_size_tokens,
                f"scheduler and model {model.name!r} disagree ({model.block_size_tokens})",
            )
        self.model = model
        self.conductor = conductor
        self.tokenizer = tokenizer
        self.metrics = metrics.pool(model.name)
        self.members = EngineSet(model, config.monitor, conductor, self.metrics)
        self.hold = Hold(conductor, clock, self.metrics)
        self.members.changed = self.hold.engines_changed
        self.metrics.count_held(self.hold.__len__)
        self.kv = KvPump(self.members, conductor, self.metrics, wall_clock)
        self.monitor = Monitor(
            self.members,
            self.kv,
            config.monitor,
            self.metrics,
            clock,
            check_all_models=config.several_models,
        )
        self.requests = RequestPath(
            config, model, conductor, tokenizer, self.members, self.metrics, clock, self.hold
        )

    @property
    def name(self) -> str:
        return self.model.name

    def can_serve(self) -> bool:
        return self.members.can_serve()

    def describe(self) -> dict[str, object]:
        """The pool as the admin API shows it."""
        snaps = self.members.snapshot()
        cfg = self.conductor.config
        return {
            "name": self.model.name,
            "served_name": self.model.upstream_name,
            "max_model_len": self.model.max_model_len,
            "block_size": self.model.block_size_tokens,
            "policy": self.conductor.policy_name,
            "admission": cfg.admission,
            "ttft_slo_s": cfg.ttft_slo_s,
            "tbt_slo_s": cfg.tbt_slo_s,
            "engines": [s.engine_id for s in snaps],
            "healthy_engines": sum(1 for s in snaps if s.healthy),
            "can_serve": self.can_serve(),
            "inflight_requests": self.conductor.inflight(),
            **self.hold.describe(),
        }


class Pools:
    """The gateway's model pools by name, in config order (the first is the default of the
    one-model API: ``Gateway.conductor`` and the like). ``name_known``: a 404 for an
    unknown model lists the known ones (off: the one-model shorthand's message)."""

    def __init__(self, pools: list[ModelPool], *, name_known: bool = True) -> None:
        if not pools:
            raise InvalidInput("models", [], "none given")
        self._pools = {p.name: p for p in pools}
        self._name_known = name_known

    def __iter__(self) -> Iterator[ModelPool]:
        return iter(self._pools.values())

    def __len__(self) -> int:
        return len(self._pools)

    @property
    def first(self) -> ModelPool:
        return next(iter(self._pools.values()))

    def names(self) -> list[str]:
        return list(self._pools)

    def get(self, name: str) -> ModelPool:
        """The pool of model ``name``; 404 naming the known models otherwise."""
        pool = self._pools.get(name)
        if pool is None:
            message = f"The model `{name}` does not exist."
            if self._name_known:
                message += " Known models: " + ", ".join(f"`{n}`" for n in self._pools) + "."
            raise NotFound(message, param="model")
        return pool

    def of_engine(self, engine_id: str) -> ModelPool | None:
        """The pool holding engine ``engine_id`` (None: no pool has it)."""
        for pool in self._pools.values():
            if InstanceId(engine_id) in pool.members.engines:
                return pool
        return None

    def engines(self) -> dict[InstanceId, EngineHandle]:
        """Every pool's engines (a new dict)."""
        out: dict[InstanceId, EngineHandle] = {}
        for pool in self._pools.values():
            out.update(pool.members.engines)
        return out
