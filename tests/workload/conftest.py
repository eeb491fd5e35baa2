"""Shared helpers for workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.workload.trace import bundled_trace_path, read_trace
from conductor.workload.trace_format import TraceRecord

# The project's shared data folder sits next to the checkout (../shared); tests may read it,
# the product never does.
SHARED_CONVERSATION_TRACE = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "mooncake"
    / "conversation_trace.jsonl"
)


@pytest.fixture(scope="session")
def shared_conversation_trace() -> Path:
    if not SHARED_CONVERSATION_TRACE.is_file():
        pytest.skip(f"{SHARED_CONVERSATION_TRACE} is not available on this machine")
    return SHARED_CONVERSATION_TRACE


@pytest.fixture(scope="session")
def bundled_records() -> list[TraceRecord]:
    return read_trace(bundled_trace_path()).records
