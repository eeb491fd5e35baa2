"""The pieces of a streamed response: the token event template gives the bytes of the
chunk's JSON, and a request's token queue hands its items over in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from conductor.emulator.engine import EngineRequest, TokenOutput
from conductor.emulator.loop import TokenQueue
from conductor.emulator.shaping import Shape, SseBody, sse

TEXTS = ("", " plain", 'a "quote" and \\ a backslash', "\n\t\x00\x1f\x7f", "éß 中文 🙂", "\u2028")


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("model", ["tiny", 'odd "model" \\ name \u00e9'])
def test_token_event_is_the_chunk_json(chat: bool, model: str) -> None:
    shape = Shape(chat, model, "e0-7")
    for text in TEXTS:
        assert shape.token_event(text) == sse(shape.chunk(text, None))
    assert shape.token_event(" x").startswith(b"data: {") and shape.token_event(" x").endswith(
        b"}\n\n"
    )


def test_token_event_without_a_template() -> None:
    """A model name holding the template's marker: every event built the plain way."""
    from conductor.emulator.shaping import _TEXT_MARK

    shape = Shape(False, _TEXT_MARK, "e0-1")
    assert shape.token_event(" y") == sse(shape.chunk(" y", None))
    assert shape.token_event(_TEXT_MARK) == sse(shape.chunk(_TEXT_MARK, None))


def test_token_queue_hands_items_over_in_order() -> None:
    req = EngineRequest(request_id="r", prompt_ids=[1], out_ids=[2, 3], out_texts=["a", "b"])
    outs = [TokenOutput(req, 0, False), TokenOutput(req, 1, True)]

    async def main() -> list[TokenOutput | None]:
        queue = TokenQueue()
        queue.put_nowait(outs[0])
        got = [await queue.get()]  # already there
        reader = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not reader.done()  # waits for the next one
        queue.put_nowait(outs[1])
        queue.put_nowait(None)
        got.append(await reader)
        got.append(await queue.get())
        return got

    assert asyncio.run(main()) == [outs[0], outs[1], None]


def test_a_cancelled_reader_leaves_the_queue_usable() -> None:
    async def main() -> TokenOutput | None:
        queue = TokenQueue()
        reader = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        queue.put_nowait(None)
        return await queue.get()

    assert asyncio.run(main()) is None


def test_closing_the_body_aborts_the_request_however_far_it_got() -> None:
    async def events() -> AsyncGenerator[bytes, None]:
        try:
            yield b"one"
            yield b"two"
        finally:
            log.append("generator closed")

    async def main(take: int) -> list[str]:
        body = SseBody(events(), lambda: log.append("aborted"))
        for _ in range(take):
            await anext(body)
        log.append(f"{take} read")
        await body.aclose()
        return log

    log: list[str] = []
    assert asyncio.run(main(0)) == ["0 read", "aborted"]  # never started: nothing to close
    log = []
    assert asyncio.run(main(1)) == ["1 read", "generator closed", "aborted"]
