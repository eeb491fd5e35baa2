"""Read and write request trace files (see :mod:`conductor.workload.trace_format` for the line
format), find the bundled Mooncake trace, and turn records into scheduler requests.

:func:`read_trace` stops at the first invalid line (a :class:`TraceError` naming the line and
the field), or, with ``skip_invalid=True``, skips it and records it in
:attr:`TraceReadResult.skipped`. Timestamps need not be monotonic: records are **sorted
stably by timestamp** after reading (equal timestamps keep file order; ``line_no`` keeps the
original position).
"""

from __future__ import annotations

import gzip
import io
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import IO, NamedTuple, cast

from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.workload.max_tokens import NO_MAX_TOKENS, MaxTokens
from conductor.workload.trace_format import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    TraceError,
    TraceRecord,
    blocks_needed,
    format_line,
    is_int,
    parse_line,
)

__all__ = [
    "SkippedLine",
    "TraceReadResult",
    "bundled_trace_path",
    "generated_tokens",
    "read_trace",
    "records_to_requests",
    "split_by_model",
    "write_trace",
]

_GZIP_MAGIC = b"\x1f\x8b"
_BUNDLED_TRACE = "data/conversation_trace.jsonl.gz"


class SkippedLine(NamedTuple):
    """A line :func:`read_trace` skipped with ``skip_invalid=True``."""

    line_no: int
    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class TraceReadResult:
    """What :func:`read_trace` returns: records sorted by timestamp, and the skipped lines."""

    records: list[TraceRecord]
    skipped: list[SkippedLine]


PathOrFile = str | os.PathLike[str] | IO[bytes] | IO[str]


def _read_bytes(path_or_file: PathOrFile) -> bytes:
    """The file's content; paths ending in ``.gz`` and gzip-magic streams are decompressed."""
    if isinstance(path_or_file, str | os.PathLike):
        path = Path(path_or_file)
        raw = path.read_bytes()
        return gzip.decompress(raw) if path.suffix.lower() == ".gz" else raw
    content = path_or_file.read()
    data = content.encode("utf-8") if isinstance(content, str) else content
    return gzip.decompress(data) if data.startswith(_GZIP_MAGIC) else data


def read_trace(
    path_or_file: PathOrFile,
    *,
    limit: int | None = None,
    skip_invalid: bool = False,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
) -> TraceReadResult:
    """Read a Mooncake-format (or token-form) JSONL trace, optionally gzip-compressed.

    ``path_or_file`` is a path (gzip when its suffix is ``.gz``) or an open file (binary or
    text; a binary stream starting with the gzip magic is decompressed). ``limit`` stops after
    that many valid records in file order (later lines are not read). Records come back
    **sorted stably by timestamp**. Raises :class:`TraceError` on the first invalid line, or,
    with ``skip_invalid=True``, skips such lines and lists them in ``skipped``.
    """
    if limit is not None and (not is_int(limit) or limit < 0):
        raise InvalidInput("limit", limit, "must be a non-negative integer or None")
    if not is_int(block_size_tokens) or block_size_tokens < 1:
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be a positive integer")
    records: list[TraceRecord] = []
    skipped: list[SkippedLine] = []
    for line_no, line in enumerate(_read_bytes(path_or_file).split(b"\n"), start=1):
        if limit is not None and len(records) >= limit:
            break
        if not line.strip():
            continue
        try:
            records.append(parse_line(line, line_no, block_size_tokens))
        except TraceError as exc:
            if not skip_invalid:
                raise
            skipped.append(SkippedLine(exc.line_no, exc.field, exc.why))
    records.sort(key=lambda record: record.timestamp_ms)
    return TraceReadResult(records, skipped)


def bundled_trace_path() -> Path:
    """Path of the packaged Mooncake conversation trace (gzip JSONL, 12,031 requests).

    Source: kvcache-ai/Mooncake ``FAST25-release/traces/conversation_trace.jsonl``,
    Apache-2.0 (see ``conductor/data/NOTICE``).
    """
    resource = files("conductor").joinpath(_BUNDLED_TRACE)
    if not isinstance(resource, Path):  # pragma: no cover - zipped installs only
        raise FileNotFoundError(f"bundled trace {_BUNDLED_TRACE} is not on the file system")
    return resource


def records_to_requests(
    records: Iterable[TraceRecord],
    *,
    speed: float = 1.0,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
    max_tokens: MaxTokens = NO_MAX_TOKENS,
) -> list[Request]:
    """Turn trace records into scheduler requests, replayed ``speed`` times faster.

    Request ``i`` (in the given order) gets id ``r{i}``, ``arrival_s =
    timestamp_ms / 1000 / speed``, the record's prompt length, ``max_tokens`` as
    ``max_tokens`` says (the true output length is *not* in the request: see
    :func:`generated_tokens`), and its ``hash_ids`` as block hashes.
    Raises :class:`InvalidInput` when ``speed`` is not a finite number > 0 or a record's
    ``hash_ids`` do not cover ``ceil(input_length / block_size_tokens)`` blocks.
    """
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise InvalidInput("speed", speed, "must be a finite number > 0")
    if not (math.isfinite(speed) and speed > 0):
        raise InvalidInput("speed", speed, "must be a finite number > 0")
    if not is_int(block_size_tokens) or block_size_tokens < 1:
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be a positive integer")
    requests: list[Request] = []
    for index, record in enumerate(records):
        needed = blocks_needed(record.input_length, block_size_tokens)
        if len(record.hash_ids) != needed:
            why = f"has {len(record.hash_ids)} ids, needs {needed} for {record.input_length} tokens"
            raise InvalidInput(f"records[{index}].hash_ids", len(record.hash_ids), why)
        requests.append(
            Request(
                request_id=RequestId(f"r{index}"),
                prompt_tokens=record.input_length,
                # BlockHash is a NewType of int: the ids are already the right values.
                block_hashes=cast(tuple[BlockHash, ...], record.hash_ids),
                max_tokens=max_tokens.sent(record.output_length),
                arrival_s=record.timestamp_ms / 1000 / speed,
            )
        )
    return requests


def generated_tokens(
    records: Iterable[TraceRecord], max_tokens: MaxTokens = NO_MAX_TOKENS
) -> list[int]:
    """What a simulated engine generates for each record (the trace's output length, capped
    by ``cap:N``), in order: the simulator's ground truth, never shown to the scheduler."""
    return [max_tokens.generated(r.output_length) for r in records]


def split_by_model(records: Iterable[TraceRecord]) -> dict[str, list[TraceRecord]]:
    """``records`` per model (:attr:`TraceRecord.model_name`: records without a model are
    the default model's), models in order of first appearance, records in the given order."""
    out: dict[str, list[TraceRecord]] = {}
    for record in records:
        out.setdefault(record.model_name, []).append(record)
    return out


def write_trace(records: Iterable[TraceRecord], path: str | os.PathLike[str]) -> None:
    """Write ``records`` as Mooncake JSONL; gzip (reproducible: no name, mtime 0) for ``.gz``."""
    target = Path(path)
    if target.suffix.lower() == ".gz":
        with (
            target.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
            io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as text,
        ):
            text.writelines(map(format_line, records))
    else:
        with target.open("w", encoding="utf-8", newline="\n") as text:
            text.writelines(map(format_line, records))
