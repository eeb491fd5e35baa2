"""One line of a request trace: the Mooncake JSONL format (and a token-level form), parsed and
validated into a :class:`TraceRecord`, and rendered back.

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

Either form may name the request's model: ``"model": "llama-8b"`` (a non-empty string). A
record without one is for the default model (:data:`DEFAULT_MODEL` where a name is needed),
so single-model traces need no such key; ``conductor simulate`` replays a trace naming several
models over one pool per model (docs/simulator.md, "Several models"). Two models' ``hash_ids``
name different blocks even when the numbers are equal: a model's blocks live in its own pool.

Validation: every field must be a non-negative integer (``input_length`` must be positive: an
empty prompt is invalid), ``hash_ids`` ids lie in ``[0, 2**64)``. A bad line raises
:class:`TraceError`, whose message names the 1-based line number and the field, e.g.
``line 17: field 'input_length': must be a positive integer, got -3``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import msgspec
import xxhash

from conductor.core.errors import InvalidInput

__all__ = [
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "DEFAULT_MODEL",
    "TraceError",
    "TraceRecord",
    "blocks_needed",
    "format_line",
    "is_int",
    "parse_line",
]

DEFAULT_BLOCK_SIZE_TOKENS = 512
"""Mooncake's block size: ``hash_ids`` cover blocks of this many tokens."""
DEFAULT_MODEL = "default"
"""The name of the model of records without a ``model`` key (pools and reports use it)."""

_MAX_HASH_ID = 2**64  # exclusive
_MAX_TOKEN_ID = 2**32  # exclusive: token ids are hashed as little-endian uint32
_CHAIN_HASH_SEED = 0
"""Explicit xxh3-64 seed of :func:`_chain_hash`."""
_ROOT_PARENT_HASH = 0
"""Parent hash fed to the first block of a prompt."""
_RECORD_FIELD = "<record>"
"""Pseudo field name for whole-line problems (bad JSON, not an object)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace, in Mooncake's terms.

    Invariant (checked by :func:`parse_line`): ``input_length >= 1``, ``output_length >= 0``,
    ``timestamp_ms >= 0`` and ``len(hash_ids) == ceil(input_length / block_size_tokens)``.
    ``line_no`` is the 1-based line the record came from (0 when it was not read from a file).
    ``model``: the model the request is for (None: the default model, no ``model`` key).
    """

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line_no: int = 0
    model: str | None = None

    @property
    def model_name(self) -> str:
        """``model``, or :data:`DEFAULT_MODEL` for a record without one."""
        return DEFAULT_MODEL if self.model is None else self.model


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
    model: str | msgspec.UnsetType = msgspec.UNSET


_FAST_DECODER = msgspec.json.Decoder(_MooncakeLine)


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


def blocks_needed(input_length: int, block_size_tokens: int) -> int:
    return -(-input_length // block_size_tokens)


def _describe(value: object) -> str:
    """A short rendering of an offending value for error messages."""
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else None
    if text is None:
        text = f"a {'list' if isinstance(value, list) else type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(obj: dict[str, object], field: str, line_no: int, *, minimum: int, what: str) -> int:
    if field not in obj:
        raise TraceError(line_no, field, None, "missing")
    value = obj[field]
    if not is_int(value) or cast(int, value) < minimum:
        raise TraceError(line_no, field, value, f"must be {what}, got {_describe(value)}")
    return cast(int, value)


def _int_list_field(
    obj: dict[str, object], field: str, line_no: int, *, below: int, what: str
) -> list[int]:
    value = obj[field]
    if not isinstance(value, list):
        raise TraceError(line_no, field, value, f"must be a list of {what}, got {_describe(value)}")
    for index, item in enumerate(value):
        if not is_int(item) or not 0 <= item < below:
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
    return TraceRecord(
        timestamp, input_length, output_length, hash_ids, line_no, _model_field(obj, line_no)
    )


def _model_field(obj: dict[str, object], line_no: int) -> str | None:
    if "model" not in obj:
        return None
    value = obj["model"]
    if not isinstance(value, str) or not value:
        why = f"must be a non-empty string (or absent: the default model), got {_describe(value)}"
        raise TraceError(line_no, "model", value, why)
    return value


def _check_block_count(
    line_no: int, input_length: int, hash_ids: tuple[int, ...], block_size_tokens: int
) -> None:
    needed = blocks_needed(input_length, block_size_tokens)
    if len(hash_ids) != needed:
        why = (
            f"has {len(hash_ids)} ids, but input_length {input_length} needs "
            f"ceil({input_length}/{block_size_tokens}) = {needed}"
        )
        raise TraceError(line_no, "hash_ids", len(hash_ids), why)


def parse_line(line: bytes, line_no: int, block_size_tokens: int) -> TraceRecord:
    """Fast typed decode for well-formed Mooncake lines, field-by-field checks otherwise."""
    try:
        fast = _FAST_DECODER.decode(line)
    except msgspec.MsgspecError:
        return _parse_slow(line, line_no, block_size_tokens)
    if (
        fast.timestamp < 0
        or fast.input_length < 1
        or fast.output_length < 0
        or len(fast.hash_ids) != blocks_needed(fast.input_length, block_size_tokens)
        or (fast.hash_ids and (min(fast.hash_ids) < 0 or max(fast.hash_ids) >= _MAX_HASH_ID))
        or fast.model == ""
    ):
        return _parse_slow(line, line_no, block_size_tokens)
    model = None if isinstance(fast.model, msgspec.UnsetType) else fast.model
    return TraceRecord(
        fast.timestamp, fast.input_length, fast.output_length, fast.hash_ids, line_no, model
    )


def format_line(record: TraceRecord) -> str:
    """``record`` as one Mooncake JSONL line (newline included), with Mooncake's key order and
    separators (a read/write round trip of the conversation trace reproduces it byte for
    byte); a record's ``model`` comes last, and only when it has one."""
    line: dict[str, object] = {
        "timestamp": record.timestamp_ms,
        "input_length": record.input_length,
        "output_length": record.output_length,
        "hash_ids": list(record.hash_ids),
    }
    if record.model is not None:
        line["model"] = record.model
    return json.dumps(line) + "\n"
