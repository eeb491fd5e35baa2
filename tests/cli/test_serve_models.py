"""``conductor serve`` with ``[[models]]``: per-model keys, engines joining their model
(named or discovered), and the start-up errors naming both sides of a conflict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.cli.serve_config import build_settings
from conductor.core.errors import InvalidInput
from tests.engines.costs import COMMITTED

runner = CliRunner()


def model_dir(root: Path, name: str, tokenizer: str, max_len: int) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": max_len}))
    (d / "tokenizer.json").write_text(tokenizer)
    return d


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return (
        model_dir(tmp_path, "a", '{"vocab": "a"}', 512),
        model_dir(tmp_path, "b", '{"vocab": "b"}', 1024),
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    return path


def two_models(a: Path, b: Path, engines: str, extra: str = "") -> str:
    return f"""
[gateway]
block_size = 32
policy = "conductor"
ttft_slo_s = 3.0
{extra}

[[models]]
name = "alpha"
path = "{a}"
cost_file = "{COMMITTED}"

[[models]]
name = "beta"
path = "{b}"
served_name = "beta-served"
max_model_len = 300
block_size = 16
ttft_slo_s = 1.5
policy = "least_loaded"
{engines}
"""


ENGINES = """
[[engines]]
url = "http://10.0.0.1:8000"
role = "both"
model = "alpha"

