"""The cost file: a :class:`~conductor.core.costmodel.CostModel` as TOML, written by
``conductor profile`` and read by every command that takes ``--cost-file``.

Pure: :func:`parse_cost_file` takes the file's text, :func:`render_cost_file` returns it (the
CLI reads and writes the file). Every problem raises
:class:`~conductor.core.errors.InvalidInput` naming the key (``prefill.c1``) and the value.

Format (version :data:`FORMAT`)::

    format = 1
    name = "tiny-llama-cpu"              # the cost model's name (reports show it)
    source = "conductor profile ..."     # where the numbers come from

    [prefill]                            # seconds to prefill a prompt of N tokens, p cached
    form = "polynomial"                  # c0 + c1 m + c2 N + c3 m N, m = N - p
    c0 = 0.01                            # (or form = "roofline": mfu, overhead_s; needs
    c1 = 3.3e-05                         #  [hardware])
    c2 = 0.0
    c3 = 0.0

    [decode]                             # seconds per decode step of B requests holding
    form = "linear"                      # C context tokens together: c0 + c1 B + c2 C
    c0 = 0.0024
    c1 = 0.0001
    c2 = 1.3e-06

    [kv]
    capacity_tokens = 1048576            # one instance's KV room
    bytes_per_token = 1024               # optional: checked against [model]
    block_size_tokens = 32               # optional: the engine's KV block (informational)
    max_batch_size = 256

    [transfer]                           # KV moves: latency_s + bytes / bytes_per_s
    bytes_per_s = 1e9
    latency_s = 0.001

    [model]                              # the transformer's shape (config.json): name,
    name = "tiny"                        # layers, hidden, q_heads, kv_heads, head_dim,
    layers = 2                           # params_b; optional a, b (Mooncake Eq. 1),
    ...                                  # bytes_per_elem (2)

    [hardware]                           # optional, needed by form = "roofline": name,
    ...                                  # gpus, flops_per_gpu, hbm_bytes_per_s_per_gpu,
                                         # hbm_bytes_per_gpu, nic_bytes_per_s

    [measured]                           # optional, free-form: what was measured, when, the
    at = "2026-12-01T19:00:00Z"          # samples and the fit's residuals; kept, not used
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor.core.costmodel import (
    CostModel,
    HardwareSpec,
    LinearDecode,
    ModelSpec,
    PolynomialPrefill,
    PrefillModel,
    RooflinePrefill,
)
from conductor.core.errors import InvalidInput

FORMAT = 1
"""The cost file format this module reads and writes."""
TABLES = ("prefill", "decode", "kv", "transfer", "model", "hardware", "measured")
TOP_KEYS = ("format", "name", "source")
UNKNOWN_HARDWARE = HardwareSpec("unknown", 1, 0.0, 0.0, 0.0, 0.0)
"""The hardware of a cost file without ``[hardware]`` (a measured, not derived, model)."""


@dataclass(frozen=True, slots=True)
class CostFile:
    """A parsed cost file: the model and the ``[measured]`` table as written."""

    cost: CostModel
    measured: Mapping[str, Any] = field(default_factory=dict)
    block_size_tokens: int | None = None


# -- reading -------------------------------------------------------------------------------


class _Table:
    """Typed, named access to one table: errors name ``table.key``."""

    def __init__(self, name: str, data: object, keys: Sequence[str]) -> None:
        if not isinstance(data, dict):
            raise InvalidInput(name, data, "must be a table")
        self.name = name
        self.data: dict[str, object] = data
        for key in data:
            if key not in keys:
                raise InvalidInput(
                    self.where(key), data[key], f"unknown key; known: {', '.join(keys)}"
                )

    def where(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> object:
        if key not in self.data:
            raise InvalidInput(self.where(key), None, "is required")
        return self.data[key]

    def number(self, key: str, *, low: float | None = None, positive: bool = False) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(self.where(key), value, "must be a number")
        x = float(value)
        if not math.isfinite(x):
            raise InvalidInput(self.where(key), value, "must be finite")
        if positive and not x > 0:
            raise InvalidInput(self.where(key), value, "must be > 0")
        if low is not None and x < low:
            raise InvalidInput(self.where(key), value, f"must be >= {low:g}")
        return x

    def integer(self, key: str, *, low: int = 1) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(self.where(key), value, "must be an integer")
        if value < low:
            raise InvalidInput(self.where(key), value, f"must be >= {low}")
        return value

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(self.where(key), value, "must be a non-empty string")
        return value


def parse_cost_file(text: str) -> CostFile:
    """The cost file in ``text`` (TOML), checked (see the module docstring)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput("cost_file", "<toml>", f"not valid TOML: {exc}") from None
    return cost_from_mapping(data)


