"""A2A over gRPC beside the HTTP bindings: the same handler, task store and callers.

`GrpcServing` is a grpc.aio server in the HTTP server's process and event
loop. Its port is bound up front (`bind`), so the agent card can name it;
it serves a2a-sdk's `GrpcHandler` (protocol 1.0, `lf.a2a.v1.A2AService`)
and `CompatGrpcHandler` (0.3, `a2a.v1.A2AService`) over the very request
handler of the HTTP app: a task started over JSON-RPC is read, followed or
cancelled over gRPC, and the other way round.

Lifetime (the contract `server.run_server` keeps): `start` once the app's
lifespan is up (the handler's executor and store are open); `stop` when the
server shuts down, after the executor ended its running tasks (so a gRPC
stream gets its terminal event, as an SSE one does) and before the lifespan
closes the store. A call still open after `STOP_GRACE` seconds is cancelled.

Callers: with an `Access`, every call carries metadata
`authorization: Bearer <credential>`, checked like the HTTP header (tokens,
callers file, JWTs); a call without a good credential is refused
UNAUTHENTICATED (UNAVAILABLE when a JWT cannot be checked because its
issuer's keys cannot be had: the HTTP side's 503). The caller becomes the
call's `ServerCallContext` user with the same owner key as over HTTP, so
each caller sees its own tasks on both bindings. Quotas apply as over HTTP;
a refusal is the SDK's INVALID_ARGUMENT (gRPC has no Retry-After).

gRPC is served in plaintext (no TLS): behind a TLS-terminating proxy, or on
a private network, like the HTTP side without its own certificate.

Connections: credentials travel with each call, so a client without one
could open a connection and hold it with no call, for ever (gRPC closes
none that is idle by default; its handshake waits 120 s). As an HTTP
connection waiting for a request's head, one gets `serving.HEAD_TIMEOUT`
seconds for its HTTP/2 handshake and is closed after as long with no call
open; a call (a stream) keeps it open however long it lasts.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc
import grpc.aio
from a2a.auth.user import UnauthenticatedUser, User
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc
from a2a.compat.v0_3.grpc_handler import CompatGrpcHandler
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import RequestHandler
from a2a.server.request_handlers.grpc_handler import (
    DefaultGrpcServerCallContextBuilder,
    GrpcHandler,
)
from a2a.types import AgentCard, AgentInterface, a2a_pb2_grpc
from a2a.utils.constants import VERSION_HEADER
from a2a.utils.errors import (
    A2A_ERROR_REASONS,
    A2AError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from a2a.utils.grpc_status import status_to_grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from ..errors import CredentialError, IssuerUnavailableError
from ..protocol.versions import PROTOCOL_STATE, same_major
from .auth.callers import Caller
from .serving import HEAD_TIMEOUT

if TYPE_CHECKING:
    from .auth.access import Access

__all__ = [
    "GRPC_BINDING",
    "STOP_GRACE",
    "GrpcServing",
    "add_grpc_interfaces",
    "public_address",
]

GRPC_BINDING = "GRPC"
STOP_GRACE = 5.0
"""Seconds calls still open at shutdown get to finish before they are cancelled."""

# The caller of the gRPC call running in this task, set by the authenticating
# interceptor's wrapper around the call (the same task runs the handler) and
# read by the context builder, whose `build` cannot await.
_CALLER: ContextVar[Caller | None] = ContextVar("a2a_orchestrator_grpc_caller", default=None)


def add_grpc_interfaces(card: AgentCard, address: str) -> None:
    """List gRPC at `address` in `card`: first of the protocol 1.0 interfaces
    (the card prefers it: a client that speaks gRPC picks it), and, when the
    card has protocol 0.3 interfaces, last of those, so the v0.3 fields keep
    JSON-RPC as `url`/`preferredTransport` (v0.3 peers that read only `url`
    keep working) and list gRPC in `additionalInterfaces`."""
    kept = []
    for interface in card.supported_interfaces:
        copy = AgentInterface()
        copy.CopyFrom(interface)
        kept.append(copy)
    legacy = any(i.protocol_version.startswith("0.") for i in kept)
    del card.supported_interfaces[:]
    card.supported_interfaces.append(
        AgentInterface(url=address, protocol_binding=GRPC_BINDING, protocol_version="1.0")
    )
    card.supported_interfaces.extend(kept)
    if legacy:
        card.supported_interfaces.append(
            AgentInterface(url=address, protocol_binding=GRPC_BINDING, protocol_version="0.3")
        )


def _bind_address(host: str, port: int) -> str:
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host or '0.0.0.0'}:{port}"


def public_address(url: str, port: int) -> str:
    """Where clients reach the gRPC port: the host of the server's public URL."""
    host = urlsplit(url).hostname or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _State(enum.Enum):
    BOUND = "bound"
    STARTED = "started"
    STOPPED = "stopped"


