"""``conductor serve``: configuration from TOML and options, and clear errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.cli.serve_config import build_settings, parse_engine_spec
from conductor.core.errors import InvalidInput
from tests.engines.costs import COMMITTED

runner = CliRunner()
ENGINE = "http://127.0.0.1:8100,role=both,kv_events=tcp://127.0.0.1:5557,block_size=32"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return d


def check(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["serve", *args, "--check"], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_check_prints_the_resolved_configuration(model_dir: Path) -> None:
    code, out, err = check(
        "--model-path", str(model_dir), "--block-size", "32", "--engine", ENGINE,
        "--engine", "http://10.0.0.2:8000,role=decode,id=dec,model=served,block_size=32",
        "--cost-file", str(COMMITTED), "--prefill-tokens-per-s", "25000", "--ttft-slo-s", "2",
    )  # fmt: skip
    assert code == 0, err
    cfg = json.loads(out)
    assert cfg["model_name"] == "tiny"
    assert cfg["max_model_len"] == 512
    assert cfg["block_size"] == 32
    assert cfg["policy"] == "conductor"
    assert cfg["admission"] == "early"
    assert cfg["cost_model"] == "tiny-cpu+calibrated"  # the committed file's name
    assert cfg["ttft_slo_s"] == 2.0
    assert cfg["admin_api"] is False
    assert cfg["engines"] == [
        {
            "id": "127.0.0.1:8100",
            "url": "http://127.0.0.1:8100",
            "role": "both",
            "kv_events": "tcp://127.0.0.1:5557",
            "replay": None,
            "model": None,
            "block_size": 32,
            "topic": "",
            "kind": "vllm",
            "max_blocks": None,
            "prefill_lanes": 1,
            "prefill_chunk_tokens": 0,
        },
        {
            "id": "dec",
            "url": "http://10.0.0.2:8000",
            "role": "decode",
            "kv_events": None,
            "replay": None,
            "model": "served",
            "block_size": 32,
            "topic": "",
            "kind": "vllm",
            "max_blocks": None,
            "prefill_lanes": 1,
            "prefill_chunk_tokens": 0,
        },
    ]


def test_toml_file_with_options_taking_precedence(model_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text(
        f"""
[gateway]
model_path = "{model_dir}"
model_name = "tiny-chat"
block_size = 32
policy = "least_loaded"
port = 9000
ttft_slo_s = 5

[[engines]]
id = "p0"
url = "http://10.0.0.1:8000"
role = "prefill"
kv_events = "tcp://10.0.0.1:5557"
replay = "tcp://10.0.0.1:5558"

