"""Which model an engine serves: its ``GET /v1/models`` ids, read at start (to find the
pool of an engine whose config names none) and by the health loop (an engine serving
another model than its config says is kept out of scheduling, with the reason)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx


def model_ids(body: bytes) -> list[str] | None:
    """The ids of an OpenAI ``/v1/models`` answer; None if it is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    ids = [m.get("id") for m in data["data"] if isinstance(m, dict)]
    if not ids or not all(isinstance(i, str) and i for i in ids):
        return None
    return [str(i) for i in ids]


async def served_models(
    client: httpx.AsyncClient, base_url: str, timeout_s: float
) -> list[str] | None:
    """The models the engine at ``base_url`` lists; None when it cannot tell (no answer,
    not 200, not a model list): the engine is then taken at its config's word."""
    try:
        resp = await client.get(f"{base_url}/v1/models", timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL):
        return None
    if resp.status_code != 200:
        return None
    return model_ids(resp.content)


def discover_model(base_url: str, timeout_s: float) -> str:
    """The one model the engine at ``base_url`` serves (blocking; at start-up, for an
    engine whose config names none); :class:`ValueError` saying why when it cannot be
    told."""
    try:
        resp = httpx.get(f"{base_url}/v1/models", timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ValueError(f"GET {base_url}/v1/models failed: {exc}") from None
    if resp.status_code != 200:
        raise ValueError(f"GET {base_url}/v1/models answered {resp.status_code}")
    return single_model(base_url, model_ids(resp.content))


def single_model(base_url: str, ids: Sequence[str] | None) -> str:
    """The one id of ``ids``; :class:`ValueError` when there is none or several."""
    if not ids:
        raise ValueError(f"GET {base_url}/v1/models lists no model")
    if len(ids) > 1:
        raise ValueError(f"{base_url} serves several models {list(ids)}; name one")
    return ids[0]


def mismatch(expected: str, served: Sequence[str]) -> str | None:
    """Why an engine that should serve ``expected`` but lists ``served`` is wrong (None:
    it is right)."""
    if expected in served:
        return None
    return f"it serves {list(served)}, its config says {expected!r}"