class GrpcServing:
    """A gRPC server for one A2A server's request handler (see the module docstring).

    `bind` takes the port; `start(handler)` serves; `stop()` ends it (at
    most once; also for a server bound and never started, to free its port).
    """

    def __init__(self, server: grpc.aio.Server, port: int, address: str) -> None:
        self._server = server
        self.port = port
        """The port bound (the real one when 0 was asked for)."""
        self.address = address
        """host:port clients use (the card's gRPC interface URL)."""
        self._state = _State.BOUND

    @classmethod
    def bind(
        cls, host: str, port: int, *, public_url: str, access: Access | None = None
    ) -> GrpcServing:
        """Bind `host`:`port` (0: any free port); the address in the card has
        the host of `public_url`. `access`: who may call (None: anyone)."""
        interceptors = [_Authenticator(access)] if access is not None else []
        server = grpc.aio.server(
            interceptors=interceptors,
            # gRPC sets SO_REUSEPORT by default: a second server on a taken
            # port would then start and share it instead of failing.
            options=[
                ("grpc.so_reuseport", 0),
                # See the module docstring: no connection held without a call.
                ("grpc.server_handshake_timeout_ms", int(HEAD_TIMEOUT * 1000)),
                ("grpc.max_connection_idle_ms", int(HEAD_TIMEOUT * 1000)),
            ],
        )
        try:
            bound = server.add_insecure_port(_bind_address(host, port))
        except RuntimeError as exc:
            raise OSError(f"cannot listen for gRPC on {host}:{port}: {exc}") from exc
        return cls(server, bound, public_address(public_url, bound))

    def list_in(self, card: AgentCard) -> None:
        """List this binding in `card` (`add_grpc_interfaces`)."""
        add_grpc_interfaces(card, self.address)

    async def start(self, handler: RequestHandler) -> None:
        """Serve `handler` (the HTTP app's) on both protocol versions."""
        if self._state is not _State.BOUND:
            raise RuntimeError(f"the gRPC server is {self._state.value}, it cannot start")
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(
            _ReasonedGrpcHandler(handler, context_builder=_CallerContextBuilder("1.0")),
            self._server,
        )
        a2a_v0_3_pb2_grpc.add_A2AServiceServicer_to_server(
            CompatGrpcHandler(handler, context_builder=_CallerContextBuilder("0.3")), self._server
        )
        await self._server.start()
        self._state = _State.STARTED

    async def stop(self) -> None:
        """Stop serving: open calls get `STOP_GRACE` seconds, then are cancelled."""
        if self._state is _State.STOPPED:
            return
        if self._state is _State.BOUND:
            # grpc.aio keeps the port of a server stopped before it started;
            # started with no service, it answers nothing and frees it on stop.
            await self._server.start()
        self._state = _State.STOPPED
        await self._server.stop(STOP_GRACE)


# -- callers ------------------------------------------------------------------------


