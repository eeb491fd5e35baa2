"""The request path's view of an upstream HTTP client, and its httpx implementation.

:class:`Upstream` sends one ``POST`` with a JSON body to an engine and returns once the
response headers arrived; :class:`UpstreamResponse` is the small part of
``httpx.Response``'s interface the proxy uses. Two clients satisfy it: the lean keep-alive
:class:`~conductor.web.client.RawHttpClient` (production) and :class:`HttpxUpstream`, which
wraps an ``httpx.AsyncClient`` (tests inject a transport through it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx


class UpstreamResponse(Protocol):
    """What the proxy uses of an upstream answer."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    def chunks(self, deadline: float) -> AsyncIterator[bytes]:
        """The body as it arrives; ``TimeoutError`` once the loop's clock passes
        ``deadline``."""
        ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """Sends one ``POST`` with a JSON body; returns once the response headers arrived."""

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        deadline: float | None = None,
    ) -> UpstreamResponse:
        """Raises ``TimeoutError`` once the loop's clock passes ``deadline``."""
        ...

    async def aclose(self) -> None: ...


class HttpxResponse:
    """An ``httpx.Response`` as an :class:`UpstreamResponse`."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        self.headers: Mapping[str, str] = response.headers

    async def aread(self) -> bytes:
        return await self.response.aread()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.response.aiter_raw()

    async def chunks(self, deadline: float) -> AsyncIterator[bytes]:
        raw = self.response.aiter_raw()
        while True:
            async with asyncio.timeout_at(deadline):
                try:
                    chunk = await anext(raw)
                except StopAsyncIteration:
                    return
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()


class HttpxUpstream:
    """:class:`Upstream` over an ``httpx.AsyncClient`` (the tests' transport seam)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        deadline: float | None = None,
    ) -> UpstreamResponse:
        all_headers = {"content-type": "application/json"}
        if headers:
            all_headers.update(headers)
        request = self.client.build_request("POST", url, content=body, headers=all_headers)
        async with asyncio.timeout_at(deadline):
            return HttpxResponse(await self.client.send(request, stream=True))

    async def aclose(self) -> None:
        return None  # the client belongs to the caller
