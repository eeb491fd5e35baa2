"""What a load run is (:class:`LoadSpec`), what it records (:class:`Samples`), and the prompts
it sends; shared by every client and run kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
MODEL = "bench"
RUN_OFFSET = 100_000_000
"""Run ``k`` numbers its requests (so its unique prompt suffixes) from ``k * RUN_OFFSET``, and
its warm-up from half that: no run finds another's suffixes in the engines' caches."""


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One load: ``requests`` streamed completions (at most ``duration_s`` seconds,
    ``concurrency`` in flight) to ``url`` with ``client``, after ``warmup`` unmeasured ones."""

    url: str
    requests: int
    duration_s: float
    concurrency: int
    max_tokens: int
    prompt_tokens: int
    shared_prefix_tokens: int
    prefix_groups: int
    warmup: int
    timeout_s: float
    client: str = "raw"
    offset: int = 0
    """First request index (a process's share of the load)."""


@dataclass(slots=True)
class Samples:
    """What a load recorded: ``ttft_s`` and ``e2e_s`` hold one entry per successful request
    (in the same order), failures only count in ``errors`` (the first 5 explained)."""

    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0

    def merge(self, other: Samples) -> None:
        self.ttft_s += other.ttft_s
        self.e2e_s += other.e2e_s
        self.errors += other.errors
        self.error_examples = (self.error_examples + other.error_examples)[:5]
        self.wall_s = max(self.wall_s, other.wall_s)
        self.tokens += other.tokens


def prompt_for(i: int, spec: LoadSpec) -> str:
    """Request ``i``'s prompt: its group's shared prefix, then a unique suffix (1 char = 1
    token for the emulator's byte tokenizer)."""
    group = i % spec.prefix_groups
    prefix = (f"[group {group}] shared system prompt. " * 64)[: spec.shared_prefix_tokens]
    suffix = (f" request {i} asks something unique." * 64)[
        : max(1, spec.prompt_tokens - len(prefix))
    ]
    return prefix + suffix


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        raise SystemExit(f"refusing to load {url}: only loopback addresses are allowed")


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80
