"""Decode-only steps run ahead: an engine that only decodes, with nothing waiting, takes
its next steps without an event each.

While an engine's step set has no prefill chunk, nothing waits and no request finishes,
each next step is a pure function of the engine (batch ``n`` and ``ctx + n`` per step):
no other part of the simulation reads or writes it. So at such a step end the engine
plans the steps up to the first of: a request's last step, a step whose blocks might
not fit, or the step start that makes a ``DecodeStepsObserved`` report (it talks to the
scheduler, so it must happen at its time). Only the end of the last of them is an event;
the ends before it are kept in ``Engine.ahead_t`` (and each step's duration in
``ahead_d``) and applied to the engine, with the same arithmetic in the same order as
step by step, when that event comes (:func:`apply`), when something reads the engine
earlier (:func:`catch_up`), or cut short when a request joins the engine's queue before
the planned end (``EngineLoop.enqueue``): the first planned end after the join becomes
the event, as it was step by step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from conductor.sim.nodes import Engine

REPORT_EVERY_STEPS = 32
"""An engine reports its decode-step statistics (``DecodeStepsObserved``) this often."""


def run_ahead(
    e: Engine,
    te: float,
    k: int,
    ctx: int,
    step_s: Callable[[float, float], float],
    mul: float | None,
) -> float:
    """Plan ``e``'s decode-only steps after the one just started (its end ``te`` is the
    ``k + 1``-th; ``ctx`` is what that step read, ``step_s`` the decode step time, ``mul``
    its factor when the engine cost is perturbed); returns the end of the last planned
    step (the one the caller pushes as the event)."""
    n = len(e.decoding)
    room = REPORT_EVERY_STEPS - 1 - int(e.obs[0])  # no planned step start may report
    fh = e.finish_heap
    if fh:
        room = min(room, fh[0][0] - k - 1)  # ends after index k, before the first finish
    block = e.block
    kvb = e.kv_blocks
    spare = n * (block - 1)
    ts = e.ahead_t
    ds = e.ahead_d
    while room > 0:
        ctx += n
        if (ctx + spare) // block > kvb:
            break
        d = step_s(n, ctx)
        if mul is not None:
            d *= mul
        ts.append(te)
        ds.append(d)
        te += d
        room -= 1
    return te


def apply(e: Engine, j: int) -> None:
    """Apply the first ``j`` planned step ends to ``e`` (as ``on_step_end`` and
    ``observe`` would have one by one)."""
    ts = e.ahead_t
    ds = e.ahead_d
    n = len(e.decoding)
    ctx = e.ctx
    w = e.obs
    busy = w[1]
    for i in range(j):
        busy += ds[i]
    w[0] += j
    w[1] = busy
    w[2] += n * j
    w[3] += j * ctx + n * j * (j + 1) // 2  # the sum of ctx + n, ctx + 2n, ...
    e.ctx = ctx + n * j
    e.step_ends.extend(ts[:j])
    del ts[:j]
    del ds[:j]


def cut(e: Engine, t: float) -> float | None:
    """A request joins ``e``'s queue at ``t``: drop the planned ends from the first one
    after ``t`` on and return it (the step end that must now be an event: it forms the
    next step with the newcomer), or None when every planned end comes before ``t``."""
    ts = e.ahead_t
    j = bisect_left(ts, t)
    if j == len(ts):
        return None
    te = ts[j]
    del ts[j:]
    del e.ahead_d[j:]
    return te


def catch_up(e: Engine, t: float) -> None:
    """Apply ``e``'s planned step ends before ``t`` (before something reads it at ``t``)."""
    if e.ahead_t:
        apply(e, bisect_left(e.ahead_t, t))
