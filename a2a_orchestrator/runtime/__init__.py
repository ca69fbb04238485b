"""One conversation: a role over a model and its tools, its events, records and rules."""

__all__: list[str] = []
