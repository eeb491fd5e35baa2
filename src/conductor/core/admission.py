"""Overload-oriented admission (arXiv §7): the rules that reject a request at arrival.

Every mode but ``off`` first rejects when the chosen prefill's predicted TTFT misses the
TTFT SLO. Then, on the decode side (``E[out] = E[min(L, cap)]`` and ``q(out)``, its high
quantile, from the output-length predictor; TBT = step time x :func:`tbt_factor`):

* ``early`` — the paper's Early Rejection (§7.2): the *current* load of the decode instance
  the request is placed on, i.e. the requests decoding there now plus this one:
  ``step(running + 1, running_kv + prompt + E[out])`` against the TBT SLO, and
  ``running_kv + prompt + q(out)`` against its KV capacity;
* ``reserve`` — stricter: the same check with every request already *assigned* to the
  instance (also those still in prefill, whose KV is reserved at arrival): the decode
  policy's own ``fits``;
* ``predictive`` — Early Rejection based on Prediction (§7.4): the load each decode instance
  is forecast to have over the request's whole life there, from its admission ``now`` to
  the end of its decode ``t* + E[out] * token_s``, ``t* = now + TTFT``
  (:class:`~conductor.core.forecast.DecodeForecast`: requests joining when their prefill
  ends, leaving when their predicted output is done, running ones never dropped). The new
  request is counted from ``now``, not from ``t*``: its decode instance is booked at
  admission, and a forecast that an instance which is full now will have drained by ``t*``
  rests on predicted departures, so the current load (early's check) is part of the window
  (the current overload the issue found ignored). The instance with the lowest peak TBT
  among those with KV room at their peak is chosen — the request is committed to that same
  instance — and the request is rejected if that peak misses the TBT SLO or if the pool's
  mean load now (the paper's "average TBT ratio of all decoding instances") exceeds 1.

``baseline`` checks decode only when prefill ends (``Scheduler.confirm_decode``).
"""

from __future__ import annotations

from conductor.core.forecast import DecodeForecast
from conductor.core.output_length import OutputLengthModel
from conductor.core.plan import Rejection
from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.policies.decode import kv_capacity, max_batch, tbt_factor
from conductor.core.state import InstanceState


def check_ttft(ctx: SchedulingContext, pre: PrefillChoice, tbt_s: float) -> Rejection | None:
    req = ctx.request
    slo = ctx.ttft_slo_s
    if pre.ttft_s > slo:
        return Rejection(
            req.request_id,
            "ttft_slo",
            f"predicted TTFT {pre.ttft_s:.3f}s > SLO {slo:.3f}s on {pre.instance}",
            pre.ttft_s,
            tbt_s,
        )
    return None


def _tbt_rejection(ctx: SchedulingContext, pre: PrefillChoice, tbt_s: float, why: str) -> Rejection:
    slo = ctx.tbt_slo_s
    return Rejection(
        ctx.request.request_id,
        "tbt_slo",
        f"{why}TBT {tbt_s * 1e3:.1f}ms > SLO {slo * 1e3:.1f}ms",
        pre.ttft_s,
        tbt_s,
    )


def _kv_rejection(ctx: SchedulingContext, pre: PrefillChoice, tbt_s: float) -> Rejection:
    return Rejection(
        ctx.request.request_id, "kv_capacity", "no decode instance has KV room", pre.ttft_s, tbt_s
    )


def _instance(ctx: SchedulingContext, dec: DecodeChoice) -> InstanceState:
    for inst in ctx.decode_pool:
        if inst.spec.instance_id == dec.instance:
            return inst
    raise AssertionError(f"decode choice {dec.instance} is not in the pool")


def check_early(ctx: SchedulingContext, pre: PrefillChoice, dec: DecodeChoice) -> Rejection | None:
    """The paper's Early Rejection on ``dec``'s instance: its current (running) load."""
    inst = _instance(ctx, dec)
    d = inst.decode
    out = ctx.output
    prompt = ctx.request.prompt_tokens
    tbt = ctx.cost.decode_step_s(d.running + 1, int(d.running_kv_tokens + prompt + out.mean))
    tbt *= tbt_factor(out.mean)
    if tbt > ctx.tbt_slo_s:
        return _tbt_rejection(ctx, pre, tbt, "predicted ")
    room = d.running_kv_tokens + prompt + out.high <= kv_capacity(ctx, inst)
    if not room or d.running >= max_batch(ctx, inst):
        return _kv_rejection(ctx, pre, tbt)
    return None


def check_reserve(
    ctx: SchedulingContext, pre: PrefillChoice, dec: DecodeChoice
) -> Rejection | None:
    """Every request assigned to ``dec``'s instance counts (the decode policy's ``fits``)."""
    if dec.fits:
        return None
    if dec.tbt_s > ctx.tbt_slo_s:
        return _tbt_rejection(ctx, pre, dec.tbt_s, "predicted ")
    return _kv_rejection(ctx, pre, dec.tbt_s)


def check_predictive(
    ctx: SchedulingContext,
    pre: PrefillChoice,
    forecast: DecodeForecast,
    lengths: OutputLengthModel,
) -> Rejection | DecodeChoice:
    """The forecast from now to the end of the request's decode; returns the decode instance
    to commit to."""
    req = ctx.request
    out = ctx.output
    slo = ctx.tbt_slo_s
    now = ctx.now_s
    t1 = now + pre.ttft_s + out.mean * forecast.token_s
    own = req.prompt_tokens + out.mean / 2  # its mean context while it decodes
    # counted from its admission on: its decode instance is booked now (see the docstring)
    loads = forecast.window(now, now, t1, ctx.decode_pool, own, ctx.cost, lengths)
    factor = tbt_factor(out.mean)
    best = None
    for inst, load in zip(ctx.decode_pool, loads, strict=True):
        room = load.max_kv_tokens + req.prompt_tokens + out.high <= kv_capacity(ctx, inst)
        fits = room and load.max_batch < max_batch(ctx, inst)
        if fits and (best is None or load.peak_step_s < best.peak_step_s):
            best = load
    if best is None:
        return _kv_rejection(ctx, pre, min(w.peak_step_s for w in loads) * factor)
    tbt = best.peak_step_s * factor
    if tbt > slo:
        return _tbt_rejection(ctx, pre, tbt, f"forecast to t+{t1 - now:.1f}s: ")
    mean_load = sum(w.step_at_t0_s for w in loads) / len(loads) / slo
    if mean_load > 1.0:
        return _tbt_rejection(ctx, pre, tbt, f"pool load {mean_load:.2f} now; ")
    return DecodeChoice(best.instance, tbt, True)