def cost_from_mapping(data: Mapping[str, object]) -> CostFile:
    """A :class:`CostFile` from the TOML document ``data``."""
    top = _Table("", dict(data), (*TOP_KEYS, *TABLES))
    version = top.integer("format", low=0)
    if version != FORMAT:
        raise InvalidInput("format", version, f"unsupported; this conductor reads {FORMAT}")
    name = top.text("name")
    source = top.text("source") if top.has("source") else ""
    model = _model(_Table("model", top.raw("model"), _MODEL_KEYS))
    hardware = (
        _hardware(_Table("hardware", top.raw("hardware"), _HARDWARE_KEYS))
        if top.has("hardware")
        else UNKNOWN_HARDWARE
    )
    kv = _Table("kv", top.raw("kv"), _KV_KEYS)
    if kv.has("bytes_per_token"):
        given = kv.integer("bytes_per_token")
        if given != model.kv_bytes_per_token:
            raise InvalidInput(
                "kv.bytes_per_token",
                given,
                f"disagrees with [model] ({model.kv_bytes_per_token} bytes per token)",
            )
    transfer = _Table("transfer", top.raw("transfer"), ("bytes_per_s", "latency_s"))
    measured = top.raw("measured") if top.has("measured") else {}
    if not isinstance(measured, dict):
        raise InvalidInput("measured", measured, "must be a table")
    cost = CostModel(
        name=name,
        model=model,
        hardware=hardware,
        prefill=_prefill(_Table("prefill", top.raw("prefill"), _PREFILL_KEYS), model, hardware),
        decode=_decode(_Table("decode", top.raw("decode"), ("form", "c0", "c1", "c2"))),
        transfer_bytes_per_s=transfer.number("bytes_per_s", positive=True),
        transfer_latency_s=transfer.number("latency_s", low=0.0),
        kv_capacity_tokens=kv.integer("capacity_tokens"),
        max_batch_size=kv.integer("max_batch_size") if kv.has("max_batch_size") else 256,
        source=source,
    )
    block = kv.integer("block_size_tokens") if kv.has("block_size_tokens") else None
    return CostFile(cost, measured, block)


_MODEL_KEYS = (
    "name",
    "layers",
    "hidden",
    "q_heads",
    "kv_heads",
    "head_dim",
    "params_b",
    "ffn",
    "vocab",
    "bytes_per_elem",
)
_HARDWARE_KEYS = (
    "name",
    "gpus",
    "flops_per_gpu",
    "hbm_bytes_per_s_per_gpu",
    "hbm_bytes_per_gpu",
    "nic_bytes_per_s",
)
_KV_KEYS = ("capacity_tokens", "bytes_per_token", "block_size_tokens", "max_batch_size")
_PREFILL_KEYS = ("form", "c0", "c1", "c2", "c3", "mfu", "overhead_s")
PREFILL_FORMS = ("polynomial", "roofline")
DECODE_FORMS = ("linear",)


def _model(t: _Table) -> ModelSpec:
    return ModelSpec(
        name=t.text("name"),
        layers=t.integer("layers"),
        hidden=t.integer("hidden"),
        q_heads=t.integer("q_heads"),
        kv_heads=t.integer("kv_heads"),
        head_dim=t.integer("head_dim"),
        params_b=t.number("params_b", positive=True),
        ffn=t.integer("ffn"),
        vocab=t.integer("vocab"),
        bytes_per_elem=t.integer("bytes_per_elem") if t.has("bytes_per_elem") else 2,
    )


def _hardware(t: _Table) -> HardwareSpec:
    return HardwareSpec(
        name=t.text("name"),
        gpus=t.integer("gpus"),
        flops_per_gpu=t.number("flops_per_gpu", positive=True),
        hbm_bytes_per_s_per_gpu=t.number("hbm_bytes_per_s_per_gpu", positive=True),
        hbm_bytes_per_gpu=t.number("hbm_bytes_per_gpu", positive=True),
        nic_bytes_per_s=t.number("nic_bytes_per_s", positive=True),
    )


def _form(t: _Table, forms: Sequence[str]) -> str:
    form = t.text("form")
    if form not in forms:
        raise InvalidInput(t.where("form"), form, f"must be one of: {', '.join(forms)}")
    return form


def _only(t: _Table, form: str, allowed: Sequence[str]) -> None:
    for key in t.data:
        if key != "form" and key not in allowed:
            raise InvalidInput(t.where(key), t.data[key], f"not a key of form {form!r}")


def _prefill(t: _Table, model: ModelSpec, hardware: HardwareSpec) -> PrefillModel:
    form = _form(t, PREFILL_FORMS)
    if form == "roofline":
        _only(t, form, ("mfu", "overhead_s"))
        if hardware is UNKNOWN_HARDWARE:
            raise InvalidInput("prefill.form", form, "needs a [hardware] table")
        mfu = t.number("mfu", positive=True)
        if mfu > 1:
            raise InvalidInput("prefill.mfu", mfu, "must be <= 1")
        return RooflinePrefill(model, hardware, mfu=mfu, overhead_s=t.number("overhead_s", low=0))
    _only(t, form, ("c0", "c1", "c2", "c3"))
    c = [t.number(k) for k in ("c0", "c1", "c2", "c3")]
    _check_prefill_positive(c)
    return PolynomialPrefill(*c)


