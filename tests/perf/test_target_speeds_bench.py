"""bench/target_speeds.py: its options (bad input named) and the choice of ``S*``."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _bench() -> ModuleType:
    return load_bench("target_speeds")


def test_options_parse_and_bad_ones_are_named() -> None:
    m = _bench()
    assert m.parse_list("chat, docqa", "--kinds", ("chat", "agent", "docqa")) == ["chat", "docqa"]
    assert m.parse_seeds("42,13") == [42, 13]
    for call, named in (
        (lambda: m.parse_list("code", "--kinds", ("chat",)), "--kinds: unknown 'code'"),
        (lambda: m.parse_list(" , ", "--kinds"), "--kinds: nothing given"),
        (lambda: m.parse_seeds("42,x"), "--seeds: 'x' is not an integer"),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value).startswith(named)


def test_target_speed_is_the_largest_peer_capacity_first_on_ties() -> None:
    m = _bench()
    caps = {
        "random": {"speed": 4.0, "attainment": 0.93},
        "mooncake": {"speed": 6.5, "attainment": 0.91},
        "dynamo": {"speed": 6.5, "attainment": 0.95},
        "llmd": {"speed": 2.0, "attainment": 0.99},
    }
    assert m.target_speed(caps) == ("mooncake", 6.5)


def test_a_json_path_without_its_folder_is_refused_before_any_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    m = _bench()
    monkeypatch.setattr(m, "peer_capacities", lambda *a: pytest.fail("ran a simulation"))
    monkeypatch.setattr("sys.argv", ["target_speeds.py", "--json", "/no/such/dir/out.json"])
    with pytest.raises(SystemExit) as exit_:
        m.main()
    assert exit_.value.code == 2
    assert "--json: no folder '/no/such/dir' to write 'out.json' in" in capsys.readouterr().err
