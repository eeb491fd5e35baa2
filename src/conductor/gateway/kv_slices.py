"""Big KV-event batches, cut into slices so that translating them (a hash per block) never
holds the event loop for long: a 1M-block batch once stalled the gateway 6.6 s.

:func:`slices` splits a batch's events into runs of at most ``max_blocks_per_slice`` blocks;
a BlockStored longer than that is split into consecutive BlockStored events chained by
their parent hash (translating them one after the other gives the same hashes as the whole
event). An event claiming more blocks than the engine may hold at all is dropped here,
before any hashing, and counted by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from conductor.wire.events import EngineBlockRemoved, EngineBlockStored, EngineEvent

SLICE_BLOCKS = 2048
"""Blocks translated between two turns of the event loop."""


def blocks_in(events: Sequence[EngineEvent]) -> int:
    """How many blocks the events name."""
    return sum(
        len(e.engine_hashes)
        for e in events
        if isinstance(e, EngineBlockStored | EngineBlockRemoved)
    )


def split_stored(event: EngineBlockStored, size: int) -> Iterator[EngineBlockStored]:
    """``event`` as consecutive pieces of at most ``size`` blocks, each chained to the
    last block of the piece before."""
    n, bs = len(event.engine_hashes), event.block_size
    if n <= size or len(event.token_ids) != n * bs:
        yield event  # (a malformed one is counted whole by the mapper)
        return
    parent = event.parent_engine_hash
    for start in range(0, n, size):
        end = min(n, start + size)
        yield EngineBlockStored(
            engine_hashes=event.engine_hashes[start:end],
            parent_engine_hash=parent,
            token_ids=event.token_ids[start * bs : end * bs],
            block_size=bs,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=event.extra_keys[start:end],
            group_idx=event.group_idx,
        )
        parent = event.engine_hashes[end - 1]


def slices(
    events: Sequence[EngineEvent], max_blocks_per_slice: int, max_event_blocks: int | None
) -> tuple[list[list[EngineEvent]], int]:
    """``events`` in runs of at most ``max_blocks_per_slice`` blocks (an event without blocks
    rides along), and how many events were dropped for naming more than
    ``max_event_blocks`` blocks."""
    out: list[list[EngineEvent]] = [[]]
    in_slice = dropped = 0
    for event in events:
        if not isinstance(event, EngineBlockStored | EngineBlockRemoved):
            out[-1].append(event)
            continue
        if max_event_blocks is not None and len(event.engine_hashes) > max_event_blocks:
            dropped += 1
            continue
        pieces: Iterator[EngineEvent] = (
            split_stored(event, max_blocks_per_slice)
            if isinstance(event, EngineBlockStored)
            else iter((event,))
        )
        for piece in pieces:
            assert isinstance(piece, EngineBlockStored | EngineBlockRemoved)
            n = len(piece.engine_hashes)
            if in_slice and in_slice + n > max_blocks_per_slice:
                out.append([])
                in_slice = 0
            out[-1].append(piece)
            in_slice += n
    return [s for s in out if s], dropped
