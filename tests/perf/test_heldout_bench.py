"""bench/heldout.py: its case syntax (bad input named) and its verdict on given figures."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _bench() -> ModuleType:
    return load_bench("heldout")


def test_cases_parse_and_bad_ones_are_named() -> None:
    m = _bench()
    cases = m.parse_cases("chat:12:13:base, docqa:1.5:17:tbt60")
    assert [(c.kind, c.speed, c.seed, c.variant) for c in cases] == [
        ("chat", 12.0, 13, "base"),
        ("docqa", 1.5, 17, "tbt60"),
    ]
    assert cases[1].label == "docqa 1.5x seed 17 tbt60"
    for text, named in (
        ("chat:1:13", "'chat:1:13' is not KIND:SPEED:SEED:VARIANT"),
        ("code:1:13:base", "unknown kind 'code'"),
        ("chat:1:13:fast", "unknown variant 'fast'"),
        ("chat:x:13:base", "SPEED must be a number and SEED an integer"),
        ("chat:0:13:base", "SPEED must be > 0"),
        (" , ", "no case given"),
    ):
        with pytest.raises(ValueError, match=named):
            m.parse_cases(text)
    assert set(m.VARIANTS) == {
        "base",
        "tbt60",
        "tbt50",
        "ttft10",
        "4p4d",
        "8p4d",
        "off",
        "costerr",
        "4p8d",
        "h100",
        "nofetch",
        "serve",
        "colo",
        "colonofetch",
        "cache300k",
        "cache300knofetch",
        "cache300kcolo",
        "lanes",
        "nofetchlanes",
    }
    assert m.VARIANTS["nofetchlanes"] == {"kv_fetch": False, "prefill_lanes": "engine"}
    for case in m.parse_cases(m.DEFAULT_CASES):
        assert case.variant in m.VARIANTS


def test_conductor_params_parse_and_bad_ones_are_named() -> None:
    m = _bench()
    assert m.parse_params("") == {}
    assert m.parse_params("work_price = 0, late_binding=1.5") == {
        "work_price": 0.0,
        "late_binding": 1.5,
    }
    for text in ("work_price", "=1", "work_price=cheap"):
        with pytest.raises(ValueError, match=f"{text!r} is not KEY=NUMBER"):
            m.parse_params(text)


def test_conductor_params_reach_conductor_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_case`` adds the params to ``conductor``'s config only (the simulator is
    replaced by one that records what each policy was given)."""
    m = _bench()
    seen: dict[str, dict[str, float]] = {}
    real = m.simulate

    def record(reqs, config, outputs):  # type: ignore[no-untyped-def]
        seen[config.policy] = dict(config.scheduler.policy_params)
        return real(reqs[:20], config, outputs=outputs[:20])

    monkeypatch.setattr(m, "simulate", record)
    case = m.parse_cases("docqa:1:13:nofetch")[0]
    rows = m.run_case(case, ["llmd", "conductor"], {"work_price": 0.0})
    assert set(rows) == {"llmd", "conductor"}
    assert seen["conductor"]["work_price"] == 0.0 and "work_price" not in seen["llmd"]


def test_verdict_compares_with_the_best_and_the_fastest_peer() -> None:
    m = _bench()

    def row(goodput: float, ttft: float, tbt_misses: float = 0.0) -> dict[str, float]:
        return {
            "goodput_rps": goodput,
            "ttft_mean_s": ttft,
            "slo_attainment": 1.0,
            "rejected": 0,
            "tbt_miss_share": tbt_misses,
        }

    rows = {"conductor": row(4.0, 3.0), "sglang": row(3.2, 2.5), "llmd": row(3.6, 4.0)}
    v = m.verdict(rows)
    assert v["best_peer"] == "llmd"
    assert v["goodput_margin"] == pytest.approx(4.0 / 3.6 - 1.0)
    assert v["highest_goodput"] is True
    assert v["fastest_peer"] == "sglang"
    assert v["lowest_ttft"] is False
    # ties at the printed precision count as ties
    tied = m.verdict({"conductor": row(2.4401, 0.181), "random": row(2.4398, 0.184)})
    assert tied["highest_goodput"] is True and tied["lowest_ttft"] is True
    # TBT misses: within 1%, or no policy within it
    assert v["tbt_misses_ok"] is True
    over = {"conductor": row(4.0, 3.0, 0.012), "sglang": row(3.2, 2.5, 0.009)}
    assert m.verdict(over)["tbt_misses_ok"] is False
    everyone = {"conductor": row(4.0, 3.0, 0.03), "sglang": row(3.2, 2.5, 0.011)}
    assert m.verdict(everyone)["tbt_misses_ok"] is True
    edge = {"conductor": row(4.0, 3.0, 0.01), "sglang": row(3.2, 2.5, 0.0)}
    assert m.verdict(edge)["tbt_misses_ok"] is True
