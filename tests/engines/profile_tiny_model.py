"""Profile the tiny model on a real vLLM CPU engine and write its cost file (``make
cost-file``, run by ``make test``): start one engine as the integration tests do
(:mod:`tests.engines.fixtures`), run ``conductor profile`` against it, stop it.

    .venv/bin/python tests/engines/profile_tiny_model.py .tiny-model/cost.toml

The real-engine tests read the file it writes (``tests/engines/costs.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.engines.fixtures import (  # noqa: E402
    TINY_MODEL,
    free_ports,
    missing_prerequisites,
    profile_args,
    start_vllm_engine,
)


def main(out: Path) -> int:
    why = missing_prerequisites()
    if why is not None:
        print(f"cannot profile: {why}", file=sys.stderr)
        return 1
    (port,) = free_ports(1)
    engine = start_vllm_engine(port, None, ["--enable-prompt-tokens-details"])
    try:
        waited = engine.wait_healthy()
        print(f"vLLM engine healthy on port {port} after {waited:.0f} s", file=sys.stderr)
        start = time.monotonic()
        cmd = [sys.executable, "-m", "conductor.cli.main", "profile", "--url", engine.base_url]
        cmd += ["--model-path", str(TINY_MODEL), "--out", str(out), "--name", "tiny-cpu"]
        cmd += profile_args()
        code = subprocess.call(cmd, cwd=REPO)
        print(f"profiled in {time.monotonic() - start:.0f} s", file=sys.stderr)
        return code
    finally:
        engine.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
