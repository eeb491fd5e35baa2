"""One run of a load with the chosen client (raw, httpx or wrk): its warm-up, then the
measured run, summarised."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from .drive import run_load
from .report import summarize
from .spec import RUN_OFFSET, LoadSpec
from .wrk import run_wrk


def warm_up(spec: LoadSpec, args: argparse.Namespace) -> None:
    """Unmeasured requests first (their own prompts): connections, caches, code paths."""
    if spec.warmup <= 0:
        return
    warm = replace(spec, offset=spec.offset + RUN_OFFSET // 2)
    if spec.client == "wrk":
        run_wrk(replace(warm, duration_s=1.0), args.procs)
    else:
        run_load(replace(warm, requests=spec.warmup, warmup=0), args.procs)


def measure(spec: LoadSpec, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``spec`` (its warm-up not included) with the chosen client, summarised."""
    spec = replace(spec, warmup=0)
    if spec.client == "wrk":
        return run_wrk(spec, args.procs)
    return summarize(run_load(spec, args.procs))
