"""Time reading the bundled Mooncake conversation trace; prints JSON (a figure, not a test).

Run: ``.venv/bin/python bench/bench_trace_read.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from conductor.workload.trace import bundled_trace_path, read_trace, records_to_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    path = bundled_trace_path()
    read_s: list[float] = []
    convert_s: list[float] = []
    records = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = read_trace(path)
        middle = time.perf_counter()
        records_to_requests(result.records)
        end = time.perf_counter()
        read_s.append(middle - start)
        convert_s.append(end - middle)
        records = len(result.records)
    print(
        json.dumps(
            {
                "trace": path.name,
                "records": records,
                "repeat": args.repeat,
                "read_s_min": round(min(read_s), 4),
                "read_s_median": round(statistics.median(read_s), 4),
                "read_s_max": round(max(read_s), 4),
                "to_requests_s_median": round(statistics.median(convert_s), 4),
            }
        )
    )


if __name__ == "__main__":
    main()
