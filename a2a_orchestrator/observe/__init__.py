"""Observing the network at work: OpenTelemetry tracing and Prometheus metrics."""

__all__: list[str] = []
