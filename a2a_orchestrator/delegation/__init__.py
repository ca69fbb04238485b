"""The delegation interface, its transports, and a parent's session of children."""

__all__: list[str] = []
