"""The cost file: every preset round-trips, and every bad value is named by its key."""

from __future__ import annotations

from typing import Any

import pytest

from conductor.core.cost_file import (
    FORMAT,
    cost_from_mapping,
    cost_to_mapping,
    parse_cost_file,
    render_cost_file,
)
from conductor.core.costmodel import PRESETS, LinearDecode, PolynomialPrefill, preset
from conductor.core.errors import InvalidInput


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips(name: str) -> None:
    cost = preset(name)
    text = render_cost_file(cost_to_mapping(cost), ["header line"])
    assert text.startswith("# header line\n\nformat = 1\n")
    parsed = parse_cost_file(text)
    assert parsed.cost == cost
    assert parsed.measured == {}


def _doc() -> dict[str, Any]:
    cost = preset("llama3-8b-h100").with_(
        name="measured",
        prefill=PolynomialPrefill(0.01, 2e-5, 1e-6, 1e-9),
        decode=LinearDecode(0.004, 1e-4, 1e-7),
    )
    return cost_to_mapping(
        cost, measured={"at": "t", "samples": [[1, 2, 0.5]]}, block_size_tokens=32
    )


def test_measured_table_and_block_size_are_kept() -> None:
    parsed = parse_cost_file(render_cost_file(_doc()))
    assert parsed.measured == {"at": "t", "samples": [[1, 2, 0.5]]}
    assert parsed.block_size_tokens == 32
    assert parsed.cost.prefill == PolynomialPrefill(0.01, 2e-5, 1e-6, 1e-9)


def test_without_hardware_the_model_is_measured_only() -> None:
    doc = _doc()
    del doc["hardware"]
    cost = cost_from_mapping(doc).cost
    assert cost.hardware.name == "unknown"
    doc["prefill"] = {"form": "roofline", "mfu": 0.5, "overhead_s": 0.01}
    with pytest.raises(
        InvalidInput, match=r"invalid prefill\.form='roofline': needs a \[hardware\]"
    ):
        cost_from_mapping(doc)


def _set(doc: dict[str, Any], path: str, value: object) -> None:
    *tables, key = path.split(".")
    target = doc
    for t in tables:
        target = target[t]
    if value is KeyError:
        del target[key]
    else:
        target[key] = value


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("format", 2, f"invalid format=2: unsupported; this conductor reads {FORMAT}"),
        ("name", "", "invalid name='': must be a non-empty string"),
        ("prefill.c1", "fast", "invalid prefill.c1='fast': must be a number"),
        ("prefill.c9", 1.0, "invalid prefill.c9=1.0: unknown key; known: form, c0"),
        ("prefill.mfu", 0.5, "invalid prefill.mfu=0.5: not a key of form 'polynomial'"),
        ("prefill.form", "cubic", "invalid prefill.form='cubic': must be one of: polynomial"),
        ("prefill.c0", -1.0, "invalid prefill={'c0': -1.0,"),
        ("decode.c0", 0.0, "invalid decode.c0=0.0: must be > 0"),
        ("decode.c2", -1e-9, "invalid decode.c2=-1e-09: must be >= 0"),
        ("decode.c1", KeyError, "invalid decode.c1=None: is required"),
        ("kv.capacity_tokens", 0, "invalid kv.capacity_tokens=0: must be >= 1"),
        ("kv.capacity_tokens", 1.5, "invalid kv.capacity_tokens=1.5: must be an integer"),
        ("kv.bytes_per_token", 7, "invalid kv.bytes_per_token=7: disagrees with [model]"),
        ("transfer.bytes_per_s", 0.0, "invalid transfer.bytes_per_s=0.0: must be > 0"),
        ("model.layers", True, "invalid model.layers=True: must be an integer"),
        ("model", KeyError, "invalid model=None: is required"),
        ("measured", 3, "invalid measured=3: must be a table"),
        ("extra", {}, "invalid extra={}: unknown key; known: format, name, source, prefill"),
    ],
)
def test_bad_values_name_their_key(path: str, value: object, message: str) -> None:
    doc = _doc()
    _set(doc, path, value)
    with pytest.raises(InvalidInput) as info:
        cost_from_mapping(doc)
    assert str(info.value).startswith(message)


def test_not_toml_and_unwritable_values() -> None:
    with pytest.raises(InvalidInput, match="invalid cost_file='<toml>': not valid TOML"):
        parse_cost_file("format = = 1")
    with pytest.raises(InvalidInput, match=r"invalid kv\.x=\{'y': 1\}: nested tables"):
        render_cost_file({"kv": {"x": {"y": 1}}})
    with pytest.raises(InvalidInput, match=r"invalid a=inf: must be finite"):
        render_cost_file({"a": float("inf")})
