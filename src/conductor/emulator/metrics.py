"""``GET /metrics``: Prometheus text exposition with vLLM's metric names and meanings.

Counters count tokens (``prefix_cache_*``, ``prompt_tokens``, ``generation_tokens``) or
requests, as vLLM's do; ``kv_cache_usage_perc`` is the fraction (0-1) of blocks held by
running requests (cached but unused blocks count as free, as in vLLM). Every sample carries
``model_name`` and ``engine`` labels. ``conductor_emulator_*`` series are the emulator's own.
"""

from __future__ import annotations

from conductor.emulator.engine import EngineCore
from conductor.emulator.publisher import PublisherStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(
    core: EngineCore,
    *,
    model_name: str,
    engine: str = "0",
    publisher: PublisherStats | None = None,
) -> str:
    """The exposition text for ``core``'s current state."""
    labels = f'model_name="{_escape(model_name)}",engine="{_escape(engine)}"'
    c = core.counters
    pool = core.pool
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        base = name.removesuffix("_total") if kind == "counter" else name
        lines.append(f"# HELP {base} {help_text}")
        lines.append(f"# TYPE {base} {kind}")
        lines.append(f"{name}{{{labels}{extra}}} {float(value)!r}")

    family(
        "vllm:num_requests_running", "gauge", "Requests in the running batch.", len(core.running)
    )
    family(
        "vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", len(core.waiting)
    )
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = 100%.", pool.usage)
    family(
        "vllm:cache_config_info",
        "gauge",
        "Information of the KV cache configuration.",
        1.0,
        f',block_size="{core.block_size}",num_gpu_blocks="{pool.capacity}"',
    )
    family(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in queried tokens.",
        c.prefix_queries,
    )
    family(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in cached tokens.",
        c.prefix_hits,
    )
    family(
        "vllm:external_prefix_cache_queries_total",
        "counter",
        "External prefix cache queries from the KV connector, in queried tokens.",
        c.external_queries,
    )
    family(
        "vllm:external_prefix_cache_hits_total",
        "counter",
        "External prefix cache hits from the KV connector, in cached tokens.",
        c.external_hits,
    )
    family("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.", c.prompt_tokens)
    family(
        "vllm:generation_tokens_total",
        "counter",
        "Generation tokens processed.",
        c.generation_tokens,
    )
    family("vllm:num_preemptions_total", "counter", "Cumulative preemptions.", 0)
    base = "vllm:request_success"
    lines.append(f"# HELP {base} Finished requests, by finish reason.")
    lines.append(f"# TYPE {base} counter")
    for reason in sorted({"length", *c.finished}):
        extra = f',finished_reason="{_escape(reason)}"'
        lines.append(f"{base}_total{{{labels}{extra}}} {float(c.finished.get(reason, 0))!r}")
    family("conductor_emulator_steps_total", "counter", "Engine steps run.", c.steps)
    family(
        "conductor_emulator_busy_seconds_total",
        "counter",
        "Cost-model seconds of the steps run (before the speedup).",
        c.busy_s,
    )
    family(
        "conductor_emulator_late_seconds_total",
        "counter",
        "Wall seconds by which steps' tokens were handed out after their planned end.",
        c.late_s,
    )
    family("conductor_emulator_cached_blocks", "gauge", "Blocks in the prefix cache.", pool.cached)
    family("conductor_emulator_cache_capacity_blocks", "gauge", "KV cache size.", pool.capacity)
    if publisher is not None:
        family(
            "conductor_emulator_kv_event_batches_total",
            "counter",
            "KV event batches published.",
            publisher.batches,
        )
        family(
            "conductor_emulator_kv_events_total",
            "counter",
            "KV events published.",
            publisher.events,
        )
    return "\n".join(lines) + "\n"
