"""One exception tree for the whole project; shells map it to HTTP codes or CLI messages."""


class ConductorError(Exception):
    """Base of every error conductor raises on purpose."""


class InvalidInput(ConductorError, ValueError):
    """A value given to conductor is out of its domain; the message names field and value."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        self.why = why
        super().__init__(f"invalid {field}={value!r}: {why}")


class UnknownInstance(ConductorError, KeyError):
    """An event or call names an instance the scheduler does not know."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        super().__init__(f"unknown instance {instance!r}")

    def __str__(self) -> str:
        return f"unknown instance {self.instance!r}"


class UnknownPolicy(ConductorError, KeyError):
    """A policy name that is not in the registry."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown policy {self.name!r}; known: {', '.join(sorted(self.known))}"
