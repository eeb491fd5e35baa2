"""The server runs on uvloop in production and on asyncio's own loop elsewhere: every test
runs on both."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(
    params=[("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    backend: tuple[str, dict[str, Any]] = request.param
    return backend
