"""The emulator's driver counts how late it hands a step's tokens out after the step's
planned end (``EngineCounters.late_s``): what a busy machine adds to the token intervals."""

from __future__ import annotations

import asyncio

import pytest

from conductor.emulator.loop import EngineLoop
from tests.emulator.test_engine import core, request


class SteppingClock:
    """Each reading is one second after the previous one."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


@pytest.mark.anyio
async def test_each_step_counts_the_time_past_its_planned_end() -> None:
    """The loop reads the clock three times a step: at its start ``s``, before sleeping
    until ``s + d`` (already past: no sleep) and after handing the tokens out at ``s + 2``,
    so each step is ``2 - d`` late and the steps together ``2 n - busy``."""
    engine = core()
    loop = EngineLoop(engine, clock=SteppingClock())
    queue = loop.submit(request(list(range(100)), 4))
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(4):
            out = await queue.get()
        assert out is not None and out.finished
    finally:
        task.cancel()
    c = engine.counters
    assert c.steps == 4
    assert c.late_s == pytest.approx(2.0 * c.steps - c.busy_s)
