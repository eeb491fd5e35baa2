"""The value classes built on every decision and simulated event write their ``__init__`` by
hand. A dataclass's generated ``__init__`` is Python bytecode made at import time, which the
mypyc build cannot compile: a frozen one took ~600 ns per object there against ~36 ns for a
hand-written one, about a fifth of a ``schedule()`` call (docs/policies.md "Decision cost").
Their fields are ``Final`` where they were frozen (mypy rejects a later assignment), and they
keep the dataclass's ``__eq__``, ``__repr__`` and, for those, ``__hash__``."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from conductor.core.events import (
    BlocksRemoved,
    BlocksStored,
    DecodeStepsObserved,
    PrefillFinished,
    RequestFinished,
)
from conductor.core.forecast import _Entry
from conductor.core.inflight import InFlight
from conductor.core.late_binding import _Held
from conductor.core.nic import Transfers
from conductor.core.output_length import OutputEstimate
from conductor.core.plan import Fetch, Migration, Plan, Prepared
from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.prefix_index import PrefixMatch
from conductor.core.types import BlockHash, InstanceId, Request, RequestId

HOT = (
    BlocksRemoved,
    BlocksStored,
    DecodeChoice,
    DecodeStepsObserved,
    Fetch,
    InFlight,
    Migration,
    OutputEstimate,
    Plan,
    PrefillChoice,
    PrefillFinished,
    Prepared,
    PrefixMatch,
    Request,
    RequestFinished,
    SchedulingContext,
    Transfers,
    _Entry,
    _Held,
)
HASHABLE = {c for c in HOT if c not in (InFlight, SchedulingContext, _Entry, _Held)}
"""Those that were frozen dataclasses, hashable by value."""


@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_init_is_written_in_the_source(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    init = cls.__init__  # type: ignore[misc]
    assert inspect.getsourcefile(init) == inspect.getsourcefile(cls)  # not "<string>"
    params = list(inspect.signature(init).parameters)[1:]
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    # the same names in the same order: positional calls and dataclasses.replace() still work
    assert params[: len(fields)] == fields
    assert all(not p.startswith("_") for p in params)
    assert (cls.__hash__ is not None) == (cls in HASHABLE)


def test_values_compare_hash_and_replace_as_frozen_dataclasses_did() -> None:
    r = Request(RequestId("r"), 100, (BlockHash(1),), max_tokens=5)
    assert r == Request(RequestId("r"), 100, (BlockHash(1),), 5)
    assert hash(r) == hash(Request(RequestId("r"), 100, (BlockHash(1),), 5))
    assert dataclasses.replace(r, ttft_slo_s=2.0) == r.with_ttft_slo(2.0)
    assert r.with_ttft_slo(2.0).ttft_slo_s == 2.0
    assert r.tags == () and r.arrival_s == 0.0
    assert repr(BlocksStored(InstanceId("p0"), ())) == (
        "BlocksStored(holder='p0', block_hashes=(), tier=<Tier.GPU: 0>, seq=None)"
    )
    assert {BlocksStored(InstanceId("p0"), ()), BlocksStored(InstanceId("p0"), ())} == {
        BlocksStored(InstanceId("p0"), ())
    }


def test_held_orders_by_key_then_arrival() -> None:
    r = Request(RequestId("r"), 100, ())
    a, b, c = (
        _Held(1.0, 2, 0.0, 0.0, 0.0, r),
        _Held(1.0, 1, 9.0, 0.0, 0.0, r),
        _Held(0.5, 3, 0.0, 0.0, 0.0, r),
    )
    assert sorted([a, b, c]) == [c, b, a]
    assert a == _Held(1.0, 2, 5.0, 1.0, 1.0, r, live=False)  # compared by (key, seq) only
