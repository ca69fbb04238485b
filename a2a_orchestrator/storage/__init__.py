"""Where the network keeps what it must not lose: sessions, tasks, journals, leases."""

__all__: list[str] = []
