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
from itertools import accumulate

from conductor.core.cost_forms import LinearDecode
from conductor.sim.nodes import Engine

REPORT_EVERY_STEPS = 32
"""An engine reports its decode-step statistics (``DecodeStepsObserved``) this often."""


def run_ahead(
    e: Engine,
    te: float,
    k: int,
    ctx: int,
    step_s: Callable[[float, float], float],
    linear: LinearDecode | None,
    mul: float | None,
) -> float:
    """Plan ``e``'s decode-only steps after the one just started (its end ``te`` is the
    ``k + 1``-th; ``ctx`` is what that step read, ``step_s`` the decode step time,
    ``linear`` the same when it is a :class:`LinearDecode` (computed inline), ``mul`` its
    factor when the engine cost is perturbed); returns the end of the last planned step
    (the one the caller pushes as the event)."""
    n = len(e.decoding)
    room = REPORT_EVERY_STEPS - 1 - int(e.obs[0])  # no planned step start may report
    fh = e.finish_heap
    if fh:
        room = min(room, fh[0][0] - k - 1)  # ends after index k, before the first finish
    # a planned end's ctx (ctx + i n) must keep (ctx + n (block - 1)) // block <= kv_blocks
    fits_below = (e.kv_blocks + 1) * e.block - n * (e.block - 1)
    room = min(room, (fits_below - 1 - ctx) // n)
    if room <= 0:
        return te
    ctxs = range(ctx + n, ctx + n * room + 1, n)
    if linear is not None:
        base = linear.c0 + linear.c1 * n  # as LinearDecode.step_s adds them: c0 + c1 B first
        c2 = linear.c2
        ds = [base + c2 * c for c in ctxs]
    else:
        ds = [step_s(n, c) for c in ctxs]
    if mul is not None:
        ds = [d * mul for d in ds]
    ts = list(accumulate(ds, initial=te))  # te, te + d1, (te + d1) + d2, ...: as step by step
    te = ts.pop()
    e.ahead_t.extend(ts)
    e.ahead_d.extend(ds)
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
