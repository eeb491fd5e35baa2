"""``conductor profile --handoff-url`` over real HTTP: an emulated prefill engine and an
emulated decode engine behind ``conductor serve --kv-transfer-params`` (separate processes:
the NIXL-style legs the emulator speaks). The emulated decode engine pays the cost model's KV
transfer for the prompt blocks it receives, so the profile's
hand-off fit must find that transfer again, written to the cost file's ``[transfer]``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.core.cost_file import cost_to_mapping, parse_cost_file, render_cost_file
from conductor.core.costmodel import preset
from conductor.demo.cluster import Cluster, free_ports
from tests.profiling.tiny_model import KV_BYTES_PER_TOKEN, write_model_dir

pytestmark = pytest.mark.slow
runner = CliRunner()
# the engines' own cost model: llama3-8b's KV (131,072 bytes a token) over 100 MB/s, 1.3 ms a
# token, so the hand-off of a 512-token prompt takes 0.67 s and dwarfs the HTTP overheads
ENGINE_COST = preset("llama3-8b-h100").with_(
    name="slow-transfer", transfer_bytes_per_s=1e8, transfer_latency_s=0.002
)
SECONDS_PER_TOKEN = ENGINE_COST.kv_bytes_per_token / 1e8


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    work = tmp_path_factory.mktemp("handoff")
    tok = write_model_dir(work / "model")
    cost_file = work / "engine-cost.toml"
    cost_file.write_text(render_cost_file(cost_to_mapping(ENGINE_COST, block_size_tokens=32)))
    cluster = Cluster(work)
    try:
        engines = []
        for role in ("prefill", "decode"):
            http, kv, replay = free_ports(3)
            url = f"http://127.0.0.1:{http}"
            cluster.start(role, [
                "emulate", "--port", str(http), "--role", role, "--kv-events-port", str(kv),
                "--replay-port", str(replay), "--cost-file", str(cost_file), "--model-path",
                str(tok), "--model", "demo", "--engine-id", role,
            ], url)  # fmt: skip
            engines += [
                "--engine",
                f"{url},role={role},kv_events=tcp://127.0.0.1:{kv},"
                f"replay=tcp://127.0.0.1:{replay},id={role},model=demo,block_size=32",
            ]
        (port,) = free_ports(1)
        gw = cluster.start("gateway", [
            "serve", *engines, "--model-path", str(tok), "--model-name", "demo",
            "--block-size", "32", "--max-model-len", "8192", "--port", str(port),
            "--health-interval-s", "0.5", "--kv-transfer-params",
        ], f"http://127.0.0.1:{port}")  # fmt: skip
        for p in cluster.procs:
            cluster.wait_healthy(p)
        yield tok, cluster.procs[0].url, gw.url
    finally:
        cluster.stop()


def test_profile_measures_the_hand_off_and_writes_the_transfer(
    setup: tuple[Path, str, str], tmp_path: Path
) -> None:
    tok, prefill_url, gateway_url = setup
    out = tmp_path / "cost.toml"
    r = runner.invoke(app, [
        "profile", "--url", prefill_url, "--model-path", str(tok), "--out", str(out),
        "--lengths", "64,256", "--cached-fractions", "0.5", "--repeats", "1", "--warmup", "1",
        "--batch-sizes", "1,2", "--contexts", "32,64", "--decode-tokens", "8",
        "--handoff-url", gateway_url, "--handoff-lengths", "64,512", "--handoff-samples", "2",
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "hand-off fit" in r.output and "[transfer] bytes_per_s" in r.output
    parsed = parse_cost_file(out.read_text())
    m = parsed.measured
    assert m["transfer"] == f"measured through {gateway_url} (hand-off fit)"
    assert [s[0] for s in m["handoff_samples"]] == [64, 512, 64, 512]
    latency_s, s_per_token, _residual = m["handoff_fit"]
    # the fit finds the engines' transfer: 1.31 ms a token (loose: one run on a shared box)
    assert 0.7 * SECONDS_PER_TOKEN < s_per_token < 1.3 * SECONDS_PER_TOKEN
    cost = parsed.cost
    assert cost.transfer_bytes_per_s == pytest.approx(KV_BYTES_PER_TOKEN / s_per_token)
    # the engines move (n - 1) // 32 whole blocks and compute the rest: the line crosses
    # zero about one block's transfer time (42 ms) below the fixed cost; below 0 reads as 0
    assert cost.transfer_latency_s == pytest.approx(max(0.0, latency_s))


def test_an_unreachable_hand_off_url_is_an_error_naming_the_option(
    setup: tuple[Path, str, str], tmp_path: Path
) -> None:
    tok, prefill_url, _gateway = setup
    r = runner.invoke(app, [
        "profile", "--url", prefill_url, "--model-path", str(tok), "--out",
        str(tmp_path / "c.toml"), "--handoff-url", "http://127.0.0.1:1",
    ])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "--handoff-url" in r.output and "http://127.0.0.1:1" in r.output
    assert not (tmp_path / "c.toml").exists()