[[engines]]
id = "d0"
url = "http://10.0.0.2:8000"
role = "decode"
"""
    )
    code, out, err = check("--config", str(toml), "--port", "9100", "--engine", ENGINE)
    assert code == 0, err
    cfg = json.loads(out)
    assert (cfg["model_name"], cfg["policy"], cfg["listen"]) == (
        "tiny-chat",
        "least_loaded",
        "127.0.0.1:9100",
    )
    assert cfg["admission"] == "off"
    assert cfg["ttft_slo_s"] == 5.0
    assert [(e["id"], e["role"]) for e in cfg["engines"]] == [
        ("p0", "prefill"),
        ("d0", "decode"),
        ("127.0.0.1:8100", "both"),
    ]
    assert cfg["engines"][0]["replay"] == "tcp://10.0.0.1:5558"


def test_admin_token_from_environment(model_dir: Path) -> None:
    code, out, _ = check(
        "--model-path", str(model_dir), "--block-size", "32", "--engine", ENGINE,
        env={"CONDUCTOR_ADMIN_TOKEN": "a-long-secret"},
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["admin_api"] is True
    assert "a-long-secret" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--engine", "http://h:1,role=bogus,block_size=32"],
            "invalid engines[0].role='bogus': must be one of prefill, decode, both",
        ),
        (
            ["--engine", "http://h:1,role=both,block_size=16"],
            "invalid engines[0].block_size=16: must equal the gateway block size 32",
        ),
        (
            ["--engine", "ftp://h:1,role=both,block_size=32"],
            "invalid engines[0].url='ftp://h:1': must look like http://host:port",
        ),
        (
            ["--engine", "http://h:1,role=both,block_size=32,kv_events=http://h:2"],
            "invalid engines[0].kv_events='http://h:2': must look like tcp://host:port",
        ),
        (
            ["--engine", "http://h:1,role=both,block_size=thirty"],
            "invalid engines[0].block_size='thirty': must be an integer",
        ),
        (
            ["--engine", "http://h:1,role=both,colour=red"],
            "invalid engines[0].colour='red': unknown key; known: ('id', 'url', 'role', "
            "'kv_events', 'replay', 'model', 'block_size', 'topic', 'kind', 'max_blocks', "
            "'prefill_lanes', 'prefill_chunk_tokens')",
        ),
        (
            ["--engine", "http://h:1,both"],
            "invalid engine='http://h:1,both': 'both' is not key=value",
        ),
        (
            ["--engine", ENGINE, "--engine", ENGINE],
            "invalid engines[1].id='127.0.0.1:8100': duplicate engine id",
        ),
        ([], "invalid engines=[]: none given (--engine or [[engines]] in --config)"),
        (
            ["--engine", ENGINE, "--policy", "nope"],
            "invalid --policy='nope': unknown policy; known: ",
        ),
        (
            ["--engine", ENGINE, "--preset", "gpt-9"],
            "invalid --preset='gpt-9': unknown; known: ",
        ),
        (
            ["--engine", ENGINE, "--ttft-slo-s", "0"],
            "invalid --ttft-slo-s=0.0: must be > 0",
        ),
        (
            ["--engine", ENGINE, "--admission", "maybe"],
            "invalid --admission='maybe': must be one of: off, baseline, early, reserve,"
            " predictive",
        ),
        (
            ["--engine", ENGINE, "--admin-token", "short"],
            "invalid --admin-token='<hidden>': must be at least 8 characters",
        ),
        (
            ["--engine", ENGINE, "--max-attempts", "0"],
            "invalid --max-attempts=0: must be >= 1",
        ),
        (
            ["--engine", ENGINE, "--port", "70000"],
            "invalid --port=70000: must be a TCP port in 0..65535",
        ),
        (
            ["--engine", ENGINE, "--prefill-tokens-per-s", "-5"],
            "invalid --prefill-tokens-per-s=-5.0: must be > 0",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None,
)
def test_bad_configuration_exits_2_naming_field_and_value(
    model_dir: Path, args: list[str], message: str
) -> None:
    code, out, err = check("--model-path", str(model_dir), "--block-size", "32", *args)
    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {message}"), err


def test_missing_model_path_and_bad_toml(tmp_path: Path) -> None:
    code, _, err = check("--engine", ENGINE)
    assert (code, err.strip()) == (
        2,
        "error: invalid model_path=None: is required (--model-path or gateway.model_path)",
    )
    code, _, err = check("--model-path", str(tmp_path / "absent"), "--engine", ENGINE)
    assert code == 2
    assert err.strip().endswith("absent': is not a directory")
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway\nport = 1")
    code, _, err = check("--config", str(bad))
    assert code == 2
    assert err.startswith(f"error: invalid config='{bad}': not valid TOML: ")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[gateway]\nprot = 1\n")
    code, _, err = check("--config", str(unknown))
    assert code == 2
    assert err.startswith("error: invalid gateway.prot=1: unknown key; known: ")


def test_engine_spec_parsing() -> None:
    assert parse_engine_spec(" http://h:1 , role=prefill,kv_events=tcp://h:2 ") == {
        "url": "http://h:1",
        "role": "prefill",
        "kv_events": "tcp://h:2",
    }
    assert parse_engine_spec("url=http://h:1,role=both") == {"url": "http://h:1", "role": "both"}
    with pytest.raises(InvalidInput, match="'role' given twice"):
        parse_engine_spec("http://h:1,role=both,role=decode")


def test_scheduler_config_never_plans_cpp(model_dir: Path) -> None:
    settings = build_settings(
        {"model_path": str(model_dir), "block_size": 32, "policy": "conductor"}, [ENGINE]
    )
    assert settings.scheduler.cpp_enabled is False
    assert settings.scheduler.block_size_tokens == 32
    assert settings.gateway.block_size_tokens == 32


def test_cost_file_from_toml_and_its_errors(model_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "gw.toml"
    toml.write_text(f'[gateway]\ncost_file = "{COMMITTED}"\n')
    base = ("--model-path", str(model_dir), "--block-size", "32", "--engine", ENGINE)
    code, out, err = check("--config", str(toml), *base)
    assert code == 0, err
    assert json.loads(out)["cost_model"] == "tiny-cpu"
    code, _, err = check("--config", str(toml), *base, "--preset", "llama3-8b-h100")
    assert code == 2
    assert err.startswith(f"error: invalid gateway.cost_file='{COMMITTED}': excludes --preset")
    bad = tmp_path / "bad.toml"
    bad.write_text(COMMITTED.read_text().replace('form = "linear"', 'form = "cubic"'))
    code, _, err = check(*base, "--cost-file", str(bad))
    assert code == 2
    assert err.startswith(f"error: invalid --cost-file='{bad}': invalid decode.form='cubic'")
    code, _, err = check(*base, "--cost-file", str(tmp_path / "none.toml"))
    assert code == 2 and "cannot read: No such file or directory" in err


def test_cluster_options_and_toml_keys(model_dir: Path, tmp_path: Path) -> None:
    code, out, err = check(
        "--model-path", str(model_dir), "--block-size", "32", "--engine", ENGINE,
        "--cluster", "nats://10.0.0.9:4222", "--replica-id", "gw-a",
    )  # fmt: skip
    assert code == 0, err
    cfg = json.loads(out)
    assert (cfg["cluster"], cfg["replica_id"], cfg["workers"]) == (
        "nats://10.0.0.9:4222",
        "gw-a",
        1,
    )
    toml = tmp_path / "c.toml"
    toml.write_text(
        f'[gateway]\nmodel_path = "{model_dir}"\nblock_size = 32\ncluster = "nats://h:1"\n'
        "workers = 3\ncluster_expiry_s = 5.0\n"
        f'[[engines]]\nurl = "http://127.0.0.1:8100"\nrole = "both"\nblock_size = 32\n'
    )
    s = build_settings({}, [], toml)
    assert s.cluster is not None and s.cluster.url == "nats://h:1" and s.cluster.expiry_s == 5.0
    assert s.cluster.replica_id == "" and s.workers == 3
    assert build_settings({}, [], toml).cluster == s.cluster


def test_bad_cluster_options_are_named(model_dir: Path) -> None:
    base = ("--model-path", str(model_dir), "--block-size", "32", "--engine", ENGINE)
    code, _, err = check(*base, "--cluster", "http://x:1")
    assert code == 2
    assert err.startswith("error: invalid --cluster='http://x:1': must be a nats:// URL")
    code, _, err = check(*base, "--workers", "0")
    assert code == 2 and "--workers" in err and "must be >= 1" in err
    code, _, err = check(*base, "--cluster", "nats://x:1", "--replica-id", "a/b")
    assert code == 2 and "--replica-id" in err
