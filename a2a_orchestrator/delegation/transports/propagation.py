"""W3C trace context on every A2A call the remote transport makes.

`TraceContextInterceptor` is an a2a-sdk client interceptor: before each
call it writes the current span's context (`traceparent`, `tracestate`,
whatever OTEL_PROPAGATORS names) into the call's service parameters, which
the SDK sends as HTTP headers (JSON-RPC, REST) or gRPC metadata. The role
server reads them back (`tracing.served_turn`). With no span current (tracing
off) it adds nothing.
"""

from __future__ import annotations

from a2a.client import ClientCallContext
from a2a.client.interceptors import AfterArgs, BeforeArgs, ClientCallInterceptor
from opentelemetry import propagate, trace

__all__ = ["TraceContextInterceptor"]


class TraceContextInterceptor(ClientCallInterceptor):
    """Sends the caller's trace context with each call."""

    async def before(self, args: BeforeArgs) -> None:
        if not trace.get_current_span().get_span_context().is_valid:
            return  # no trace to continue: the call goes out as it was
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if args.context is None:
            args.context = ClientCallContext()
        # A new mapping: the context may be one the caller reuses.
        args.context.service_parameters = {**(args.context.service_parameters or {}), **carrier}

    async def after(self, args: AfterArgs) -> None:
        return None
