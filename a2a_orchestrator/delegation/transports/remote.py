"""The remote transport: a child is an A2A task on a role server (or any A2A agent).

Built on the a2a-sdk client: agent-card discovery, JSON-RPC with SSE
streaming (the factory picks the v0.3 compat transport for 0.3 peers), or
gRPC when the card prefers it (lists it before JSON-RPC; channels in
`grpc_channels.py`), the SDK's auth interceptor with a per-agent token or
OAuth2 client credentials (`credentials.py`; over gRPC the same
`authorization` metadata).

A reopened child that is not resuming (`connect=False`) reads no agent card
until it is given work, so a finished child stays readable from the store
while its agent is down.

Connection pools: a delegate that owns its HTTP client keeps `POOLS_PER_AGENT`
pools per agent server, taken in turn (`http_for`).

A turn on the agent is a `RemoteRun` (`remote_run.py`); a2a client, httpx and
gRPC errors become `DelegationError`s at one boundary (`client_errors.py`).
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from typing import TYPE_CHECKING, Any

import httpx
from a2a.client import (
    A2ACardResolver,
    AuthInterceptor,
    Client,
    ClientCallInterceptor,
    ClientConfig,
    ClientFactory,
    CredentialService,
)
from a2a.types import AgentCard
from a2a.utils.constants import TransportProtocol

from ...errors import ConfigError, ProtocolError
from ...protocol.cards import verify_card
from ...protocol.tolerant import tolerate_naive_timestamps
from ...runtime.roles import find_role
from ..base import ChildConfig, Resume
from ..network import AgentSpec
from .client_errors import translated
from .credentials import credential_service
from .extensions import ExtensionsInterceptor, wanted_extensions
from .grpc_channels import GrpcChannels
from .propagation import TraceContextInterceptor
from .remote_run import RemoteRun

if TYPE_CHECKING:
    from .push_receiver import PushReceiver

__all__ = ["POOLS_PER_AGENT", "RemoteDelegate", "accepted_output_modes"]

logger = logging.getLogger(__name__)

_ANY_OUTPUT = ["text/plain", "application/json"]


def accepted_output_modes(card: AgentCard) -> list[str]:
    """What every send says it accepts (`configuration.acceptedOutputModes`):
    the agent's own output modes when its card names them, else text and
    JSON. Some peers (fasta2a 0.6) answer HTTP 500 to a send without them."""
    return list(card.default_output_modes) or list(_ANY_OUTPUT)


POOLS_PER_AGENT = 32
"""Connection pools a delegate keeps per agent server (see `RemoteDelegate._pools`):
a thousand children over four servers make about 8 connections a pool. A
pool's cost per request grows with its connections (each one's socket is
checked at the request's start and end): with 8 pools (31 connections each)
that was a quarter of the orchestrator's CPU at the end of a fan-out. A pool
is made at its first request, so the first 32 turns to an agent each open a
connection (and, over TLS, make a handshake) of their own."""


class RemoteDelegate:
    """Opens children on remote A2A agents (`Delegate` for agents with a URL).

    `idle_probe`: seconds of stream silence before the agent is asked about
    the task (GetTask).
    `deadline_grace`: seconds past a turn's timeout before its task is
    cancelled and the child fails `timeout` (the agent's own timeout report
    comes first when it can). `lost_after`: seconds an agent may refuse or
    reset connections, or leave a question (a probe, a lookup) unanswered,
    before its child fails `lost`; a slow agent's late answer is contact
    (`remote_run.py`). `default_timeout`: a turn's
    timeout when neither the child nor the role (as this orchestrator finds
    it) says. `push`: the orchestrator's webhook endpoint, for agents in
    push mode (`push_receiver.py`). Owns an httpx client unless given one;
    close it with `aclose()`.
    """

    def __init__(
        self,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
        stream_timeout: float = 600.0,
        lost_after: float = 30.0,
        retry_interval: float = 0.5,
        idle_probe: float = 15.0,
        deadline_grace: float = 15.0,
        default_timeout: float = 60.0,
        push: PushReceiver | None = None,
    ) -> None:
        self._own_http = http is None
        self.push = push
        """Where children of agents in push mode receive their updates
        (None: they stream)."""
        self._timeouts = httpx.Timeout(timeout, read=stream_timeout)
        # One TLS context for every pool: httpx makes (and loads the CA
        # certificates into) a new one per client otherwise, 20 ms each.
        self._tls = httpx.create_ssl_context() if http is None else None
        self.http = http or self._pool()
        self._pools: dict[str, list[httpx.AsyncClient]] = {}
        """Connection pools of their own per agent server (`POOLS_PER_AGENT`,
        taken in turn by the children), when the delegate owns its clients:
        httpcore looks through every connection of a pool, checking each
        one's socket, at every request's start and end, so one pool for a
        thousand children's streams spent most of a fan-out's CPU there."""
        self._turns: dict[str, int] = {}
        self._origins: dict[str, str] = {}
        """Each agent URL's origin (scheme, host and port): its pools' key."""
        self._clients: dict[tuple[AgentSpec, bool, int], tuple[AgentCard, Client]] = {}
        """The a2a-sdk clients made so far, per agent, streaming or not and
        pool, with the card each was made from (a new card object, a new
        client): a client holds no call's state, so children of one agent
        share them (making one took 38 us a spawn, timed alone)."""
        self.lost_after = lost_after
        self.retry_interval = retry_interval
        self.idle_probe = idle_probe
        self.deadline_grace = deadline_grace
        self.default_timeout = default_timeout
        self._cards: dict[str, AgentCard] = {}
        self._role_timeouts: dict[str, float] = {}
        self._credential_services: dict[str, CredentialService | None] = {}
        self.grpc = GrpcChannels()

    def _pool(self) -> httpx.AsyncClient:
        http = httpx.AsyncClient(
            verify=self._tls if self._tls is not None else True,
            timeout=self._timeouts,
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )
        # The tolerant reader's first part: peers' naive timestamps read as UTC.
        tolerate_naive_timestamps(http)
        return http

    def http_for(self, url: str) -> httpx.AsyncClient:
        """The HTTP client for requests to the agent at `url`: the one given
        to the delegate, else this delegate's pool for that server."""
        if not self._own_http:
            return self.http
        origin = self._origins.get(url)
        if origin is None:
            parsed = httpx.URL(url)
            origin = self._origins[url] = f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"
        pools = self._pools.setdefault(origin, [])
        turn = self._turns[origin] = (self._turns.get(origin, -1) + 1) % POOLS_PER_AGENT
        if turn == len(pools):
            pools.append(self._pool())
        return pools[turn]

    async def card(self, spec: AgentSpec) -> AgentCard:
        """The agent's card (at its `card_path`, cached per URL, path and
        key), its signature checked when the agent file names a `card_key`."""
        url = spec.url or ""
        key = f"{url} {spec.card_path} {spec.card_key} {spec.require_signature}"
        card = self._cards.get(key)
        if card is None:
            try:
                with translated(url):
                    # None: the well-known path.
                    card = await A2ACardResolver(self.http, url).get_agent_card(
                        relative_card_path=spec.card_path
                    )
            except ValueError as exc:
                # a2a-sdk lets a body that is not UTF-8 escape as a bare
                # UnicodeDecodeError, which names no agent.
                raise ProtocolError(f"agent at {url} has no usable agent card: {exc}") from exc
            await verify_card(
                card,
                agent=spec.name,
                key_source=spec.card_key,
                required=spec.require_signature,
                http=self.http,
            )
            self._cards[key] = card
        return card

    def turn_timeout(self, spec: AgentSpec, config: ChildConfig) -> float:
        """A turn's timeout: the child's, else its role's, else `default_timeout`.

        The role file is the one this orchestrator finds (the one `up` and
        the compose file serve); a foreign agent's role gets the default.
        """
        # timeout=0 (no limit of the caller's) is not sent; the role's stays.
        if config.timeout is not None and not config.unlimited:
            return float(config.timeout)
        known = self._role_timeouts.get(spec.role)
        if known is None:
            try:
                known = find_role(spec.role).timeout
            except ConfigError:
                known = self.default_timeout
            self._role_timeouts[spec.role] = known
        return known

    def _credentials(self, spec: AgentSpec) -> CredentialService | None:
        if spec.token_url is None:
            return credential_service(spec, self.http)
        # One per agent for the delegate's life: its children share the
        # client credentials token, fetched once and refreshed before expiry.
        key = f"{spec.name} {spec.url}"
        service = self._credential_services.get(key)
        if service is None:
            service = self._credential_services[key] = credential_service(spec, self.http)
        return service

    def _client(self, spec: AgentSpec, card: AgentCard, *, streaming: bool) -> Client:
        http = self.http_for(spec.url or "")
        key = (spec, streaming, id(http))
        made = self._clients.get(key)
        if made is not None and made[0] is card:
            return made[1]
        client = self._new_client(spec, card, http, streaming=streaming)
        self._clients[key] = (card, client)
        return client

    def _new_client(
        self, spec: AgentSpec, card: AgentCard, http: httpx.AsyncClient, *, streaming: bool
    ) -> Client:
        # A bearer token from the environment is read here, when the
        # agent's first client on this pool is made.
        service = self._credentials(spec)
        interceptors: list[ClientCallInterceptor] = [TraceContextInterceptor()]
        extensions = wanted_extensions(card)
        if extensions:
            # Batched frames (`frames.py`), from an agent that offers them.
            interceptors.append(ExtensionsInterceptor(extensions))
        if service is not None:
            interceptors.append(AuthInterceptor(service))
        config = ClientConfig(
            httpx_client=http,
            streaming=streaming,
            # In the card's order of preference: gRPC where it comes first.
            supported_protocol_bindings=[TransportProtocol.JSONRPC, TransportProtocol.GRPC],
            grpc_channel_factory=self.grpc.channel,
            accepted_output_modes=accepted_output_modes(card),
        )
        factory = ClientFactory(config)
        try:
            return factory.create(card, interceptors=interceptors)
        except ValueError as exc:  # how a2a-sdk says the card offers no transport it speaks
            raise ProtocolError(f"agent at {spec.url} has no usable agent card: {exc}") from exc

    def plain_client(self, run: RemoteRun) -> Client:
        """A non-streaming client to the same agent (control messages)."""
        return self._client(run.spec, run.card, streaming=False)

    def streaming_client(self, spec: AgentSpec, card: AgentCard) -> Client:
        """The client a child's turns stream through."""
        return self._client(spec, card, streaming=True)

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        depth: int = 1,
        resume: Resume | None = None,
    ) -> RemoteRun:
        """A new child: its task is created by its first turn, whose message
        goes out under the context id and message id chosen here, which the
        caller reads from the run and stores before the turn starts
        (identity before I/O).

        With `resume`, the child's task is re-attached by its stored ids
        (crash recovery). With no task id yet, the task is looked for by its
        context id and message id, and the opening message (the last input)
        is sent again if the agent never got it; `turn_started` keeps an
        interrupted turn's deadline. A child that is not `running` reads no
        agent card until it is given work; a `finished` one's next turn
        opens a new task in its context.
        """
        if config.workdir is not None:
            raise ConfigError(
                f"child config field 'workdir': agent {spec.name!r} is remote and works in its "
                "role server's own directory; only an in-process child can be given a "
                "subdirectory"
            )
        if resume is None:
            card = await self.card(spec)
            return self._new_run(
                child_id,
                self,
                spec,
                self.streaming_client(spec, card),
                card,
                overrides=config.overrides(),
                turn_timeout=self.turn_timeout(spec, config),
                context_id=uuidlib.uuid4().hex,
                message_id=uuidlib.uuid4().hex,
                pending_text=config.prompt,
                fresh=True,
            )
        known = await self.card(spec) if resume.running else None
        return self._new_run(
            child_id,
            self,
            spec,
            self.streaming_client(spec, known) if known is not None else None,
            known,
            overrides=config.overrides(),
            turn_timeout=self.turn_timeout(spec, config),
            task_id=resume.task_id,
            context_id=resume.context_id,
            message_id=resume.message_id,
            pending_text=resume.last_input if resume.last_input is not None else config.prompt,
            turn_started=resume.turn_started,
            finished=resume.finished,
        )

    def _new_run(self, child_id: str, *args: Any, **kwargs: Any) -> RemoteRun:
        spec: AgentSpec = args[1]
        if spec.push and self.push is not None:
            return self.push.run(*args, child_id=child_id, **kwargs)
        if spec.push:
            logger.info(
                "agent %s is in push mode, but no webhook endpoint serves here "
                "(serve orchestrator has one): its child streams",
                spec.name,
            )
        return RemoteRun(*args, **kwargs)

    async def aclose(self) -> None:
        self._clients.clear()  # each is bound to a pool closed here
        await self.grpc.aclose()
        if self._own_http:
            pools = [pool for each in self._pools.values() for pool in each]
            self._pools = {}
            for http in [self.http, *pools]:
                await http.aclose()

    async def __aenter__(self) -> RemoteDelegate:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
