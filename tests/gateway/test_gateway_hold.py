"""Late binding in the gateway (``conductor.gateway.hold``): requests wait in the pool's
queue while the prefill engine is predicted busy, are placed when its prefill ends,
earliest deadline first, leave the queue when their client goes away, and a policy without
late binding places at arrival.

The engines are an ``httpx.MockTransport`` whose prefill legs wait on a gate per prompt, so
a prefill ends exactly when the test opens its gate; the gateway's clock is a manual one
(it moves only when the test moves it), so the queue's predicted free times never pass on
their own and only the events the test causes release anything.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conductor.cli.serve_config import build_settings
from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import PrefillFinished
from conductor.core.plan import Plan, Rejection
from conductor.core.policies.colocated import ColocatedDecode
from conductor.core.replication import ReplicaScheduler
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway import app as gateway_app
from conductor.gateway.config import GatewayConfig, MonitorConfig, UpstreamConfig
from conductor.gateway.errors import NoEngine, Overloaded
from conductor.gateway.hold import Hold
from conductor.gateway.metrics import GatewayMetrics
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.service import Gateway
from conductor.web.messages import Response
from tests.engines.costs import committed_cost
from tests.gateway.harness import (
    BLOCK,
    MAX_MODEL_LEN,
    MODEL,
    FakeTokenizer,
    engine,
    make_models_gateway,
)

pytestmark = pytest.mark.anyio


class ManualClock:
    def __init__(self, now_s: float = 100.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class GatedEngines:
    """A prefill engine ``p`` whose answer to prompt X waits until ``open(X)``, and a
    decode engine ``d`` that answers at once; both record the prompts in arrival order."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.seen: dict[str, list[str]] = {"p": [], "d": []}

    def gate(self, prompt: str) -> asyncio.Event:
        return self.gates.setdefault(prompt, asyncio.Event())

    def open(self, prompt: str) -> None:
        self.gate(prompt).set()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return httpx.Response(200, text="")
        prompt = str(json.loads(request.content)["prompt"])
        host = request.url.host
        self.seen[host].append(prompt)
        if host == "p":
            await self.gate(prompt).wait()
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "usage": usage})


def build(
    engines: GatedEngines,
    clock: ManualClock,
    *,
    policy: str = "conductor",
    policy_params: dict[str, float] | None = None,
    roles: tuple[Role, ...] = (Role.PREFILL, Role.DECODE),
    ttft_slo_s: float = 30.0,
) -> Gateway:
    sched = SchedulerConfig(
        block_size_tokens=BLOCK,
        ttft_slo_s=ttft_slo_s,
        admission="early",
        cpp_enabled=False,
        policy_params=policy_params or {},
    )
    conductor = Scheduler(committed_cost(), policy=policy, config=sched)
    conductor.decode_policy = ColocatedDecode(conductor.decode_policy)
    names = ("p", "d")
    cfg = GatewayConfig(
        model_name=MODEL,
        max_model_len=MAX_MODEL_LEN,
        block_size_tokens=BLOCK,
        engines=tuple(engine(n, f"http://{n}:8000", r) for n, r in zip(names, roles, strict=False)),
        admin_token=None,
        upstream=UpstreamConfig(connect_timeout_s=2.0, request_timeout_s=20.0),
        monitor=MonitorConfig(health_interval_s=60.0, health_timeout_s=1.0, load_interval_s=60.0),
    )
    transport = httpx.MockTransport(engines.handler)
    return Gateway(cfg, conductor, FakeTokenizer(), transport=transport, clock=clock)


def body(prompt: str) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


def metric(gw: Gateway, line_start: str) -> str:
    """The value of the first exposition line starting with ``line_start``."""
    for line in gw.metrics.exposition().decode().splitlines():
        if line.startswith(line_start):
            return line.rsplit(" ", 1)[1]
    raise AssertionError(f"no metric line {line_start!r}")


