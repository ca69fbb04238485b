"""Observing the network at work: OpenTelemetry tracing and Prometheus metrics."""