[[engines]]
url = "http://10.0.0.2:8000"
role = "both"
model = "beta-served"
"""


def no_discovery(url: str) -> str:
    raise AssertionError(f"discovery of {url} was not expected")


def test_models_get_their_own_keys_and_the_gateway_defaults(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    a, b = dirs
    s = build_settings({}, [], write(tmp_path, two_models(a, b, ENGINES)), discover=no_discovery)
    alpha, beta = s.models
    assert (alpha.model.name, alpha.model.upstream_name) == ("alpha", "alpha")
    assert (beta.model.name, beta.model.upstream_name) == ("beta", "beta-served")
    assert (alpha.model.max_model_len, beta.model.max_model_len) == (512, 300)
    assert (alpha.model.block_size_tokens, beta.model.block_size_tokens) == (32, 16)
    assert (alpha.policy, beta.policy) == ("conductor", "least_loaded")
    assert (alpha.scheduler.ttft_slo_s, beta.scheduler.ttft_slo_s) == (3.0, 1.5)
    assert alpha.cost.name == "tiny-cpu"  # the committed file's
    assert beta.cost.name != alpha.cost.name  # the default preset
    assert (alpha.scheduler.context_tokens, beta.scheduler.context_tokens) == (512, 300)
    assert [(e.model, e.block_size_tokens) for e in s.gateway.engines] == [
        ("alpha", 32),
        ("beta-served", 16),
    ]
    assert s.gateway.several_models
    assert s.gateway.model_name == "alpha"


def test_an_engine_without_model_is_discovered(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    a, b = dirs
    engines = '[[engines]]\nurl = "http://10.0.0.3:8000"\nrole = "both"\n'
    asked: list[str] = []

    def discover(url: str) -> str:
        asked.append(url)
        return "beta-served"

    s = build_settings(
        {}, ["http://10.0.0.4:8000,role=both,model=alpha"],
        write(tmp_path, two_models(a, b, engines)), discover=discover,
    )  # fmt: skip
    assert asked == ["http://10.0.0.3:8000"]
    assert [(e.url, e.model, e.block_size_tokens) for e in s.gateway.engines] == [
        ("http://10.0.0.3:8000", "beta-served", 16),
        ("http://10.0.0.4:8000", "alpha", 32),
    ]


def test_an_undiscoverable_engine_is_a_start_up_error(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    a, b = dirs
    engines = '[[engines]]\nurl = "http://10.0.0.3:8000"\nrole = "both"\n'

    def discover(url: str) -> str:
        raise ValueError(f"GET {url}/v1/models failed: connection refused")

    with pytest.raises(InvalidInput) as err:
        build_settings({}, [], write(tmp_path, two_models(a, b, engines)), discover=discover)
    assert str(err.value) == (
        "invalid engines[0].model=None: not given and not discovered: "
        "GET http://10.0.0.3:8000/v1/models failed: connection refused"
    )


CASES = [
    (
        "same_name_different_tokenizers",
        lambda a, b: (
            f'[[models]]\nname = "m"\npath = "{a}"\n[[models]]\nname = "m"\npath = "{b}"\n'
        ),
        "invalid models[1].name='m': also the name of models[0] ({a} and {b}, "
        "different tokenizers)",
    ),
    (
        "same_name_same_tokenizer",
        lambda a, b: (
            f'[[models]]\nname = "m"\npath = "{a}"\n[[models]]\nname = "m"\npath = "{a}"\n'
        ),
        "invalid models[1].name='m': also the name of models[0] ({a} and {a}, the same tokenizer)",
    ),
    (
        "same_served_name",
        lambda a, b: (
            f'[[models]]\nname = "m"\npath = "{a}"\n'
            f'[[models]]\nname = "n"\npath = "{b}"\nserved_name = "m"\n'
        ),
        "invalid models[1].served_name='m': also served by models[0] (m): an engine would "
        "join both",
    ),
    (
        "unknown_key",
        lambda a, b: f'[[models]]\nname = "m"\npath = "{a}"\ncolour = "red"\n',
        "invalid models[0].colour='red': unknown key; known: ",
    ),
    (
        "missing_path",
        lambda a, b: '[[models]]\nname = "m"\n',
        "invalid models[0].path=None: is required",
    ),
    (
        "not_a_folder",
        lambda a, b: f'[[models]]\nname = "m"\npath = "{a}/nope"\n',
        "invalid models[0].path='{a}/nope': is not a directory",
    ),
    (
        "bad_per_model_value",
        lambda a, b: f'[[models]]\nname = "m"\npath = "{a}"\nttft_slo_s = -1.0\n',
        "invalid models[0].ttft_slo_s=-1.0: must be > 0",
    ),
    (
        "one_model_key_too",
        lambda a, b: f'[gateway]\nmodel_path = "{a}"\n[[models]]\nname = "m"\npath = "{a}"\n',
        "invalid gateway.model_path='{a}': excludes [[models]]; set it per model",
    ),
    (
        "cluster",
        lambda a, b: (
            f'[gateway]\ncluster = "nats://127.0.0.1:4222"\n[[models]]\nname = "m"\npath = "{a}"\n'
        ),
        "invalid gateway.cluster='nats://127.0.0.1:4222': not yet with several [[models]]",
    ),
    (
        "engine_of_no_model",
        lambda a, b: (
            f'[[models]]\nname = "m"\npath = "{a}"\n'
            '[[engines]]\nurl = "http://10.0.0.1:8000"\nrole = "both"\nmodel = "other"\n'
        ),
        "invalid engines[0].model='other': no model serves it; known: ['m']",
    ),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_models_config_names_the_key_and_both_sides(
    tmp_path: Path, dirs: tuple[Path, Path], text: object, message: str
) -> None:
    a, b = dirs
    engine = '[[engines]]\nurl = "http://10.0.0.1:8000"\nrole = "both"\nmodel = "m"\n'
    toml = text(a, b)  # type: ignore[operator]
    if "[[engines]]" not in toml:
        toml += engine
    result = runner.invoke(app, ["serve", "--config", str(write(tmp_path, toml)), "--check"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("error: " + message.format(a=a, b=b)), result.stderr


def test_check_prints_every_model(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    a, b = dirs
    path = write(tmp_path, two_models(a, b, ENGINES))
    result = runner.invoke(app, ["serve", "--config", str(path), "--check"])
    assert result.exit_code == 0, result.stderr
    cfg = json.loads(result.stdout)
    assert [(m["name"], m["served_name"], m["max_model_len"]) for m in cfg["models"]] == [
        ("alpha", "alpha", 512),
        ("beta", "beta-served", 300),
    ]
    assert [m["policy"] for m in cfg["models"]] == ["conductor", "least_loaded"]
    assert [e["model"] for e in cfg["engines"]] == ["alpha", "beta-served"]