def metric_lines(gw: Gateway, prefix: str) -> str:
    lines = gw.metrics.exposition().decode().splitlines()
    return "\n".join(line for line in lines if line.startswith(prefix))


async def settle(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate()`` holds (bounded: the test fails otherwise)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the gateway did not get there")


async def test_at_light_load_a_request_is_placed_at_once() -> None:
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock, roles=(Role.BOTH,))
    engines.open("a")
    async with gateway_app.lifespan(gw):
        resp = await gw.generate("completion", body("a"))
    assert isinstance(resp, Response) and resp.status == 200
    assert gw.pools.first.hold.enabled
    assert metric(gw, 'conductor_hold_seconds_bucket{le="0.0",outcome="placed"}') == "1.0"
    assert metric(gw, 'conductor_hold_seconds_count{outcome="placed"}') == "1.0"
    assert metric(gw, "conductor_held_requests") == "0.0"
    assert gw.conductor.inflight() == 0


async def test_held_while_the_prefill_engine_is_busy_then_placed_earliest_deadline_first() -> None:
    """a occupies p; b (arrived at 100.001) and c (100.002) wait. a's prefill ends: b goes
    (earlier deadline), c waits behind it until b's prefill ends."""
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock)
    hold = gw.pools.first.hold
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        clock.now_s += 0.001
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: len(hold) == 1)
        clock.now_s += 0.001
        c = asyncio.create_task(gw.generate("completion", body("c")))
        await settle(lambda: len(hold) == 2)
        assert metric(gw, "conductor_held_requests") == "2.0"
        assert gw.pools.first.describe()["held_requests"] == 2
        assert engines.seen["p"] == ["a"] and gw.conductor.inflight() == 1

        clock.now_s += 0.4
        engines.open("a")  # a's prefill leg answers: PrefillFinished frees p
        await settle(lambda: engines.seen["p"] == ["a", "b"])
        assert len(hold) == 1 and not c.done()
        engines.open("b")
        await settle(lambda: engines.seen["p"] == ["a", "b", "c"])
        engines.open("c")
        answers = await asyncio.gather(a, b, c)
    assert [getattr(r, "status", None) for r in answers] == [200, 200, 200]
    assert engines.seen == {"p": ["a", "b", "c"], "d": ["a", "b", "c"]}
    assert len(hold) == 0 and gw.conductor.inflight() == 0
    # each answer says how long it was held (the test's clock: a none, b 0.401 s, c 0.4 s)
    # and the TTFT predicted when it was placed
    headers = [dict(r.headers or {}) for r in answers if isinstance(r, Response)]
    assert [h["x-conductor-queued-ms"] for h in headers] == ["0.0", "401.0", "400.0"]
    assert all(float(h["x-conductor-predicted-ttft-ms"]) > 0.0 for h in headers)
    # a was placed at once; b waited 0.401 s (100.001 to 100.402), c 0.4 s (both placed at
    # 100.402: the clock did not move): both in the (0.25, 0.5] bucket
    assert metric(gw, 'conductor_hold_seconds_bucket{le="0.25",outcome="placed"}') == "1.0"
    assert metric(gw, 'conductor_hold_seconds_bucket{le="0.5",outcome="placed"}') == "3.0"
    assert metric(gw, "conductor_held_requests") == "0.0"


async def test_a_held_request_whose_client_leaves_is_withdrawn() -> None:
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock)
    hold = gw.pools.first.hold
    p0 = gw.conductor.instances[InstanceId("p")].prefill
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: len(hold) == 1)
        b.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await b
        assert len(hold) == 0 and hold.queue is not None and len(hold.queue) == 0
        assert metric(gw, "conductor_held_requests") == "0.0"
        assert metric(gw, 'conductor_hold_seconds_count{outcome="withdrawn"}') == "1.0"
        assert gw.conductor.inflight() == 1 and p0.queued_requests == 1  # a's alone
        engines.open("a")
        resp = await a
    assert getattr(resp, "status", None) == 200
    assert engines.seen == {"p": ["a"], "d": ["a"]}  # b never reached an engine
    assert gw.conductor.inflight() == 0 and p0.queued_requests == 0


