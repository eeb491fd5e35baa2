"""A decode engine's own prefix cache (``SimConfig.decode_cache``): vLLM keeps the blocks of
a finished request in its free GPU KV blocks, cached, until an allocation needs them, so a
later hand-off of a prompt that starts with them carries only the rest (its KV connector
asks for the tokens beyond the engine's local prefix hit).

Modelled as an LRU over the trace's block hashes holding finished requests' prompt blocks,
sized to the engine's free KV blocks whenever a request joins (its blocks are allocated) or
leaves (its prompt's blocks are kept): what no longer fits is evicted, least recently freed
first and, within a request, its tail before its head (as vLLM frees them). The
engine publishes what it stores and evicts as GPU-tier KV events, so the scheduler's view
is what a gateway subscribed to the decode engines' events has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from conductor.core.events import BlocksRemoved, BlocksStored, Event
from conductor.core.types import BlockHash, Role, Tier
from conductor.sim.nodes import Engine

Emit = Callable[[float, Event], None]


def has_decode_cache(node: Engine) -> bool:
    return node.cache is not None and node.role is Role.DECODE


def held_tokens(node: Engine, hashes: Sequence[BlockHash], block: int, prompt: int) -> int:
    """Leading prompt tokens ``node``'s decode cache holds (the last token is always sent:
    the hand-off carries at least one block)."""
    if not has_decode_cache(node):
        return 0
    assert node.cache is not None
    n = node.cache.prefix_blocks(hashes)
    return min(n * block, prompt - 1) if n else 0


def _room(node: Engine, block: int, extra_tokens: int) -> int:
    """The engine's free KV, in the hashes' blocks, less ``extra_tokens`` about to be
    allocated."""
    return max(0, (node.free_bound() * node.block - extra_tokens) // block)


def on_join(t: float, node: Engine, block: int, prompt: int, emit: Emit) -> None:
    """A request of ``prompt`` tokens joins ``node``: its blocks come out of the free ones."""
    if not has_decode_cache(node):
        return
    assert node.cache is not None
    evicted = node.cache.shrink(_room(node, block, prompt))
    if evicted:
        emit(t, BlocksRemoved(node.iid, tuple(evicted), Tier.GPU))


def on_leave(t: float, node: Engine, block: int, hashes: Sequence[BlockHash], emit: Emit) -> None:
    """A request left ``node`` (its blocks are free): its prompt's blocks stay cached."""
    if not has_decode_cache(node):
        return
    cache = node.cache
    assert cache is not None
    room = _room(node, block, 0)
    cache.capacity_blocks = room
    # most recent last, the chain's head last of all: vLLM frees a request's blocks tail
    # first, so its tail is evicted first and the reusable head stays longest
    stored, evicted = cache.insert(tuple(reversed(hashes[:room])))
    if evicted:
        emit(t, BlocksRemoved(node.iid, tuple(evicted), Tier.GPU))
    if stored:
        emit(t, BlocksStored(node.iid, tuple(stored), Tier.GPU))
