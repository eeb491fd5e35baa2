"""One model the gateway serves: :class:`ModelConfig` (a pool of engines, one scheduler),
and the checks that make a request's ``model``, and an engine's, find one pool."""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.checks import check_at_least, check_positive
from conductor.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One model the gateway serves (one pool of engines, one scheduler). ``name``: what
    clients send in ``model``; ``served_name``: what its engines serve (their ``/v1/models``
    id, sent upstream; None: ``name``); an engine joins the pool whose served name equals
    its ``model``. ``max_model_len`` bounds prompt + output tokens; ``block_size_tokens``
    is its engines' KV block size."""

    name: str
    max_model_len: int
    block_size_tokens: int
    served_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInput("name", self.name, "must not be empty")
        if self.served_name is not None and not self.served_name:
            raise InvalidInput("served_name", self.served_name, "must not be empty")
        check_at_least("max_model_len", self.max_model_len, 2)
        check_positive("block_size", self.block_size_tokens)

    @property
    def upstream_name(self) -> str:
        """The name its engines serve."""
        return self.served_name or self.name


def check_models(models: tuple[ModelConfig, ...]) -> None:
    """Names and served names are unique (a request, an engine, finds one pool)."""
    names: dict[str, int] = {}
    served: dict[str, int] = {}
    for i, model in enumerate(models):
        if model.name in names:
            raise InvalidInput(
                f"models[{i}].name", model.name, f"also the name of models[{names[model.name]}]"
            )
        if model.upstream_name in served:
            j = served[model.upstream_name]
            raise InvalidInput(
                f"models[{i}].served_name",
                model.upstream_name,
                f"also served by models[{j}] ({models[j].name}): an engine would join both",
            )
        names[model.name] = i
        served[model.upstream_name] = i