async def test_a_decision_that_reaches_a_request_just_cancelled_is_undone() -> None:
    """b's client leaves, and before b's task runs again a release decides it (the clock
    passed a's predicted prefill end): its plan is cancelled in the scheduler."""
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock)
    hold = gw.pools.first.hold
    p0 = gw.conductor.instances[InstanceId("p")].prefill
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: len(hold) == 1)
        clock.now_s = p0.busy_until_s  # p is predicted free now
        b.cancel()
        hold.release()
        assert len(hold) == 0 and gw.conductor.inflight() == 1 and p0.queued_requests == 1
        with pytest.raises(asyncio.CancelledError):
            await b
        engines.open("a")
        await a
    assert engines.seen == {"p": ["a"], "d": ["a"]}
    assert metric(gw, 'conductor_hold_seconds_count{outcome="withdrawn"}') == "1.0"
    assert gw.conductor.inflight() == 0 and p0.queued_requests == 0


async def test_a_held_request_whose_ttft_budget_runs_out_is_answered_429() -> None:
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock, ttft_slo_s=1.0)
    hold = gw.pools.first.hold
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: len(hold) == 1)
        clock.now_s += 2.0  # past b's TTFT SLO
        hold.release()
        with pytest.raises(Overloaded, match=r"\(ttft_slo\): waited 2\.000s, past its TTFT SLO"):
            await b
        engines.open("a")
        await a
    assert metric(gw, 'conductor_hold_seconds_count{outcome="rejected"}') == "1.0"
    assert metric(gw, 'conductor_rejections_total{reason="ttft_slo"}') == "1.0"
    assert engines.seen["p"] == ["a"] and gw.conductor.inflight() == 0


async def test_a_request_that_would_miss_its_slo_behind_the_held_ones_is_answered_429_at_once() -> (
    None
):
    """Prompts of 200 characters, each predicted to take P to prefill; TTFT SLO 2.5 P. a
    occupies p; b, held, starts when a ends (TTFT 2 P); c would start after b (3 P): it is
    answered 429 at arrival, not when its budget runs out, and b is placed as before."""
    engines, clock = GatedEngines(), ManualClock()
    prefill_s = committed_cost().prefill_s(200, 0)
    gw = build(engines, clock, ttft_slo_s=2.5 * prefill_s)
    hold = gw.pools.first.hold
    a_, b_, c_ = ("a" * 200, "b" * 200, "c" * 200)
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body(a_)))
        await settle(lambda: engines.seen["p"] == [a_])
        b = asyncio.create_task(gw.generate("completion", body(b_)))
        await settle(lambda: len(hold) == 1)
        with pytest.raises(
            Overloaded, match=r"\(ttft_slo\): predicted TTFT .* behind 1 held request$"
        ):
            await gw.generate("completion", body(c_))
        assert len(hold) == 1 and engines.seen["p"] == [a_]
        engines.open(a_)
        await settle(lambda: engines.seen["p"] == [a_, b_])
        engines.open(b_)
        answers = await asyncio.gather(a, b)
    assert [getattr(r, "status", None) for r in answers] == [200, 200]
    assert engines.seen == {"p": [a_, b_], "d": [a_, b_]}
    assert metric(gw, 'conductor_hold_seconds_bucket{le="0.0",outcome="rejected"}') == "1.0"
    assert metric(gw, 'conductor_rejections_total{reason="ttft_slo"}') == "1.0"
    assert gw.conductor.inflight() == 0


