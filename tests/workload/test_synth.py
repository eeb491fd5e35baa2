"""Synthetic workloads: determinism, invariants of the block ids, sharing, rates, validation."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest

from conductor.core.errors import InvalidInput
from conductor.workload.analysis import infinite_cache_hits, trace_stats
from conductor.workload.synth import KINDS, synthesize
from conductor.workload.synth_params import AgentParams, ChatParams, DocQAParams, MixParams
from conductor.workload.trace import read_trace, write_trace
from conductor.workload.trace_format import TraceRecord

BLOCK = 512


@pytest.fixture(scope="module", params=KINDS)
def default_workload(request: pytest.FixtureRequest) -> tuple[str, list[TraceRecord]]:
    kind = str(request.param)
    return kind, synthesize(kind, requests=1000, rate_rps=2.0, seed=0)


def written_bytes(records: list[TraceRecord], path: Path) -> bytes:
    write_trace(records, path)
    return path.read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_bytes_other_seed_other_bytes(kind: str, tmp_path: Path) -> None:
    first = written_bytes(synthesize(kind, requests=300, rate_rps=2.0, seed=11), tmp_path / "a")
    again = written_bytes(synthesize(kind, requests=300, rate_rps=2.0, seed=11), tmp_path / "b")
    other = written_bytes(synthesize(kind, requests=300, rate_rps=2.0, seed=12), tmp_path / "c")
    assert first == again
    assert first != other


# Golden outcomes of seed 7, 200 requests at 2 req/s. They pin the generator's exact output:
# update them deliberately when the generator or a default parameter changes.
GOLDEN = {
    "chat": (414_208, 742_127, 102_307, 77_934, 737, "0fc16c219d9be11d"),
    "agent": (2_413_056, 2_622_725, 67_296, 14_084, 512, "441d0ef69515a64a"),
    "docqa": (9_241_600, 11_257_354, 106_385, 51_724, 4_024, "dbec677a05e858ec"),
    "mixed": (2_577_920, 3_334_784, 84_856, 51_759, 1_571, "aed988429adc5646"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_golden_outcome(kind: str, tmp_path: Path) -> None:
    records = synthesize(kind, requests=200, rate_rps=2.0, seed=7)
    hits = infinite_cache_hits(records)
    digest = hashlib.sha256(written_bytes(records, tmp_path / "t.jsonl")).hexdigest()[:16]
    assert (
        hits.hit_tokens,
        hits.total_tokens,
        records[-1].timestamp_ms,
        sum(record.output_length for record in records),
        max(max(record.hash_ids) for record in records),
        digest,
    ) == GOLDEN[kind]


def test_invariants(default_workload: tuple[str, list[TraceRecord]], tmp_path: Path) -> None:
    kind, records = default_workload
    assert len(records) == 1000
    assert records[0].timestamp_ms == 0
    assert [record.line_no for record in records] == list(range(1, 1001))
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in itertools.pairwise(records))
    for record in records:
        assert record.input_length >= 1
        assert record.output_length >= 1
        assert len(record.hash_ids) == math.ceil(record.input_length / BLOCK)
    # A written synthetic trace is a valid Mooncake trace and reads back unchanged.
    path = tmp_path / f"{kind}.jsonl.gz"
    write_trace(records, path)
    assert read_trace(path).records == records


def test_ids_are_dense_in_order_of_first_appearance(
    default_workload: tuple[str, list[TraceRecord]],
) -> None:
    _, records = default_workload
    next_new = 0
    for record in records:
        for block in record.hash_ids:
            if block == next_new:
                next_new += 1
            else:
                assert block < next_new, "a new id skipped the next dense integer"


def test_ids_form_chains(default_workload: tuple[str, list[TraceRecord]]) -> None:
    """An id always has the same parent, position and block length (partial tails included)."""
    _, records = default_workload
    seen: dict[int, tuple[int, int, int]] = {}
    for record in records:
        parent = -1
        for position, block in enumerate(record.hash_ids):
            length = min(BLOCK, record.input_length - position * BLOCK)
            assert seen.setdefault(block, (parent, position, length)) == (parent, position, length)
            parent = block


def test_shared_prefixes_are_shared(default_workload: tuple[str, list[TraceRecord]]) -> None:
    kind, records = default_workload
    floor = {"chat": 0.30, "agent": 0.50, "docqa": 0.50, "mixed": 0.30}[kind]
    assert infinite_cache_hits(records).rate > floor


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rate_rps", [2.0, 8.0])
def test_mean_rate_is_close_to_the_requested_rate(kind: str, rate_rps: float) -> None:
    stats = trace_stats(synthesize(kind, requests=3000, rate_rps=rate_rps, seed=0))
    assert stats.mean_rate_rps == pytest.approx(rate_rps, rel=0.1)


def test_kind_shapes(default_workload: tuple[str, list[TraceRecord]]) -> None:
    kind, records = default_workload
    inputs = [record.input_length for record in records]
    outputs = [record.output_length for record in records]
    if kind == "docqa":
        assert min(inputs) > 20_000 + 300
        assert max(inputs) <= 100_000 + 300 + 1_000
        assert max(outputs) <= 2_000
    elif kind == "agent":
        assert min(inputs) > 3_000
        assert max(outputs) <= 1_000
        assert sum(outputs) / len(outputs) < 100
    elif kind == "chat":
        assert min(inputs) > 600
        assert max(outputs) <= 2_000


def test_mixed_with_one_share_is_that_kind() -> None:
    only_chat = MixParams(chat_request_share=1.0, agent_request_share=0.0, docqa_request_share=0.0)
    mixed = synthesize("mixed", requests=100, rate_rps=2.0, seed=3, mix=only_chat)
    assert mixed == synthesize("chat", requests=100, rate_rps=2.0, seed=3)


def test_parameters_are_used() -> None:
    one_document = DocQAParams(documents=1, private_document_share=0.0)
    records = synthesize("docqa", requests=50, rate_rps=2.0, seed=0, docqa=one_document)
    shared = 20_000 // BLOCK  # at least the blocks full of system prompt + the one document
    assert len({record.hash_ids[:shared] for record in records}) == 1
    small_blocks = synthesize("chat", requests=20, rate_rps=2.0, seed=0, block_size_tokens=64)
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 64) for r in small_blocks)
    single_turns = ChatParams(turns_mean=1.0, system_prompts=1)
    agent = AgentParams(steps_mean=1.0)
    for kind, kwargs in (("chat", {"chat": single_turns}), ("agent", {"agent": agent})):
        records = synthesize(kind, requests=30, rate_rps=2.0, seed=0, **kwargs)  # type: ignore[arg-type]
        assert len(records) == 30


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "poetry"}, "kind"),
        ({"requests": 0}, "requests"),
        ({"requests": -5}, "requests"),
        ({"requests": True}, "requests"),
        ({"rate_rps": 0.0}, "rate_rps"),
        ({"rate_rps": -1.0}, "rate_rps"),
        ({"rate_rps": math.nan}, "rate_rps"),
        ({"rate_rps": math.inf}, "rate_rps"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "0"}, "seed"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    arguments: dict[str, object] = {"kind": "chat", "requests": 10, "rate_rps": 1.0, "seed": 0}
    arguments.update(kwargs)
    kind = arguments.pop("kind")
    with pytest.raises(InvalidInput) as caught:
        synthesize(kind, **arguments)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("make", "field", "why"),
    [
        (lambda: ChatParams(turns_max=0), "ChatParams.turns_max", "must be >= 1"),
        (lambda: ChatParams(think_time_mean_s=-1.0), "ChatParams.think_time_mean_s", ">= 0"),
        (lambda: ChatParams(output_log_sigma=math.nan), "ChatParams.output_log_sigma", "finite"),
        (
            lambda: ChatParams(system_prompt_min_tokens=3_000),
            "ChatParams.system_prompt_max_tokens",
            "must be >= system_prompt_min_tokens (3000)",
        ),
        (lambda: ChatParams(context_max_tokens=1_000), "ChatParams.context_max_tokens", "small"),
        (lambda: AgentParams(toolsets=0), "AgentParams.toolsets", "must be >= 1"),
        (lambda: AgentParams(context_max_tokens=20_000), "AgentParams.context_max_tokens", "small"),
        (
            lambda: DocQAParams(private_document_share=1.5),
            "DocQAParams.private_document_share",
            "must be <= 1",
        ),
        (lambda: DocQAParams(document_zipf_s=-0.5), "DocQAParams.document_zipf_s", ">= 0"),
        (
            lambda: MixParams(0.0, 0.0, 0.0),
            "MixParams.docqa_request_share",
            "the shares must not all be 0",
        ),
    ],
)
def test_bad_parameters_name_the_field(make: object, field: str, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        make()  # type: ignore[operator]
    assert caught.value.field == field
    assert why in caught.value.why


# Several models: requests per model for seed 5, 300 requests at 2 req/s, weights 0.7/0.3.
# A session is for one model, so the counts scatter around 210/90 by whole sessions (agent
# sessions are long, so mixed scatters most).
MODEL_COUNTS = {
    "chat": {"a": 220, "b": 80},
    "agent": {"a": 230, "b": 70},
    "docqa": {"a": 204, "b": 96},
    "mixed": {"a": 165, "b": 135},
}


@pytest.mark.parametrize("kind", KINDS)
def test_models_get_their_share_and_never_share_a_block(kind: str) -> None:
    records = synthesize(kind, requests=300, rate_rps=2.0, seed=5, models={"a": 0.7, "b": 0.3})
    counts = {m: sum(1 for r in records if r.model == m) for m in ("a", "b")}
    assert counts == MODEL_COUNTS[kind]
    blocks = {m: {h for r in records if r.model == m for h in r.hash_ids} for m in ("a", "b")}
    assert blocks["a"].isdisjoint(blocks["b"])
    # within a model, prefixes are still shared (its own system prompts, tools, documents)
    for model in ("a", "b"):
        own = [r for r in records if r.model == model]
        assert infinite_cache_hits(own).rate > 0.2, model


def test_one_model_is_the_unnamed_trace_labelled() -> None:
    plain = synthesize("mixed", requests=120, rate_rps=2.0, seed=4)
    named = synthesize("mixed", requests=120, rate_rps=2.0, seed=4, models={"m": 2.5})
    assert all(r.model is None for r in plain)
    assert named == [replace(r, model="m") for r in plain]


def test_equal_weights_and_model_order() -> None:
    records = synthesize("chat", requests=200, rate_rps=2.0, seed=2, models={"x": 1, "y": 1})
    assert {r.model for r in records} == {"x", "y"}
    swapped = synthesize("chat", requests=200, rate_rps=2.0, seed=2, models={"y": 1, "x": 1})
    assert swapped != records  # shared content is drawn per model in the given order
    again = synthesize("chat", requests=200, rate_rps=2.0, seed=2, models={"x": 1, "y": 1})
    assert again == records


@pytest.mark.parametrize(
    ("models", "value", "why"),
    [
        ({}, {}, "must name at least one model"),
        ({"": 1.0}, "", "non-empty"),
        ({"  ": 1.0}, "  ", "non-empty"),
        ({"a": 0.0}, 0.0, "weight of model 'a' must be a finite number > 0"),
        ({"a": 1.0, "b": -1.0}, -1.0, "weight of model 'b'"),
        ({"a": math.inf}, math.inf, "finite"),
        ({"a": True}, True, "finite number"),
    ],
)
def test_bad_models_are_named(models: dict[str, float], value: object, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        synthesize("chat", requests=10, rate_rps=1.0, seed=0, models=models)
    assert caught.value.field == "models"
    assert caught.value.value == value
    assert why in caught.value.why
