"""Read and write request traces (Mooncake JSONL and a token-level form).

Two line forms are accepted, one JSON object per line (blank lines are ignored, unknown keys
are ignored):

* **Mooncake form** (kvcache-ai/Mooncake ``FAST25-release/traces``)::

      {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, ...]}

  ``timestamp`` is the arrival time in milliseconds, lengths are token counts and
  ``hash_ids`` are remapped chained hashes of the prompt's blocks of ``block_size_tokens``
  (512) tokens, the last block possibly partial: ``len(hash_ids) == ceil(input_length / 512)``.
* **Token form**: ``timestamp``, ``output_length`` and ``prompt_token_ids`` (a list of token
  ids, each in ``[0, 2**32)``) instead of ``input_length`` / ``hash_ids``. The tokens are
  hashed into blocks of ``block_size_tokens`` with a chained xxh3-64 hash (see
  :func:`_chain_hash`); as in Mooncake's convention the last partial block also gets a hash,
  so both forms satisfy the same length invariant. ``input_length`` may be given too, but must
  equal ``len(prompt_token_ids)``; ``hash_ids`` may not.

Validation: every field must be a non-negative integer (``input_length`` must be positive: an
empty prompt is invalid), ``hash_ids`` ids lie in ``[0, 2**64)``. A bad line raises
:class:`TraceError`, whose message names the 1-based line number and the field, e.g.
``line 17: field 'input_length': must be a positive integer, got -3``; with
``skip_invalid=True`` the line is skipped and recorded in :attr:`TraceReadResult.skipped`.

Timestamps need not be monotonic: records are **sorted stably by timestamp** after reading
(equal timestamps keep file order; ``line_no`` keeps the original position).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import IO, NamedTuple, cast

import msgspec
import xxhash

from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId

__all__ = [
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "SkippedLine",
    "TraceError",
    "TraceReadResult",
    "TraceRecord",
    "bundled_trace_path",
    "read_trace",
    "records_to_requests",
    "write_trace",
]

DEFAULT_BLOCK_SIZE_TOKENS = 512
"""Mooncake's block size: ``hash_ids`` cover blocks of this many tokens."""

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_HASH_ID = 2**64  # exclusive
_MAX_TOKEN_ID = 2**32  # exclusive: token ids are hashed as little-endian uint32
_CHAIN_HASH_SEED = 0
"""Explicit xxh3-64 seed of :func:`_chain_hash`."""
_ROOT_PARENT_HASH = 0
"""Parent hash fed to the first block of a prompt."""
_RECORD_FIELD = "<record>"
"""Pseudo field name for whole-line problems (bad JSON, not an object)."""
_BUNDLED_TRACE = "data/conversation_trace.jsonl.gz"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace, in Mooncake's terms.

    Invariant (checked by :func:`read_trace`): ``input_length >= 1``, ``output_length >= 0``,
    ``timestamp_ms >= 0`` and ``len(hash_ids) == ceil(input_length / block_size_tokens)``.
    ``line_no`` is the 1-based line the record came from (0 when it was not read from a file).
    """

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line_no: int = 0


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


class TraceError(InvalidInput):
    """A trace line is invalid; the message names the line number and the field."""

    def __init__(self, line_no: int, field: str, value: object, why: str) -> None:
        super().__init__(field, value, why)
        self.line_no = line_no
        self.args = (f"line {line_no}: field {field!r}: {why}",)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[type[TraceError], tuple[int, str, object, str]]:
        return (type(self), (self.line_no, self.field, self.value, self.why))


class _MooncakeLine(msgspec.Struct):
    """Fast-path schema of a well-formed Mooncake line (any failure goes to the slow path)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


_FAST_DECODER = msgspec.json.Decoder(_MooncakeLine)

PathOrFile = str | os.PathLike[str] | IO[bytes] | IO[str]


def _chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """xxh3-64 of ``parent`` (8 bytes LE) followed by ``tokens`` (each a LE uint32).

    TODO: switch to ``conductor.core.hashing`` when it exists (this local helper only
    serves the token form of traces).
    """
    payload = parent.to_bytes(8, "little") + struct.pack(f"<{len(tokens)}I", *tokens)
    return int(xxhash.xxh3_64_intdigest(payload, seed=_CHAIN_HASH_SEED))