async def test_losing_the_last_prefill_engine_answers_the_held_requests_503() -> None:
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock)
    hold = gw.pools.first.hold
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: len(hold) == 1)
        gw.set_draining("p", True)  # membership change: nothing can prefill now
        with pytest.raises(NoEngine, match=r"\(no_instance\): no schedulable instance"):
            await b
        assert len(hold) == 0
        engines.open("a")
        await a


@pytest.mark.parametrize(
    ("policy", "params"),
    [("mooncake", None), ("conductor", {"late_binding": 0.0})],
    ids=["policy_without_it", "switched_off"],
)
async def test_without_late_binding_requests_are_placed_at_arrival(
    policy: str, params: dict[str, float] | None
) -> None:
    engines, clock = GatedEngines(), ManualClock()
    gw = build(engines, clock, policy=policy, policy_params=params)
    hold = gw.pools.first.hold
    assert not hold.enabled
    assert gw.pools.first.describe()["late_binding"] is None
    async with gateway_app.lifespan(gw):
        a = asyncio.create_task(gw.generate("completion", body("a")))
        await settle(lambda: engines.seen["p"] == ["a"])
        b = asyncio.create_task(gw.generate("completion", body("b")))
        await settle(lambda: engines.seen["p"] == ["a", "b"])  # queued on p, not held
        assert len(hold) == 0 and gw.conductor.inflight() == 2
        engines.open("a")
        engines.open("b")
        await asyncio.gather(a, b)
    assert engines.seen == {"p": ["a", "b"], "d": ["a", "b"]}
    assert metric(gw, "conductor_held_requests") == "0.0"
    assert "outcome=" not in metric_lines(gw, "conductor_hold_seconds_count")


async def test_the_rule_drops_only_the_nic_condition() -> None:
    """No NIC model in the gateway (the engines' connectors send the KV); the decode
    condition stays, also with prefill-only engines: their hand-offs are priced at the cost
    model's NIC bandwidth (engines cannot pull each other's KV, ``pulls_kv=False``), so a
    disaggregated plan's predicted TBT is the decode step's, not a vanishing bandwidth's."""
    engines, clock = GatedEngines(), ManualClock()
    split = build(engines, clock)
    assert split.pools.first.describe()["late_binding"] == {
        "horizon_s": 0.0,
        "decode_aware": True,
        "tbt_margin": 0.1,
        "headroom_margin": 0.3,
        "nic_aware": False,
    }
    assert not any(s.spec.pulls_kv for s in split.conductor.instances.values())
    plan = split.conductor.schedule(Request(RequestId("x"), 64, (), None), clock())
    assert isinstance(plan, Plan) and plan.prefill != plan.decode
    assert 0.0 < plan.predicted_tbt_s < split.conductor.config.tbt_slo_s
    both = build(engines, clock, roles=(Role.BOTH, Role.BOTH))
    rule = both.pools.first.hold.queue
    assert rule is not None and rule.rule.decode_aware and not rule.rule.nic_aware


def bare_hold(scheduler: Scheduler, clock: ManualClock) -> Hold:
    """A pool's hold shell without a gateway: scheduler ``p`` (prefill) and ``d`` (decode)."""
    scheduler.add_instance(InstanceSpec(InstanceId("p"), Role.PREFILL))
    scheduler.add_instance(InstanceSpec(InstanceId("d"), Role.DECODE))
    hold = Hold(scheduler, clock, GatewayMetrics().pool(MODEL))
    hold.engines_changed()
    return hold


def request(rid: str, now_s: float) -> Request:
    return Request(RequestId(rid), 40, (), 4, arrival_s=now_s)


