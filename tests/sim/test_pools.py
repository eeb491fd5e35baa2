"""Several models: pool shapes, the equal split, and pooled runs equal to one run per pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.sim.capacity import scale_arrivals
from conductor.sim.config import SimConfig
from conductor.sim.pools import (
    Pool,
    PoolShape,
    find_pools_capacity,
    parse_pool,
    simulate_pools,
    split_cluster,
)
from conductor.sim.records import summarize
from conductor.sim.simulator import simulate
from conductor.workload.synth import synthesize
from conductor.workload.trace import generated_tokens, records_to_requests, split_by_model


@pytest.mark.parametrize(
    ("text", "shape", "shown"),
    [
        ("4P+4D", PoolShape(4, 4), "4P+4D"),
        ("2p + 2d + 1b", PoolShape(2, 2, 1), "2P+2D+1B"),
        ("1D+3P", PoolShape(3, 1), "3P+1D"),
        ("2B", PoolShape(0, 0, 2), "2B"),
        ("1P+1B", PoolShape(1, 0, 1), "1P+1B"),
    ],
)
def test_shapes_parse_and_print(text: str, shape: PoolShape, shown: str) -> None:
    assert PoolShape.parse(text) == shape
    assert str(shape) == shown
    assert PoolShape.parse(str(shape)) == shape
    cfg = shape.config(SimConfig())
    assert (cfg.n_prefill, cfg.n_decode, cfg.n_both) == (shape.prefill, shape.decode, shape.both)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("4X", "must be like 4P+4D"),
        ("4P+4P", "must be like 4P+4D"),
        ("", "must be like 4P+4D"),
        ("P+D", "must be like 4P+4D"),
        ("4P+-1D", "must be like 4P+4D"),
        ("4P", "needs an instance that prefills (P or B) and one that decodes (D or B)"),
        ("0P+3D", "needs an instance that prefills"),
    ],
)
def test_bad_shapes_are_named(text: str, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        PoolShape.parse(text)
    assert (caught.value.field, caught.value.value) == ("pool", text)
    assert why in caught.value.why


def test_pool_names_split_at_the_last_equals_sign() -> None:
    assert parse_pool("a=4P+4D") == ("a", PoolShape(4, 4))
    assert parse_pool(" org/m=1 = 2P+1D") == ("org/m=1", PoolShape(2, 1))
    for bad in ("4P+4D", "=4P+4D", " =1P+1D"):
        with pytest.raises(InvalidInput, match="must be MODEL=SHAPE"):
            parse_pool(bad)


def test_equal_split_gives_the_first_models_the_remainder() -> None:
    assert split_cluster(["a", "b"], 8, 8, 0) == {"a": PoolShape(4, 4), "b": PoolShape(4, 4)}
    assert split_cluster(["a", "b", "c"], 8, 7, 1) == {
        "a": PoolShape(3, 3, 1),
        "b": PoolShape(3, 2),
        "c": PoolShape(2, 2),
    }
    with pytest.raises(InvalidInput) as caught:
        split_cluster(["a", "b"], 3, 1, 1)
    assert caught.value.why == (
        "3P+1D+1B split over 2 models leaves 'b' with 1P, which needs an instance that"
        " prefills (P or B) and one that decodes (D or B); size each pool with --pool"
        " MODEL=SHAPE"
    )


def _pools(n: int = 80, seed: int = 3, **cfg: object) -> list[Pool]:
    """A chat trace for models a (0.6) and b (0.4); a gets 2P+1D, b 1P+1D."""
    records = synthesize("chat", requests=n, rate_rps=4.0, seed=seed, models={"a": 0.6, "b": 0.4})
    base = SimConfig(policy="mooncake", **cfg)  # type: ignore[arg-type]
    shapes = {"a": PoolShape(2, 1), "b": PoolShape(1, 1)}
    return [
        Pool(model, records_to_requests(part), generated_tokens(part), shapes[model].config(base))
        for model, part in sorted(split_by_model(records).items())
    ]


def _without_wall(summary: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in summary.items() if k != "sim_wall_s"}


def test_a_pooled_run_is_one_run_per_pool_and_the_totals_add_up() -> None:
    pools = _pools()
    pooled = simulate_pools(pools)
    assert list(pooled.pools) == ["a", "b"]
    for pool in pools:
        alone = simulate(pool.requests, pool.cfg, outputs=pool.outputs)
        mine = pooled.pools[pool.model]
        assert mine.records == alone.records
        assert _without_wall(mine.summary) == _without_wall(alone.summary)
    total = pooled.total.summary
    a, b = (pooled.pools[m].records for m in ("a", "b"))
    assert (len(a), len(b)) == (44, 36)
    assert total["requests"] == 80
    assert total["pools"] == {"a": "2P+1D", "b": "1P+1D"}
    per_model = total["per_model"]
    assert isinstance(per_model, dict)
    assert per_model == {m: r.summary for m, r in pooled.pools.items()}
    # the totals are the metrics of every request, goodput over the whole trace's span
    arrivals = [r.arrival_s for p in pools for r in p.requests]
    span = max(arrivals) - min(arrivals)
    expected = summarize([*a, *b], ttft_slo_s=30.0, tbt_slo_s=0.1, duration_s=span)
    assert {k: total[k] for k in expected} == expected
    good = round(float(total["slo_attainment"]) * 80)  # type: ignore[arg-type]
    assert total["goodput_rps"] == round(good / span, 6)
    assert pooled.total.records == [*a, *b]
    cluster = pooled.total.config
    assert (cluster.n_prefill, cluster.n_decode, cluster.n_both) == (3, 2, 0)
    assert total["policy"] == "mooncake" and total["admission"] == "off"


def test_one_pool_overloaded_leaves_the_other_untouched() -> None:
    calm = simulate_pools(_pools())
    a, b = _pools()
    hot_a = replace(a, requests=scale_arrivals(a.requests, 50.0))
    hot = simulate_pools([hot_a, b])
    assert hot.pools["a"].summary["ttft_s"] != calm.pools["a"].summary["ttft_s"]
    assert hot.pools["b"].records == calm.pools["b"].records


def test_bad_pool_sets_are_named() -> None:
    a, b = _pools(40)
    cases: list[tuple[list[Pool], str]] = [
        ([], "must hold at least one pool"),
        ([a, replace(b, model="a")], "two pools for one model"),
        ([a, replace(b, requests=[], outputs=[])], "the pool has no requests"),
        (
            [a, replace(b, cfg=replace(b.cfg, scheduler=SchedulerConfig(ttft_slo_s=5.0)))],
            "every pool must have the same SLOs",
        ),
    ]
    for pools, why in cases:
        with pytest.raises(InvalidInput) as caught:
            simulate_pools(pools)
        assert caught.value.field == "pools" and caught.value.why == why


def test_pooled_capacity_speeds_every_pool_up_together() -> None:
    pools = _pools(40, seed=1, scheduler=SchedulerConfig(ttft_slo_s=2.0))
    point, per_model = find_pools_capacity(pools, target=0.9, bisect_steps=1)
    assert point.policy == "mooncake" and point.tbt_slo_ms == 100.0
    assert point.tested == ((0.5, 0.95), (0.75, 0.95), (1.0, 0.875))
    assert (point.speed, per_model) == (0.75, {"a": 0.913043, "b": 1.0})
    for speed, attainment in point.tested:
        scaled = [replace(p, requests=scale_arrivals(p.requests, speed)) for p in pools]
        assert simulate_pools(scaled).total.slo_attainment == attainment
    assert point.attainment >= 0.9
    assert dict(point.tested)[point.speed] == point.attainment
    failing = [s for s, a in point.tested if a < 0.9]
    assert failing and min(failing) > point.speed
    scaled = [replace(p, requests=scale_arrivals(p.requests, point.speed)) for p in pools]
    at = simulate_pools(scaled)
    assert per_model == {m: r.slo_attainment for m, r in at.pools.items()}
