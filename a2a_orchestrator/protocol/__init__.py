"""The A2A wire: child events as frames, read back, whole numbers, cards, guards."""

__all__: list[str] = []
