"""Load test: completions straight to an emulated engine vs through ``conductor serve``.

``--help`` says what is measured and how (bench/loadgen/cli.py). The pieces, one job each,
are in bench/loadgen/: the run and its prompts (spec), one request by a Python client
(clients), driving a load (drive), paired latency (paired), wrk (wrk), a warm-up and measured
run (measure), the engines and gateway processes (cluster), their counters and CPU (usage),
figures and JSON (report), the command line (cli).

Run: ``.venv/bin/python bench/gateway_load.py [--engines 2] [--requests 2000]
[--concurrency 32] [--max-tokens 8] [--json out/gateway_load.json]``.
"""

from __future__ import annotations

import sys

from loadgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
