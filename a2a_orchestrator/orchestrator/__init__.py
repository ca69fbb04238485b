"""The orchestrator: the network as one A2A agent, its HTTP API and its views."""

__all__: list[str] = []