class _ReasonedGrpcHandler(GrpcHandler):
    """a2a-sdk's gRPC handler, holding its errors to the spec's gRPC binding
    where a2a-sdk 1.3 does not (TCK GRPC-ERR-002):

    - each A2A error gets the status spec 5.4 maps it to: a2a-sdk answers
      FAILED_PRECONDITION for the three `_SPEC_STATUS` names UNIMPLEMENTED;
    - invalid-params errors also carry their `data` (a refused webhook's
      reason and address, `push.py`) as the ErrorInfo's metadata: what the
      JSON-RPC and HTTP+JSON bindings put in theirs (a2a-sdk's ErrorInfo
      has none).

    Every A2A error keeps its `google.rpc.ErrorInfo` (reason, domain
    `a2a-protocol.org`) in the status details; validation errors keep
    a2a-sdk's BadRequest detail."""

    async def abort_context(self, error: A2AError, context: grpc.aio.ServicerContext) -> None:
        code = _SPEC_STATUS.get(type(error))
        metadata: dict[str, str] = {}
        data = error.data if isinstance(error, InvalidParamsError) else None
        if data and "errors" not in data and all(isinstance(v, str) for v in data.values()):
            code, metadata = grpc.StatusCode.INVALID_ARGUMENT, data
        if code is None:
            await super().abort_context(error, context)
            return
        info = error_details_pb2.ErrorInfo(
            reason=A2A_ERROR_REASONS[type(error)], domain="a2a-protocol.org", metadata=metadata
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(code=code.value[0], message=error.message, details=[detail])
        rich = status_to_grpc(status)
        context.set_trailing_metadata(
            (*(context.trailing_metadata() or ()), *rich.trailing_metadata)
        )
        await context.abort(rich.code, rich.details)


# Spec 5.4's gRPC status where a2a-sdk 1.3's table says FAILED_PRECONDITION.
_SPEC_STATUS: dict[type[A2AError], grpc.StatusCode] = {
    PushNotificationNotSupportedError: grpc.StatusCode.UNIMPLEMENTED,
    UnsupportedOperationError: grpc.StatusCode.UNIMPLEMENTED,
    VersionNotSupportedError: grpc.StatusCode.UNIMPLEMENTED,
}


class _GrpcUser(User):
    """An authenticated gRPC caller: `user_name` is its owner key, as over HTTP."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.caller.owner


class _CallerContextBuilder(DefaultGrpcServerCallContextBuilder):
    """a2a-sdk's gRPC context builder, with the caller the interceptor
    authenticated, for the service of protocol `version` ("1.0", "0.3").

    A call whose `a2a-version` metadata names another major version is
    refused with VersionNotSupportedError, as the JSON-RPC and HTTP+JSON
    routes refuse an `A2A-Version` header (a2a-sdk's gRPC handlers read
    none). A call without one is served: unlike a JSON-RPC request, whose
    methods share one URL, a gRPC call names its protocol by its service
    (`lf.a2a.v1.A2AService` is 1.0, `a2a.v1.A2AService` 0.3). The version
    is kept in the call context's state (`PROTOCOL_STATE`): a webhook
    registered over 0.3 gets 0.3 payloads (`push.py`)."""

    def __init__(self, version: str) -> None:
        self.version = version

    def build(self, context: grpc.aio.ServicerContext) -> ServerCallContext:
        asked = _metadata_value(context.invocation_metadata(), VERSION_HEADER)
        if asked and not same_major(asked, self.version):
            raise VersionNotSupportedError(
                message=f"A2A version '{asked}' is not supported by this service. "
                f"Expected version '{self.version}'."
            )
        call = super().build(context)
        call.state[PROTOCOL_STATE] = self.version
        return call

    def build_user(self, context: grpc.aio.ServicerContext) -> User:
        caller = _CALLER.get()
        return _GrpcUser(caller) if caller is not None else UnauthenticatedUser()


def _metadata_value(metadata: Any, name: str) -> str:
    for key, value in metadata or ():
        if key.lower() == name.lower():
            return str(value.decode("latin-1") if isinstance(value, bytes) else value)
    return ""


def _bearer(metadata: Any) -> str:
    scheme, _, credential = _metadata_value(metadata, "authorization").partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


class _Authenticator(grpc.aio.ServerInterceptor):
    """Refuses a call without a good bearer credential; runs the others as their caller."""

    def __init__(self, access: Access) -> None:
        self._access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: gRPC answers UNIMPLEMENTED
        try:
            caller = await self._access.authenticate(_bearer(details.invocation_metadata))
        except IssuerUnavailableError as exc:
            return _refusal(handler, grpc.StatusCode.UNAVAILABLE, str(exc))
        except CredentialError as exc:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, str(exc))
        return _as_caller(handler, caller)


# The A2A services have unary and server-streaming methods only (no client
# streaming), so a handler here is one of those two kinds.


def _refusal(handler: Any, code: grpc.StatusCode, detail: str) -> Any:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, detail)

    if handler.unary_stream is not None:
        return handler._replace(unary_stream=refuse)
    return handler._replace(unary_unary=refuse)


def _as_caller(handler: Any, caller: Caller) -> Any:
    if handler.unary_stream is not None:
        stream = handler.unary_stream

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            _CALLER.set(caller)
            # Closed here when the call ends early (a client gone), not left
            # to the garbage collector.
            async with contextlib.aclosing(stream(request, context)) as responses:
                async for response in responses:
                    yield response

        return handler._replace(unary_stream=streamed)
    unary = handler.unary_unary

    async def answered(request: Any, context: grpc.aio.ServicerContext) -> Any:
        _CALLER.set(caller)
        return await unary(request, context)

    return handler._replace(unary_unary=answered)
