"""Trace reading and writing: both line forms, every error, skipping, sorting, round trips."""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
import struct
from pathlib import Path

import pytest
import xxhash

from conductor.core.errors import ConductorError, InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.workload.max_tokens import MaxTokens
from conductor.workload.trace import (
    SkippedLine,
    TraceReadResult,
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
    split_by_model,
    write_trace,
)
from conductor.workload.trace_format import DEFAULT_MODEL, TraceError, TraceRecord, format_line

GOOD_1 = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'
GOOD_2 = '{"timestamp": 30, "input_length": 512, "output_length": 0, "hash_ids": [0]}'


def read_text(
    text: str, *, limit: object = None, skip_invalid: bool = False, block_size_tokens: int = 512
) -> TraceReadResult:
    return read_trace(
        io.BytesIO(text.encode()),
        limit=limit,  # type: ignore[arg-type]  # bad limits are tested on purpose
        skip_invalid=skip_invalid,
        block_size_tokens=block_size_tokens,
    )


def hashes(*values: int) -> tuple[BlockHash, ...]:
    return tuple(BlockHash(value) for value in values)


def reference_chain(tokens: list[int], block: int = 512) -> tuple[int, ...]:
    """Independent restatement of the token-form hash: xxh3-64(parent LE8 + tokens LE4)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens), block):
        chunk = tokens[start : start + block]
        data = parent.to_bytes(8, "little") + struct.pack(f"<{len(chunk)}I", *chunk)
        parent = xxhash.xxh3_64_intdigest(data, seed=0)
        out.append(parent)
    return tuple(out)


# --- Mooncake form ---------------------------------------------------------------------------


def test_mooncake_lines_parse_to_exact_records() -> None:
    result = read_text(GOOD_1 + "\n" + GOOD_2 + "\n")
    assert result == TraceReadResult(
        records=[
            TraceRecord(0, 600, 5, (0, 1), line_no=1),
            TraceRecord(30, 512, 0, (0,), line_no=2),
        ],
        skipped=[],
    )


def test_unknown_keys_and_blank_lines_are_ignored_and_lines_are_counted_physically() -> None:
    extra = '{"timestamp": 7, "input_length": 1, "output_length": 1, "hash_ids": [9], "x": 1}'
    result = read_text("\n" + GOOD_1 + "\n   \n" + extra + "\r\n")
    assert [(r.line_no, r.hash_ids) for r in result.records] == [(2, (0, 1)), (4, (9,))]


def test_records_are_sorted_stably_by_timestamp() -> None:
    lines = [
        '{"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
        '{"timestamp": 10, "input_length": 1, "output_length": 1, "hash_ids": [2]}',
        '{"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [3]}',
        '{"timestamp": 10, "input_length": 1, "output_length": 1, "hash_ids": [4]}',
    ]
    records = read_text("\n".join(lines)).records
    assert [(r.timestamp_ms, r.hash_ids[0], r.line_no) for r in records] == [
        (10, 2, 2),
        (10, 4, 4),
        (50, 1, 1),
        (50, 3, 3),
    ]


def test_limit_counts_valid_records_in_file_order_and_stops_reading() -> None:
    bad = "not json"
    result = read_text("\n".join([GOOD_2, GOOD_1, bad]), limit=2)
    # Line 3 is never parsed; the two records come back sorted by timestamp (30 ms, 0 ms).
    assert [r.line_no for r in result.records] == [2, 1]
    assert read_text(GOOD_1, limit=0).records == []


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_bad_limit_is_rejected(limit: object) -> None:
    with pytest.raises(InvalidInput, match="limit"):
        read_text(GOOD_1, limit=limit)


def test_bad_block_size_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="block_size_tokens"):
        read_text(GOOD_1, block_size_tokens=0)


def test_block_size_governs_the_hash_count_check() -> None:
    line = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]}'
    assert read_text(line, block_size_tokens=256).records[0].hash_ids == (0, 1, 2)
    with pytest.raises(TraceError, match="ceil\\(600/512\\) = 2"):
        read_text(line)


# --- Token form ------------------------------------------------------------------------------


def test_token_form_hashes_full_blocks_and_the_last_partial_block() -> None:
    tokens = list(range(1200))
    line = json.dumps({"timestamp": 5, "output_length": 7, "prompt_token_ids": tokens})
    (record,) = read_text(line).records
    assert record.input_length == 1200
    assert record.output_length == 7
    assert len(record.hash_ids) == math.ceil(1200 / 512) == 3
    assert record.hash_ids == reference_chain(tokens)


def test_token_form_shares_ids_exactly_for_shared_prefixes() -> None:
    base = list(range(1024))
    a = json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": [*base, 1, 2]})
    b = json.dumps({"timestamp": 1, "output_length": 1, "prompt_token_ids": [*base, 1, 3]})
    c = json.dumps({"timestamp": 2, "output_length": 1, "prompt_token_ids": [5, *base[1:]]})
    ra, rb, rc = read_text("\n".join([a, b, c])).records
    assert ra.hash_ids[:2] == rb.hash_ids[:2]  # same two full blocks
    assert ra.hash_ids[2] != rb.hash_ids[2]  # different partial tails
    assert not set(rc.hash_ids) & set(ra.hash_ids)  # first block differs: the whole chain does


def test_token_form_partial_block_differs_from_the_full_block_it_starts() -> None:
    full = json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": list(range(512))})
    part = json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": list(range(500))})
    rf, rp = read_text(full + "\n" + part).records
    assert rf.hash_ids != rp.hash_ids


def test_token_form_accepts_a_matching_input_length_and_honours_block_size() -> None:
    line = json.dumps(
        {"timestamp": 0, "input_length": 5, "output_length": 1, "prompt_token_ids": [1, 2, 3, 4, 5]}
    )
    (record,) = read_text(line, block_size_tokens=2).records
    assert record.hash_ids == reference_chain([1, 2, 3, 4, 5], block=2)
    assert len(record.hash_ids) == 3


# --- Errors ----------------------------------------------------------------------------------

VALID = {"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}


def variant(**changes: object) -> str:
    obj: dict[str, object] = dict(VALID)
    for key, value in changes.items():
        if value is KeyError:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj)


ERROR_CASES = [
    (
        '{"timestamp": 1,',
        "<record>",
        "invalid JSON (Expecting property name enclosed in double quotes at column 17)",
    ),
    ("[1, 2]", "<record>", "must be a JSON object, got list"),
    (variant(timestamp=KeyError), "timestamp", "missing"),
    (variant(input_length=KeyError), "input_length", "missing"),
    (variant(output_length=KeyError), "output_length", "missing"),
    (variant(hash_ids=KeyError), "hash_ids", "missing"),
    (variant(timestamp=-1), "timestamp", "must be a non-negative integer (milliseconds), got -1"),
    (variant(timestamp=1.5), "timestamp", "must be a non-negative integer (milliseconds), got 1.5"),
    (variant(timestamp="1"), "timestamp", 'must be a non-negative integer (milliseconds), got "1"'),
    (
        variant(input_length=-3),
        "input_length",
        "must be a positive integer (an empty prompt is invalid), got -3",
    ),
    (
        variant(input_length=0, hash_ids=[]),
        "input_length",
        "must be a positive integer (an empty prompt is invalid), got 0",
    ),
    (
        variant(input_length=600.0),
        "input_length",
        "must be a positive integer (an empty prompt is invalid), got 600.0",
    ),
    (
        variant(input_length=True),
        "input_length",
        "must be a positive integer (an empty prompt is invalid), got true",
    ),
    (variant(output_length=-1), "output_length", "must be a non-negative integer, got -1"),
    (variant(output_length=None), "output_length", "must be a non-negative integer, got null"),
    (variant(output_length=[1]), "output_length", "must be a non-negative integer, got a list"),
    (variant(hash_ids="0,1"), "hash_ids", 'must be a list of integers in [0, 2**64), got "0,1"'),
    (
        variant(hash_ids=[0, -1]),
        "hash_ids",
        "must be a list of integers in [0, 2**64), got -1 at index 1",
    ),
    (
        variant(hash_ids=[0, 2**64]),
        "hash_ids",
        "must be a list of integers in [0, 2**64), got 18446744073709551616 at index 1",
    ),
    (
        variant(hash_ids=[0, "a"]),
        "hash_ids",
        'must be a list of integers in [0, 2**64), got "a" at index 1',
    ),
    (
        variant(hash_ids=[0, 1, 2]),
        "hash_ids",
        "has 3 ids, but input_length 600 needs ceil(600/512) = 2",
    ),
    (variant(hash_ids=[0]), "hash_ids", "has 1 ids, but input_length 600 needs ceil(600/512) = 2"),
    (
        json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": []}),
        "prompt_token_ids",
        "must not be empty",
    ),
    (
        json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": [1, 2**32]}),
        "prompt_token_ids",
        "must be a list of token ids in [0, 2**32), got 4294967296 at index 1",
    ),
    (
        json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": {"a": 1}}),
        "prompt_token_ids",
        "must be a list of token ids in [0, 2**32), got a dict",
    ),
    (
        json.dumps({"timestamp": 0, "output_length": 1, "prompt_token_ids": [1], "hash_ids": [0]}),
        "hash_ids",
        "not allowed together with 'prompt_token_ids'",
    ),
    (
        json.dumps(
            {"timestamp": 0, "input_length": 2, "output_length": 1, "prompt_token_ids": [1]}
        ),
        "input_length",
        "2 does not match len(prompt_token_ids) = 1",
    ),
    (
        json.dumps({"timestamp": 0, "prompt_token_ids": [1]}),
        "output_length",
        "missing",
    ),
]


@pytest.mark.parametrize(("line", "field", "why"), ERROR_CASES)
def test_every_error_names_line_and_field(line: str, field: str, why: str) -> None:
    text = "\n".join([GOOD_1, "", line, GOOD_2])  # the bad line is line 3
    with pytest.raises(TraceError) as caught:
        read_text(text)
    error = caught.value
    assert str(error) == f"line 3: field {field!r}: {why}"
    assert (error.line_no, error.field, error.why) == (3, field, why)
    assert isinstance(error, InvalidInput)
    assert isinstance(error, ConductorError)


def test_trace_error_survives_pickling() -> None:
    error = TraceError(4, "output_length", -1, "must be a non-negative integer, got -1")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.line_no, copy.field, copy.value, copy.why) == (
        "line 4: field 'output_length': must be a non-negative integer, got -1",
        4,
        "output_length",
        -1,
        "must be a non-negative integer, got -1",
    )


def test_invalid_utf8_is_a_record_error() -> None:
    with pytest.raises(TraceError, match=r"^line 1: field '<record>': not valid UTF-8"):
        read_trace(io.BytesIO(b'{"timestamp": "\xff"}'))


def test_skip_invalid_skips_and_records_each_bad_line() -> None:
    lines = [GOOD_1, "oops", variant(input_length=0, hash_ids=[]), GOOD_2, variant(hash_ids=[1])]
    result = read_text("\n".join(lines), skip_invalid=True)
    assert [r.line_no for r in result.records] == [1, 4]
    assert result.skipped == [
        SkippedLine(2, "<record>", "invalid JSON (Expecting value at column 1)"),
        SkippedLine(
            3, "input_length", "must be a positive integer (an empty prompt is invalid), got 0"
        ),
        SkippedLine(5, "hash_ids", "has 1 ids, but input_length 600 needs ceil(600/512) = 2"),
    ]


# --- Sources: paths, gzip, file objects ------------------------------------------------------


def sample_records() -> list[TraceRecord]:
    return [
        TraceRecord(0, 600, 5, (0, 1), line_no=1),
        TraceRecord(30, 512, 0, (0,), line_no=2),
        TraceRecord(30, 1025, 9, (0, 2, 2**64 - 1), line_no=3),
    ]


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_write_then_read_round_trips(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_trace(sample_records(), path)
    assert read_trace(path).records == sample_records()
    assert read_trace(str(path)).records == sample_records()


def test_gz_output_is_gzip_and_byte_reproducible(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl.gz", tmp_path / "sub_b.jsonl.gz"
    write_trace(sample_records(), first)
    write_trace(sample_records(), second)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes()[:2] == b"\x1f\x8b"
    plain = tmp_path / "c.jsonl"
    write_trace(sample_records(), plain)
    assert gzip.decompress(first.read_bytes()) == plain.read_bytes()
    assert plain.read_text().splitlines()[0] == GOOD_1


def test_file_objects_binary_gzip_and_text(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    write_trace(sample_records(), path)
    with path.open("rb") as handle:
        assert read_trace(handle).records == sample_records()
    text = gzip.decompress(path.read_bytes()).decode()
    assert read_trace(io.StringIO(text)).records == sample_records()


def test_bundled_trace_loads_all_records(bundled_records: list[TraceRecord]) -> None:
    path = bundled_trace_path()
    assert path.name == "conversation_trace.jsonl.gz"
    assert len(bundled_records) == 12_031
    assert bundled_records[0] == TraceRecord(0, 6758, 500, tuple(range(14)), line_no=1)
    assert bundled_records[-1].timestamp_ms == 3_536_999
    notice = (path.parent / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice
    assert "FAST25-release/traces/conversation_trace.jsonl" in notice


def test_bundled_trace_matches_the_shared_source_byte_for_byte(
    tmp_path: Path, shared_conversation_trace: Path, bundled_records: list[TraceRecord]
) -> None:
    out = tmp_path / "conversation.jsonl"
    write_trace(bundled_records, out)  # the file is sorted already, so the order is kept
    assert out.read_bytes() == shared_conversation_trace.read_bytes()
    assert gzip.decompress(bundled_trace_path().read_bytes()) == out.read_bytes()


# --- Requests --------------------------------------------------------------------------------


def test_records_to_requests_maps_fields_and_scales_time() -> None:
    records = [TraceRecord(27_482, 600, 52, (46, 47)), TraceRecord(30_001, 1, 1, (48,))]
    requests = records_to_requests(records, speed=2.0)
    assert requests == [
        Request(RequestId("r0"), 600, hashes(46, 47), arrival_s=27.482 / 2.0),
        Request(RequestId("r1"), 1, hashes(48), arrival_s=30.001 / 2.0),
    ]  # the true output length is not in the request (no oracle)
    assert generated_tokens(records) == [52, 1]
    assert requests[0].arrival_s == 13.741
    assert records_to_requests(records)[1].arrival_s == 30.001
    assert [r.arrival_s for r in records_to_requests(records, speed=0.5)] == [54.964, 60.002]


def test_max_tokens_modes_set_what_is_sent_and_what_is_generated() -> None:
    records = [TraceRecord(0, 600, 52, (46, 47)), TraceRecord(1, 1, 300, (48,))]
    trace = MaxTokens.parse("trace")
    cap = MaxTokens.parse("cap:100")
    assert [r.max_tokens for r in records_to_requests(records)] == [None, None]
    assert [r.max_tokens for r in records_to_requests(records, max_tokens=trace)] == [52, 300]
    assert [r.max_tokens for r in records_to_requests(records, max_tokens=cap)] == [100, 100]
    assert generated_tokens(records, trace) == [52, 300]
    assert generated_tokens(records, cap) == [52, 100]
    assert str(cap) == "cap:100" and str(MaxTokens.parse(" None ")) == "none"


@pytest.mark.parametrize("text", ["cap:0", "cap:x", "foo", "cap", "cap:-3", ""])
def test_bad_max_tokens_is_named(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        MaxTokens.parse(text)
    assert caught.value.field == "max_tokens" and caught.value.value == text


@pytest.mark.parametrize("speed", [0, -1.0, math.nan, math.inf, True])
def test_records_to_requests_rejects_bad_speed(speed: float) -> None:
    with pytest.raises(InvalidInput) as caught:
        records_to_requests([], speed=speed)
    assert caught.value.field == "speed"


def test_records_to_requests_checks_block_counts() -> None:
    records = [TraceRecord(0, 600, 1, (0, 1)), TraceRecord(0, 600, 1, (0,))]
    with pytest.raises(InvalidInput) as caught:
        records_to_requests(records)
    assert caught.value.field == "records[1].hash_ids"
    assert records_to_requests(records[1:], block_size_tokens=600)[0].prompt_tokens == 600
    with pytest.raises(InvalidInput, match="block_size_tokens"):
        records_to_requests(records, block_size_tokens=0)


# --- Models ----------------------------------------------------------------------------------


def test_model_field_is_read_in_both_forms_and_absent_means_the_default() -> None:
    token_line = json.dumps({"timestamp": 40, "prompt_token_ids": [5, 6], "output_length": 1})
    token_line = token_line[:-1] + ', "model": "b"}'
    text = "\n".join([GOOD_1, GOOD_2[:-1] + ', "model": "a"}', token_line])
    records = read_text(text).records
    assert [r.model for r in records] == [None, "a", "b"]
    assert [r.model_name for r in records] == [DEFAULT_MODEL, "a", "b"]
    assert records[1] == TraceRecord(30, 512, 0, (0,), line_no=2, model="a")
    assert records[2].hash_ids == reference_chain([5, 6])


@pytest.mark.parametrize(
    ("value", "shown"),
    [('""', '""'), ("null", "null"), ("7", "7"), ('["a"]', "a list")],
)
def test_bad_model_names_line_and_field(value: str, shown: str) -> None:
    with pytest.raises(TraceError) as caught:
        read_text("\n".join([GOOD_1, GOOD_2[:-1] + f', "model": {value}}}']))
    why = f"must be a non-empty string (or absent: the default model), got {shown}"
    assert str(caught.value) == f"line 2: field 'model': {why}"


@pytest.mark.parametrize("name", ["m.jsonl", "m.jsonl.gz"])
def test_model_round_trips_and_comes_last(tmp_path: Path, name: str) -> None:
    records = [
        TraceRecord(0, 600, 5, (0, 1), line_no=1, model="llama-8b"),
        TraceRecord(30, 512, 0, (0,), line_no=2),
        TraceRecord(31, 10, 2, (0,), line_no=3, model="meta/llama=70b"),
    ]
    path = tmp_path / name
    write_trace(records, path)
    assert read_trace(path).records == records
    assert format_line(records[0]) == (
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1],'
        ' "model": "llama-8b"}\n'
    )
    assert format_line(records[1]) == GOOD_2 + "\n"  # no model: the plain Mooncake line


def test_split_by_model_keeps_order_within_and_first_appearance_across() -> None:
    a1, d, a2, b = (
        TraceRecord(0, 1, 1, (0,), model="a"),
        TraceRecord(1, 1, 1, (1,)),
        TraceRecord(2, 1, 1, (2,), model="a"),
        TraceRecord(3, 1, 1, (3,), model="b"),
    )
    assert split_by_model([a1, d, a2, b]) == {"a": [a1, a2], DEFAULT_MODEL: [d], "b": [b]}
    assert split_by_model([]) == {}
