"""Shared fixtures. Real-engine fixtures skip, with the reason, when ``make test`` has not
created ``.venv-vllm`` and ``.tiny-model``."""

from __future__ import annotations

import os

# The suite tests the sources (several tests patch module attributes, which a mypyc-compiled
# module does not see); tests/test_native.py checks a compiled build against them.
# CONDUCTOR_PURE=0 runs the suite on a `conductor compile` build instead.
os.environ.setdefault("CONDUCTOR_PURE", "1")

from collections.abc import Iterator

import pytest

from tests.engines.fixtures import VllmEngine, free_ports, missing_prerequisites, start_vllm_engine


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEngine]:
    """One real vLLM CPU engine (tiny model, block size 32, prefix caching, KV events with
    replay) for the whole session; the process group is killed at the end."""
    reason = missing_prerequisites()
    if reason is not None:
        pytest.skip(reason)
    log_path = tmp_path_factory.mktemp("vllm") / "engine.log"
    port, kv_events_port, replay_port = free_ports(3)
    engine = start_vllm_engine(port, kv_events_port, replay_port=replay_port, log_path=log_path)
    try:
        engine.wait_healthy()
        yield engine
    finally:
        engine.stop()
