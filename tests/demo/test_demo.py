"""``conductor demo`` end to end: real processes (gateway + 4 emulated engines) on loopback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_routes_shared_prefixes_and_stops_everything() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "conductor.cli.main",
            "demo",
            "--conversations",
            "2",
            "--turns",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "6/6 requests completed" in out.stdout
    assert "stopped the gateway and the engines" in out.stdout
    # later turns reuse the cached system prompt: some cached tokens are reported
    cached = out.stdout.split("; cached ")[1].split("/")[0]
    assert int(cached) > 0
    # nothing the demo started is left running (its processes all name its temp folder)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "conductor-demo-" not in ps


def test_demo_rejects_bad_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conductor.cli.main", "demo", "--policy", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "--policy" in out.stderr


def test_an_unknown_policy_names_the_flag_the_value_and_the_known_ones() -> None:
    from typer.testing import CliRunner

    from conductor.cli.main import app
    from conductor.core.policies import policy_names

    result = CliRunner().invoke(app, ["demo", "--policy", "nope"])
    assert result.exit_code == 2
    error = " ".join(result.output.replace("│", " ").split()).split("Invalid value for ")[1]
    assert error.startswith(("--policy: unknown policy; known: ", "'--policy': unknown policy"))
    assert error.endswith(", got 'nope'")
    assert all(name in error for name in policy_names())
