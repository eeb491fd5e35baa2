"""How ``conductor compare | capacity`` lay out their runs (:class:`Row`, :func:`footing`)
and how the simulation commands print their results: the table (one row per run, and under
a pooled run one indented row per model), its Markdown form, ``simulate``'s extras line and
``capacity``'s table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import typer

from conductor.cli.sim_options import DEFAULTS
from conductor.core.policies import policy_config_defaults
from conductor.sim.report import table_rows

COMPARE_ADMISSION = "early"
"""The admission mode ``compare`` and ``capacity`` run every policy under by default."""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of ``compare`` / ``capacity``: a policy under an admission mode and a CPP
    setting (None: the policy's own bundle, ``bundle`` True)."""

    policy: str
    admission: str | None
    cpp: bool | None
    bundle: bool = False

    @property
    def label(self) -> str:
        if self.bundle:
            own = policy_config_defaults(self.policy)
            parts = [str(own.get("admission", DEFAULTS.scheduler.admission))]
            if own.get("cpp_enabled", DEFAULTS.scheduler.cpp_enabled):
                parts.append("cpp")
            return f"{self.policy} (own bundle: {'+'.join(parts)})"
        return f"{self.policy} ({self.admission}{', cpp' if self.cpp else ''})"


def footing(
    names: list[str], modes: list[str | None], cpp: bool | None, *, bundle: bool
) -> list[Row]:
    """Equal footing: every policy under each of ``modes`` (None: :data:`COMPARE_ADMISSION`)
    and one CPP setting (None: the config's default, off); with ``bundle``, one extra row
    per policy whose own defaults (``config_defaults``, e.g. ``conductor``'s early + CPP)
    differ from every row it already has."""
    same_cpp = DEFAULTS.scheduler.cpp_enabled if cpp is None else cpp
    rows = [Row(n, m or COMPARE_ADMISSION, same_cpp) for n in names for m in modes]
    if bundle:
        for n in names:
            own = policy_config_defaults(n)
            if not own:
                continue
            mine = (
                str(own.get("admission", DEFAULTS.scheduler.admission)),
                bool(own.get("cpp_enabled", DEFAULTS.scheduler.cpp_enabled)),
            )
            if all((r.admission, r.cpp) != mine for r in rows if r.policy == n):
                rows.append(Row(n, None, None, bundle=True))
    return rows


def print_extras(summary: dict[str, Any]) -> None:
    """The one-line extras ``simulate`` prints under its table."""
    by = summary["ttft_by_prompt_s"]
    parts = [
        f"{k}: {v['mean']:.2f}s" if v["mean"] is not None else f"{k}: -" for k, v in by.items()
    ]
    typer.echo(
        f"mean TTFT by prompt length: {', '.join(parts)}; CPP requests: {summary['cpp_requests']};"
        f" wasted prefill: {summary['wasted_prefill_s']:.0f}s;"
        f" preemptions: {summary['preemptions']}"
    )


def expanded_rows(results: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """:func:`~conductor.sim.report.table_rows` of ``results``, each pooled result (with
    ``per_model``) followed by one row per model, labelled ``  MODEL (SHAPE)``."""
    shown: list[dict[str, Any]] = []
    labels: list[str | None] = []
    for s in results:
        shown.append(s)
        labels.append(None)
        for model, part in s.get("per_model", {}).items():
            shown.append(part)
            labels.append(f"  {model} ({s['pools'][model]})")
    head, rows = table_rows(shown)
    for row, label in zip(rows, labels, strict=True):
        if label is not None:
            row[0] = label
    return head, rows


def print_table(results: Sequence[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    head, rows = expanded_rows(results)
    table = Table(*head)
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    head, rows = expanded_rows(results)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def print_capacity(rows: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> None:
    """One line per policy row: per TBT threshold, the speed and the request rate it is."""
    from rich.console import Console
    from rich.table import Table

    table = Table("policy", *[f"TBT {t:g} ms: speed (req/s)" for t in thresholds])
    for row in rows:
        cells = []
        for t in thresholds:
            c = row[f"tbt_{t:g}ms"]
            cells.append(f"x{c['speed']:.3f} ({c['rps']:.2f})")
        table.add_row(row["label"], *cells)
    Console(width=200).print(table)