async def test_the_timer_places_a_held_request_when_the_engine_is_predicted_free() -> None:
    """No event comes: the loop timer armed at the queue's wakeup (the prefill engine's
    predicted free time, in the gateway's clock) releases b once that time has come."""
    clock = ManualClock()
    conductor = Scheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    hold = bare_hold(conductor, clock)
    a = await hold.place(request("a", clock.now_s), clock.now_s)
    assert isinstance(a.decision, Plan) and a.held_s == 0.0
    b = asyncio.create_task(hold.place(request("b", clock.now_s), clock.now_s))
    await settle(lambda: len(hold) == 1)
    free_s = conductor.instances[InstanceId("p")].prefill.busy_until_s
    clock.now_s = free_s  # when the timer fires, the engine is predicted free
    placed = await asyncio.wait_for(b, timeout=30.0)
    assert isinstance(placed.decision, Plan) and placed.decision.prefill == "p"
    assert placed.held_s == free_s - 100.0
    assert len(hold) == 0 and conductor.inflight() == 2


async def test_a_request_still_held_at_its_deadline_is_rejected() -> None:
    """Nothing frees p: b is still held at its deadline (the loop's time, 10 ms on), leaves
    the queue and is rejected (``request_timeout``, the gateway's 429)."""
    clock = ManualClock()
    conductor = Scheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    hold = bare_hold(conductor, clock)
    await hold.place(request("a", clock.now_s), clock.now_s)
    deadline = asyncio.get_running_loop().time() + 0.01
    placed = await hold.place(request("b", clock.now_s), clock.now_s, deadline)
    assert isinstance(placed.decision, Rejection)
    assert placed.decision.code == "request_timeout"
    assert placed.decision.reason == "waited 0.000s in the queue, past the request's deadline"
    assert len(hold) == 0 and hold.queue is not None and len(hold.queue) == 0
    assert conductor.inflight() == 1


async def test_a_replica_announces_the_plans_its_queue_commits() -> None:
    """With ``--cluster`` / ``--workers`` the scheduler is a ReplicaScheduler: a plan the
    queue commits reaches its outbox once, like one ``schedule()`` makes."""
    clock = ManualClock()
    replica = ReplicaScheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    hold = bare_hold(replica, clock)
    await hold.place(request("a", clock.now_s), clock.now_s)
    b = asyncio.create_task(hold.place(request("b", clock.now_s), clock.now_s))
    await settle(lambda: len(hold) == 1)
    assert [type(e).__name__ for e in replica.outbox] == ["Reserved"]
    replica.on_event(PrefillFinished(RequestId("a"), InstanceId("p"), clock.now_s))
    hold.release()
    placed = await b
    assert isinstance(placed.decision, Plan)
    kinds = [(type(e).__name__, e.request_id) for e in replica.outbox]
    assert kinds == [("Reserved", "a"), ("PrefillDone", "a"), ("Reserved", "b")]


async def test_a_replica_not_first_in_turn_claims_a_freed_engine_one_lag_later() -> None:
    """Replica 1 of 2 (``set_claim``, as the replica sync ranks it): engine p is replica
    0's to claim at once, so when a's prefill ends at 100.5 this replica's held b is not
    placed then but by the timer at 100.51, one claim lag later; as replica 0 of 2 it
    would have gone at once."""
    clock = ManualClock()
    replica = ReplicaScheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    hold = bare_hold(replica, clock)
    hold.set_claim(1, 2, 0.01)
    assert hold.queue is not None and hold.queue.claim == (1, 2, 0.01)
    await hold.place(request("a", clock.now_s), clock.now_s)
    b = asyncio.create_task(hold.place(request("b", clock.now_s), clock.now_s))
    await settle(lambda: len(hold) == 1)
    clock.now_s = 100.5
    replica.on_event(PrefillFinished(RequestId("a"), InstanceId("p"), clock.now_s))
    hold.release()
    assert len(hold) == 1  # not yet its turn
    clock.now_s = 100.51
    placed = await asyncio.wait_for(b, timeout=30.0)
    assert isinstance(placed.decision, Plan) and placed.held_s == pytest.approx(0.51)
    first = ReplicaScheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    clock0 = ManualClock()
    hold0 = bare_hold(first, clock0)
    hold0.set_claim(0, 2, 0.01)
    await hold0.place(request("a", 100.0), 100.0)
    c = asyncio.create_task(hold0.place(request("c", 100.0), 100.0))
    await settle(lambda: len(hold0) == 1)
    first.on_event(PrefillFinished(RequestId("a"), InstanceId("p"), 100.5))
    clock0.now_s = 100.5
    hold0.release()
    assert len(hold0) == 0 and isinstance((await c).decision, Plan)