def _hash_prompt(tokens: Sequence[int], block_size_tokens: int) -> tuple[int, ...]:
    """Chained hashes of ``tokens`` per block, the last partial block included."""
    hashes: list[int] = []
    parent = _ROOT_PARENT_HASH
    for start in range(0, len(tokens), block_size_tokens):
        parent = _chain_hash(parent, tokens[start : start + block_size_tokens])
        hashes.append(parent)
    return tuple(hashes)


def _blocks_needed(input_length: int, block_size_tokens: int) -> int:
    return -(-input_length // block_size_tokens)


def _describe(value: object) -> str:
    """A short rendering of an offending value for error messages."""
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else None
    if text is None:
        text = f"a {'list' if isinstance(value, list) else type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(obj: dict[str, object], field: str, line_no: int, *, minimum: int, what: str) -> int:
    if field not in obj:
        raise TraceError(line_no, field, None, "missing")
    value = obj[field]
    if not _is_int(value) or cast(int, value) < minimum:
        raise TraceError(line_no, field, value, f"must be {what}, got {_describe(value)}")
    return cast(int, value)


def _int_list_field(
    obj: dict[str, object], field: str, line_no: int, *, below: int, what: str
) -> list[int]:
    value = obj[field]
    if not isinstance(value, list):
        raise TraceError(line_no, field, value, f"must be a list of {what}, got {_describe(value)}")
    for index, item in enumerate(value):
        if not _is_int(item) or not 0 <= item < below:
            raise TraceError(
                line_no,
                field,
                item,
                f"must be a list of {what}, got {_describe(item)} at index {index}",
            )
    return cast(list[int], value)


def _parse_slow(line: bytes, line_no: int, block_size_tokens: int) -> TraceRecord:
    """Validate one line field by field; raises :class:`TraceError` naming the first fault."""
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as exc:
        raise TraceError(line_no, _RECORD_FIELD, line, f"not valid UTF-8 ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        why = f"invalid JSON ({exc.msg} at column {exc.colno})"
        raise TraceError(line_no, _RECORD_FIELD, line, why) from exc
    if not isinstance(obj, dict):
        why = f"must be a JSON object, got {type(obj).__name__}"
        raise TraceError(line_no, _RECORD_FIELD, obj, why)
    timestamp = _int_field(
        obj, "timestamp", line_no, minimum=0, what="a non-negative integer (milliseconds)"
    )
    positive = "a positive integer (an empty prompt is invalid)"
    if "prompt_token_ids" in obj:
        if "hash_ids" in obj:
            why = "not allowed together with 'prompt_token_ids'"
            raise TraceError(line_no, "hash_ids", obj["hash_ids"], why)
        tokens = _int_list_field(
            obj, "prompt_token_ids", line_no, below=_MAX_TOKEN_ID, what="token ids in [0, 2**32)"
        )
        if not tokens:
            raise TraceError(line_no, "prompt_token_ids", tokens, "must not be empty")
        if "input_length" in obj:
            given = _int_field(obj, "input_length", line_no, minimum=1, what=positive)
            if given != len(tokens):
                why = f"{given} does not match len(prompt_token_ids) = {len(tokens)}"
                raise TraceError(line_no, "input_length", given, why)
        input_length = len(tokens)
        hash_ids = _hash_prompt(tokens, block_size_tokens)
    else:
        input_length = _int_field(obj, "input_length", line_no, minimum=1, what=positive)
        if "hash_ids" not in obj:
            raise TraceError(line_no, "hash_ids", None, "missing")
        hash_ids = tuple(
            _int_list_field(
                obj, "hash_ids", line_no, below=_MAX_HASH_ID, what="integers in [0, 2**64)"
            )
        )
    output_length = _int_field(
        obj, "output_length", line_no, minimum=0, what="a non-negative integer"
    )
    _check_block_count(line_no, input_length, hash_ids, block_size_tokens)
    return TraceRecord(timestamp, input_length, output_length, hash_ids, line_no)


def _check_block_count(
    line_no: int, input_length: int, hash_ids: tuple[int, ...], block_size_tokens: int
) -> None:
    needed = _blocks_needed(input_length, block_size_tokens)
    if len(hash_ids) != needed:
        why = (
            f"has {len(hash_ids)} ids, but input_length {input_length} needs "
            f"ceil({input_length}/{block_size_tokens}) = {needed}"
        )
        raise TraceError(line_no, "hash_ids", len(hash_ids), why)


def _parse_line(line: bytes, line_no: int, block_size_tokens: int) -> TraceRecord:
    """Fast typed decode for well-formed Mooncake lines, field-by-field checks otherwise."""
    try:
        fast = _FAST_DECODER.decode(line)
    except msgspec.MsgspecError:
        return _parse_slow(line, line_no, block_size_tokens)
    if (
        fast.timestamp < 0
        or fast.input_length < 1
        or fast.output_length < 0
        or len(fast.hash_ids) != _blocks_needed(fast.input_length, block_size_tokens)
        or (fast.hash_ids and (min(fast.hash_ids) < 0 or max(fast.hash_ids) >= _MAX_HASH_ID))
    ):
        return _parse_slow(line, line_no, block_size_tokens)
    return TraceRecord(
        fast.timestamp, fast.input_length, fast.output_length, fast.hash_ids, line_no
    )


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
    if limit is not None and (not _is_int(limit) or limit < 0):
        raise InvalidInput("limit", limit, "must be a non-negative integer or None")
    if not _is_int(block_size_tokens) or block_size_tokens < 1:
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be a positive integer")
    records: list[TraceRecord] = []
    skipped: list[SkippedLine] = []
    for line_no, line in enumerate(_read_bytes(path_or_file).split(b"\n"), start=1):
        if limit is not None and len(records) >= limit:
            break
        if not line.strip():
            continue
        try:
            records.append(_parse_line(line, line_no, block_size_tokens))
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
) -> list[Request]:
    """Turn trace records into scheduler requests, replayed ``speed`` times faster.

    Request ``i`` (in the given order) gets id ``r{i}``, ``arrival_s =
    timestamp_ms / 1000 / speed``, the record's lengths, and its ``hash_ids`` as block
    hashes. Raises :class:`InvalidInput` when ``speed`` is not a finite number > 0 or a
    record's ``hash_ids`` do not cover ``ceil(input_length / block_size_tokens)`` blocks.
    """
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise InvalidInput("speed", speed, "must be a finite number > 0")
    if not (math.isfinite(speed) and speed > 0):
        raise InvalidInput("speed", speed, "must be a finite number > 0")
    if not _is_int(block_size_tokens) or block_size_tokens < 1:
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be a positive integer")
    requests: list[Request] = []
    for index, record in enumerate(records):
        needed = _blocks_needed(record.input_length, block_size_tokens)
        if len(record.hash_ids) != needed:
            why = f"has {len(record.hash_ids)} ids, needs {needed} for {record.input_length} tokens"
            raise InvalidInput(f"records[{index}].hash_ids", len(record.hash_ids), why)
        requests.append(
            Request(
                request_id=RequestId(f"r{index}"),
                prompt_tokens=record.input_length,
                # BlockHash is a NewType of int: the ids are already the right values.
                block_hashes=cast(tuple[BlockHash, ...], record.hash_ids),
                output_tokens=record.output_length,
                arrival_s=record.timestamp_ms / 1000 / speed,
            )
        )
    return requests


def _lines(records: Iterable[TraceRecord]) -> Iterator[str]:
    for record in records:
        # Same key order and separators as Mooncake's files (a read/write round trip of
        # the conversation trace reproduces it byte for byte).
        yield (
            json.dumps(
                {
                    "timestamp": record.timestamp_ms,
                    "input_length": record.input_length,
                    "output_length": record.output_length,
                    "hash_ids": list(record.hash_ids),
                }
            )
            + "\n"
        )


def write_trace(records: Iterable[TraceRecord], path: str | os.PathLike[str]) -> None:
    """Write ``records`` as Mooncake JSONL; gzip (reproducible: no name, mtime 0) for ``.gz``."""
    target = Path(path)
    if target.suffix.lower() == ".gz":
        with (
            target.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
            io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as text,
        ):
            text.writelines(_lines(records))
    else:
        with target.open("w", encoding="utf-8", newline="\n") as text:
            text.writelines(_lines(records))
