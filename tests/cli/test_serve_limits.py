"""``conductor serve``'s limits and timeouts: every one a ``[gateway]`` key and a ``--set``
option (some have their own flag), defaults from the config dataclasses, errors naming
where the value came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.cli.serve_config import DEFAULTS, build_settings
from conductor.core.errors import InvalidInput
from conductor.gateway.config import MonitorConfig, RequestLimits
from conductor.web.limits import ServerLimits

runner = CliRunner()
ENGINE = "http://127.0.0.1:8100,role=both,kv_events=ipc:///tmp/kv.sock,block_size=16"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return d


def test_defaults_come_from_the_config_dataclasses() -> None:
    for cls in (ServerLimits, RequestLimits):
        default = cls()
        for name in cls.__dataclass_fields__:
            assert DEFAULTS[name] == getattr(default, name), name
    assert DEFAULTS["kv_max_blocks"] == MonitorConfig().kv_max_blocks


def test_set_toml_and_flag_precedence(model_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text("[gateway]\nmax_headers = 50\nhead_timeout_s = 3.5\nmax_connections = 7\n")
    settings = build_settings(
        {"model_path": str(model_dir), "max_connections": 9},
        [ENGINE],
        toml,
        ["max_headers=40", 'allowed_template_kwargs=["enable_thinking"]', "max_connections=8"],
    )
    g = settings.gateway
    assert g.http == ServerLimits(max_headers=40, head_timeout_s=3.5, max_connections=9)
    assert g.requests.allowed_template_kwargs == ("enable_thinking",)
    assert g.engines[0].kv_events == "ipc:///tmp/kv.sock"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["max_headers=0"], "invalid --set max_headers=0: must be >= 4"),
        (["nope=1"], "invalid set='nope=1': unknown key 'nope'"),
        (["head_timeout_s"], "invalid set='head_timeout_s': must be key=value"),
        (
            ['allowed_template_kwargs=["chat_template"]'],
            "invalid --set allowed_template_kwargs='chat_template': a client template is never run",
        ),
    ],
)
def test_bad_limits_name_their_option(model_dir: Path, sets: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        build_settings({"model_path": str(model_dir)}, [ENGINE], None, sets)
    assert str(info.value).startswith(message), str(info.value)


def test_check_shows_the_limits(model_dir: Path) -> None:
    result = runner.invoke(
        app,
        ["serve", "--model-path", str(model_dir), "--block-size", "16", "--engine", ENGINE,
         "--set", "body_timeout_s=5", "--max-connections", "12", "--check"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    limits = json.loads(result.stdout)["limits"]
    assert (limits["body_timeout_s"], limits["max_connections"]) == (5.0, 12)
    assert limits["max_header_bytes"] == ServerLimits().max_header_bytes