def test_a_serve_config_switches_late_binding_off(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    spec = "http://127.0.0.1:8100,role=both"
    on = build_settings({"model_path": str(model)}, [spec])
    assert on.scheduler.policy_params == {} and on.describe()["late_binding"] is True
    off = build_settings({"model_path": str(model)}, [spec], sets=["late_binding=false"])
    assert off.scheduler.policy_params == {"late_binding": 0.0}
    assert off.describe()["late_binding"] is False


def test_a_serve_config_sets_the_hold_horizon(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    spec = "http://127.0.0.1:8100,role=both"
    early = build_settings({"model_path": str(model)}, [spec], sets=["hold_horizon_ms=25"])
    assert early.scheduler.policy_params == {"late_binding_horizon_s": 0.025}
    assert early.describe()["hold_horizon_s"] == 0.025
    assert build_settings({"model_path": str(model)}, [spec]).describe()["hold_horizon_s"] is None
    with pytest.raises(InvalidInput, match="hold_horizon_ms"):
        build_settings({"model_path": str(model)}, [spec], sets=["hold_horizon_ms=-1"])


def test_a_serve_config_tells_the_scheduler_the_hand_off(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    spec = "http://127.0.0.1:8100,role=both"
    assert build_settings({"model_path": str(model)}, [spec]).scheduler.handoff == "stream"
    load = build_settings({"model_path": str(model)}, [spec], sets=['handoff="load"'])
    assert load.scheduler.handoff == "load"
    with pytest.raises(InvalidInput, match="handoff"):
        build_settings({"model_path": str(model)}, [spec], sets=['handoff="pigeon"'])


async def test_with_several_models_each_pool_holds_in_its_own_queue() -> None:
    """alpha's prefill engine is busy and a second alpha request waits; beta's pool has its
    own queue and places at once. The gauge carries the model label."""
    alpha = ModelConfig("alpha", max_model_len=MAX_MODEL_LEN, block_size_tokens=BLOCK)
    beta = ModelConfig("beta", max_model_len=MAX_MODEL_LEN, block_size_tokens=BLOCK)
    url = "http://10.0.0.1:8000"  # never called: the requests are placed, not sent
    url_b = "http://10.0.0.2:8000"
    gw = make_models_gateway(
        [(alpha, FakeTokenizer()), (beta, FakeTokenizer())],
        [engine("a0", url, model="alpha"), engine("b0", url_b, model="beta")],
    )
    pa, pb = gw.pools.get("alpha"), gw.pools.get("beta")
    clock = ManualClock()
    pa.hold.clock = pb.hold.clock = clock
    first = await pa.hold.place(request("a1", clock.now_s), clock.now_s)
    assert isinstance(first.decision, Plan)
    held = asyncio.create_task(pa.hold.place(request("a2", clock.now_s), clock.now_s))
    await settle(lambda: len(pa.hold) == 1)
    other = await pb.hold.place(request("b1", clock.now_s), clock.now_s)
    assert isinstance(other.decision, Plan) and other.held_s == 0.0
    assert metric(gw, 'conductor_held_requests{model="alpha"}') == "1.0"
    assert metric(gw, 'conductor_held_requests{model="beta"}') == "0.0"
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert metric(gw, 'conductor_held_requests{model="alpha"}') == "0.0"
    assert metric(gw, 'conductor_hold_seconds_count{model="alpha",outcome="withdrawn"}') == "1.0"