def _check_prefill_positive(c: Sequence[float]) -> None:
    """A prefill model must predict a positive time for every prompt the shells can send:
    checked at the corners ``N = 1`` and ``N = m = 1M`` tokens (the form is bilinear)."""
    c0, c1, c2, c3 = c
    big = 1 << 20
    for n, m in ((1, 1), (big, 1), (big, big)):
        if not c0 + c1 * m + c2 * n + c3 * m * n > 0:
            raise InvalidInput(
                "prefill", {"c0": c0, "c1": c1, "c2": c2, "c3": c3}, f"predicts <= 0 s at N={n}"
            )


def _decode(t: _Table) -> LinearDecode:
    form = _form(t, DECODE_FORMS)
    _only(t, form, ("c0", "c1", "c2"))
    c0 = t.number("c0", positive=True)
    return LinearDecode(c0, t.number("c1", low=0.0), t.number("c2", low=0.0))


# -- writing -------------------------------------------------------------------------------


def cost_to_mapping(
    cost: CostModel,
    *,
    measured: Mapping[str, Any] | None = None,
    block_size_tokens: int | None = None,
) -> dict[str, Any]:
    """The TOML document of ``cost`` (the inverse of :func:`cost_from_mapping`)."""
    doc: dict[str, Any] = {"format": FORMAT, "name": cost.name}
    if cost.source:
        doc["source"] = cost.source
    doc["prefill"] = _prefill_table(cost)
    decode = cost.decode
    if not isinstance(decode, LinearDecode):
        raise InvalidInput("decode", type(decode).__name__, "only LinearDecode can be written")
    doc["decode"] = {"form": "linear", "c0": decode.c0, "c1": decode.c1, "c2": decode.c2}
    kv: dict[str, Any] = {
        "capacity_tokens": cost.kv_capacity_tokens,
        "bytes_per_token": cost.kv_bytes_per_token,
    }
    if block_size_tokens is not None:
        kv["block_size_tokens"] = block_size_tokens
    kv["max_batch_size"] = cost.max_batch_size
    doc["kv"] = kv
    doc["transfer"] = {
        "bytes_per_s": cost.transfer_bytes_per_s,
        "latency_s": cost.transfer_latency_s,
    }
    m = cost.model
    doc["model"] = {
        "name": m.name,
        "layers": m.layers,
        "hidden": m.hidden,
        "q_heads": m.q_heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "params_b": m.params_b,
        "ffn": m.ffn,
        "vocab": m.vocab,
        "bytes_per_elem": m.bytes_per_elem,
    }
    if cost.hardware is not UNKNOWN_HARDWARE:
        h = cost.hardware
        doc["hardware"] = {
            "name": h.name,
            "gpus": h.gpus,
            "flops_per_gpu": h.flops_per_gpu,
            "hbm_bytes_per_s_per_gpu": h.hbm_bytes_per_s_per_gpu,
            "hbm_bytes_per_gpu": h.hbm_bytes_per_gpu,
            "nic_bytes_per_s": h.nic_bytes_per_s,
        }
    if measured:
        doc["measured"] = dict(measured)
    return doc


def _prefill_table(cost: CostModel) -> dict[str, Any]:
    p = cost.prefill
    if isinstance(p, PolynomialPrefill):
        return {"form": "polynomial", "c0": p.c0, "c1": p.c1, "c2": p.c2, "c3": p.c3}
    if isinstance(p, RooflinePrefill):
        return {"form": "roofline", "mfu": p.mfu, "overhead_s": p.overhead_s}
    raise InvalidInput("prefill", type(p).__name__, "only polynomial and roofline forms")


def render_cost_file(doc: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """``doc`` (from :func:`cost_to_mapping`) as TOML, after ``header`` as ``#`` comments."""
    lines = [f"# {h}".rstrip() for h in header]
    if lines:
        lines.append("")
    tables = [(k, v) for k, v in doc.items() if isinstance(v, Mapping)]
    for key, value in doc.items():
        if not isinstance(value, Mapping):
            lines.append(f"{key} = {_value(key, value)}")
    for name, table in tables:
        lines += ["", f"[{name}]"]
        for key, value in table.items():
            if isinstance(value, Mapping):
                raise InvalidInput(f"{name}.{key}", value, "nested tables are not written")
            lines.append(f"{key} = {_value(f'{name}.{key}', value)}")
    return "\n".join(lines) + "\n"


def _value(where: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(where, value, "must be finite")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(where, v) for v in value) + "]"
    raise InvalidInput(where, value, "cannot be written to TOML")
