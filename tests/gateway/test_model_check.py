"""Reading an engine's ``/v1/models``: what counts as an answer, and what a mismatch says."""

from __future__ import annotations

import pytest

from conductor.gateway.model_check import mismatch, model_ids, single_model


@pytest.mark.parametrize(
    ("body", "ids"),
    [
        (b'{"object": "list", "data": [{"id": "tiny"}]}', ["tiny"]),
        (b'{"data": [{"id": "a"}, {"id": "b"}]}', ["a", "b"]),
        (b"", None),  # not JSON: the engine cannot tell
        (b"[]", None),
        (b'{"data": {}}', None),
        (b'{"data": []}', None),
        (b'{"data": [{"id": ""}]}', None),
        (b'{"data": [{"name": "tiny"}]}', None),
        (b'{"data": [{"id": 7}]}', None),
    ],
)
def test_model_ids(body: bytes, ids: list[str] | None) -> None:
    assert model_ids(body) == ids


def test_single_model_and_mismatch() -> None:
    url = "http://10.0.0.1:8000"
    assert single_model(url, ["tiny"]) == "tiny"
    with pytest.raises(ValueError, match=r"lists no model"):
        single_model(url, None)
    with pytest.raises(ValueError, match=r"serves several models \['a', 'b'\]; name one"):
        single_model(url, ["a", "b"])
    assert mismatch("tiny", ["tiny", "other"]) is None
    assert mismatch("tiny", ["tiny-b"]) == "it serves ['tiny-b'], its config says 'tiny'"
