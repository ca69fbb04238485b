"""Who may call a server, how a caller proves it, and how much each may take."""

__all__: list[str] = []
