"""JSON for the OpenAI request path, with msgspec (several times faster than the standard
library on request bodies): strict (no NaN or Infinity, numbers in range), UTF-8."""

from __future__ import annotations

from typing import Any

import msgspec

JsonError = (msgspec.DecodeError, msgspec.ValidationError)
"""What :func:`decode` raises for bytes that are not strict JSON."""

decode: Any = msgspec.json.Decoder().decode
"""``decode(raw: bytes) -> object``."""

encode: Any = msgspec.json.Encoder().encode
"""``encode(value) -> bytes``: compact UTF-8 JSON."""
