"""Push notifications from our A2A servers: the URL policy and the webhook sender.

A caller registers a webhook for a task (`CreateTaskPushNotificationConfig`,
or `configuration.taskPushNotificationConfig` on `SendMessage`); a2a-sdk's
request handler checks its URL with `PushPolicy.validate`, keeps it in the
server's task database (`tasks/push.py`) and hands every task event to
`WebhookSender`, which POSTs it to each webhook of the task.

The payload has the shape of the protocol version the webhook was
registered in (kept with its config, `tasks/push.py`): a v1.0 registration
gets each event as a `StreamResponse` in v1.0 JSON, as on a stream; one made
through the v0.3 methods (`tasks/pushNotificationConfig/set`, a v0.3
`message/send` configuration, the v0.3 HTTP+JSON and gRPC services) gets
the task as it stands after each event, a v0.3 `Task` (`"kind": "task"`),
what the v0.3 spec's push notifications carry and a2a-sdk 0.3 sent.

URL policy (`PushPolicy`): http and https only; the host is resolved and
every address it has must be public, judged by a2a-sdk's
`validate_push_notification_url` (loopback, link-local, private, shared,
reserved, multicast and cloud metadata addresses are not), unless it lies
in a network the operator allowed (`--push-allow`, `A2A_PUSH_ALLOW`). An
IPv6 address that carries an IPv4 one (6to4 2002::/16, Teredo 2001::/32,
IPv4-compatible ::/96, NAT64 64:ff9b::/96) is judged as both: it may be
routed to the IPv4 address it wraps. A refused URL is invalid params at
registration (JSON-RPC -32602, HTTP 400, gRPC INVALID_ARGUMENT) whose
message and data name the reason and the address refused (`PushRefusal`).
The check runs again before every delivery attempt, and the request then
goes to an address that check just passed (the HTTP client does not
resolve the name again; https still verifies the certificate against the
name): a name re-pointed at an internal address after registration (DNS
rebinding) gets nothing. Redirects are not followed.

Delivery contract: a2a-sdk awaits the sender inside the task's event loop,
so `send_notification` only queues; each (task, webhook) has its queue,
sent in order by a worker in the task group `running()` owns. A delivery is
tried `attempts` times with exponential backoff; a 4xx other than 408/429
is final. A webhook that fails a delivery for good has the deliveries queued
behind it for the same URL dropped too (logged): the receiver fills gaps
with GetTask. No
failure reaches the task.

How many configs a server keeps, and how large, is `PushLimits`
(`tasks/push.py`; `--push-max-per-task`, `--push-max-per-owner`), carried
by the policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import socket
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from a2a.compat.v0_3.conversions import to_compat_task
from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.server.tasks.push_notification_sender import PushNotificationEvent, PushNotificationSender
from a2a.types import TaskPushNotificationConfig
from a2a.utils.errors import InvalidParamsError
from a2a.utils.proto_utils import to_stream_response
from a2a.utils.push_url_validator import validate_push_notification_url
from anyio.abc import TaskGroup
from google.protobuf.json_format import MessageToDict

from ..errors import ConfigError
from ..protocol.versions import call_protocol
from ..storage.tasks.push import (
    DispatchStore,
    PushLimits,
    PushTarget,
    SQLitePushConfigStore,
    open_push_config_store,
)
from ..storage.tasks.sqlite import TaskOwner

__all__ = [
    "PUSH_ALLOW_ENV",
    "TOKEN_HEADER",
    "PushPolicy",
    "PushRefusal",
    "PushService",
    "WebhookSender",
]

logger = logging.getLogger(__name__)

PUSH_ALLOW_ENV = "A2A_PUSH_ALLOW"
TOKEN_HEADER = "X-A2A-Notification-Token"

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address

_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _judged(ip: _IP) -> list[_IP]:
    """The addresses a connection to `ip` may reach, each to be judged: an
    IPv4-mapped address is its IPv4 address; 6to4, Teredo, IPv4-compatible
    and NAT64 addresses are themselves and the IPv4 address they wrap."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    found: list[_IP] = [ip]
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _IPV4_COMPATIBLE or ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


@dataclass(frozen=True)
class PushPolicy:
    """Which webhook URLs a server calls (see the module docstring)."""

    allow: tuple[_Network, ...] = ()
    """Networks the operator allows although they are not public."""
    limits: PushLimits = dataclasses.field(default_factory=PushLimits)
    """How many configs the server keeps, and how large (`tasks/push.py`)."""

    @classmethod
    def parse(cls, text: str) -> PushPolicy:
        """A policy from `CIDR,CIDR,...` (empty: public addresses only)."""
        networks: list[_Network] = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError as exc:
                raise ConfigError(f"push allow-list: {item!r} is not a network: {exc}") from exc
        return cls(tuple(networks))

    @classmethod
    def from_settings(
        cls,
        allow: str | None = None,
        *,
        max_per_task: int | None = None,
        max_per_owner: int | None = None,
    ) -> PushPolicy:
        """`allow` (the `--push-allow` flag), else `$A2A_PUSH_ALLOW`; the
        limits from `--push-max-per-task` / `--push-max-per-owner`, else
        their environment variables (`PushLimits.from_settings`)."""
        policy = cls.parse(allow if allow is not None else os.environ.get(PUSH_ALLOW_ENV, ""))
        limits = PushLimits.from_settings(max_per_task, max_per_owner)
        return dataclasses.replace(policy, limits=limits)

    def _allowed(self, ip: _IP) -> bool:
        return any(ip in net for net in self.allow if ip.version == net.version)

    async def _callable(self, address: str) -> bool:
        """Whether every address a connection to `address` may reach is
        allowed by the operator or public (a2a-sdk's judgement)."""
        for ip in _judged(ipaddress.ip_address(address.split("%", 1)[0])):
            if self._allowed(ip):
                continue
            # a2a-sdk's own judgement of one address: the literal resolves to itself.
            literal = f"[{ip}]" if ip.version == 6 else str(ip)
            if not await validate_push_notification_url(f"http://{literal}/"):
                return False
        return True

    async def _check(self, url: str) -> list[str] | PushRefusal:
        """The addresses `url`'s host resolves to, all of them callable, or
        why `url` is refused."""
        try:
            parsed = urllib.parse.urlsplit(url)
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:
            return PushRefusal("unparseable", "the URL cannot be parsed")
        host = parsed.hostname
        if parsed.scheme not in ("http", "https") or not host:
            return PushRefusal("not-http", "not an http(s) URL with a host")
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            # The resolver's own error text stays in no answer: the reason is enough.
            return PushRefusal("does-not-resolve", f"{host} does not resolve")
        found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in found:
            if not await self._callable(address):
                return PushRefusal(
                    "not-public",
                    f"{host} resolves to {address}, which is not public and not in "
                    "the operator's allow-list (--push-allow)",
                    address,
                )
        if not found:
            return PushRefusal("does-not-resolve", f"{host} does not resolve")
        return found

    async def addresses(self, url: str) -> list[str] | None:
        """The addresses `url`'s host resolves to, all of them callable; None
        (logged) when the URL is refused."""
        checked = await self._check(url)
        if isinstance(checked, PushRefusal):
            logger.warning("push URL refused: %s: %s", url, checked.message)
            return None
        return checked

    async def refusal(self, url: str) -> PushRefusal | None:
        """Why `url` is refused, or None when it may be called."""
        checked = await self._check(url)
        return checked if isinstance(checked, PushRefusal) else None

    async def validate(self, url: str) -> bool:
        """a2a-sdk's `push_url_validator`: true when `url` may be registered;
        else raises invalid params naming the reason, which a2a-sdk maps to
        every binding's error (JSON-RPC -32602, HTTP 400, gRPC
        INVALID_ARGUMENT). The answer names no more than the caller's own
        URL resolved to: never the allow-list itself."""
        refused = await self.refusal(url)
        if refused is not None:
            logger.warning("push URL refused: %s: %s", url, refused.message)
            raise InvalidParamsError(
                message=f"Invalid push notification URL: {refused.message}",
                data=refused.data(),
            )
        return True


@dataclass(frozen=True)
class PushRefusal:
    """Why a webhook URL is refused: `reason` (unparseable, not-http,
    does-not-resolve, not-public), a sentence, and the refused address."""

    reason: str
    message: str
    address: str | None = None

    def data(self) -> dict[str, str]:
        """The error's `data`: the reason and, for not-public, the address."""
        data = {"reason": self.reason}
        if self.address is not None:
            data["address"] = self.address
        return data


@dataclass
class _Delivery:
    config: TaskPushNotificationConfig
    body: bytes


class WebhookSender(PushNotificationSender):
    """Delivers task events to their webhooks (see the module docstring);
    deliveries happen while `running()` is entered."""

    def __init__(
        self,
        configs: DispatchStore,
        policy: PushPolicy,
        *,
        tasks: TaskStore,
        attempts: int = 4,
        backoff: float = 0.5,
        timeout: float = 10.0,
        backlog: int = 1000,
        drain_timeout: float = 3.0,
    ) -> None:
        """`tasks`: the task store the v0.3 payloads (the whole task) are
        read from; `backlog`: deliveries queued per webhook of a task (older
        ones dropped beyond it); `drain_timeout`: seconds queued deliveries
        may still take when the server stops."""
        self.configs = configs
        self.tasks = tasks
        self.policy = policy
        self.attempts = attempts
        self.backoff = backoff
        self.timeout = timeout
        self.backlog = backlog
        self.drain_timeout = drain_timeout
        self._queues: dict[tuple[str, str], deque[_Delivery]] = {}
        self._tg: TaskGroup | None = None
        self._http: httpx.AsyncClient | None = None
        self._drained: anyio.Event | None = None
        """Set once no delivery is queued (while stopping)."""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with (
            httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as http,
            anyio.create_task_group() as tg,
        ):
            self._http, self._tg = http, tg
            try:
                yield
                # The last events of stopping tasks still go out, briefly.
                if self._queues:
                    self._drained = anyio.Event()
                    with anyio.move_on_after(self.drain_timeout):
                        await self._drained.wait()
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    async def send_notification(self, task_id: str, event: PushNotificationEvent) -> None:
        try:
            targets = await self.configs.get_targets_for_dispatch(task_id)
        except Exception:
            logger.exception("push: cannot read the webhooks of task %s", task_id)
            return
        if not targets:
            return
        tg = self._tg
        if tg is None:
            logger.warning("push: server stopping, event of task %s not delivered", task_id)
            return
        # Made once per shape (a v0.3 task per owner: the one it is read as).
        bodies: dict[tuple[str, str], bytes | None] = {}
        for target in targets:
            shape = (target.protocol, target.owner if target.protocol == "0.3" else "")
            if shape not in bodies:
                bodies[shape] = await self._body(task_id, event, target)
            body = bodies[shape]
            if body is None:
                continue
            config = target.config
            key = (task_id, config.id)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
                tg.start_soon(self._work, key, queue, name=f"push {task_id}/{config.id}")
            if len(queue) >= self.backlog:
                queue.popleft()
                logger.warning("push: %s backlog full; oldest delivery dropped", config.url)
            queue.append(_Delivery(config, body))

    async def _body(
        self, task_id: str, event: PushNotificationEvent, target: PushTarget
    ) -> bytes | None:
        """What `target` is sent for `event`, in the shape of its protocol
        (see the module docstring); None (logged) when the v0.3 task cannot
        be read."""
        if target.protocol != "0.3":
            return json.dumps(MessageToDict(to_stream_response(event))).encode()
        try:
            # Read after the event was applied: the task as it now stands.
            task = await self.tasks.get(task_id, ServerCallContext(user=TaskOwner(target.owner)))
        except Exception:
            logger.exception("push: cannot read task %s for its v0.3 webhooks", task_id)
            return None
        if task is None:
            logger.warning("push: task %s not found for its v0.3 webhooks", task_id)
            return None
        return to_compat_task(task).model_dump_json(by_alias=True, exclude_none=True).encode()

    async def _work(self, key: tuple[str, str], queue: deque[_Delivery]) -> None:
        try:
            while queue:
                failed = queue[0]
                delivered = await self._deliver(failed, key[0])
                queue.popleft()
                if delivered:
                    continue
                # The webhook is down or refuses: what waits for the same URL
                # would fare no better. A config registered again meanwhile
                # (a receiver back at a new address) keeps its deliveries.
                kept = [d for d in queue if d.config.url != failed.config.url]
                if len(kept) < len(queue):
                    logger.warning(
                        "push: %d queued event(s) of task %s to %s dropped",
                        len(queue) - len(kept),
                        key[0],
                        failed.config.url,
                    )
                    queue.clear()
                    queue.extend(kept)
        finally:
            # No await between the queue found empty and this: an event
            # queued meanwhile would have been taken by the loop.
            if self._queues.get(key) is queue:
                del self._queues[key]
            if not self._queues and self._drained is not None:
                self._drained.set()

    def _headers(self, config: TaskPushNotificationConfig) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if config.token:
            headers[TOKEN_HEADER] = config.token
        if config.HasField("authentication") and config.authentication.scheme:
            auth = config.authentication
            if auth.credentials:
                headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        return headers

    async def _deliver(self, delivery: _Delivery, task_id: str) -> bool:
        config = delivery.config
        delay = self.backoff
        problem = ""
        for attempt in range(1, self.attempts + 1):
            addresses = await self.policy.addresses(config.url)
            if addresses is None:
                return False  # refused now (logged): a retry would be too
            try:
                response = await self._post(config.url, addresses[0], delivery.body, config)
                if response.status_code < 300:
                    return True
                problem = f"HTTP {response.status_code}"
                if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                    break  # the receiver refuses it; the same again would be too
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                logger.info(
                    "push to %s (task %s) failed (%s); again in %g s",
                    config.url,
                    task_id,
                    problem,
                    delay,
                )
                await anyio.sleep(delay)
                delay *= 2
        logger.warning("push to %s (task %s) not delivered: %s", config.url, task_id, problem)
        return False

    async def _post(
        self, url: str, address: str, body: bytes, config: TaskPushNotificationConfig
    ) -> httpx.Response:
        assert self._http is not None
        target = httpx.URL(url)
        headers = self._headers(config)
        # To the address just checked, under the URL's own name (Host, SNI).
        headers["Host"] = target.netloc.decode("ascii")
        extensions: dict[str, Any] = {}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        pinned = target.copy_with(host=address.split("%", 1)[0])
        return await self._http.post(pinned, content=body, headers=headers, extensions=extensions)


class PushService:
    """A server's push notification parts, for a2a-sdk's request handler:
    the config store beside `task_store`, the sender and the policy."""

    def __init__(self, task_store: Any, policy: PushPolicy | None = None) -> None:
        self.policy = policy if policy is not None else PushPolicy()
        # Each config keeps the protocol version it was registered in.
        self.configs = open_push_config_store(
            task_store, self.policy.limits, protocol_of=call_protocol
        )
        self.sender = WebhookSender(self.configs, self.policy, tasks=task_store)

    def handler_args(self) -> dict[str, Any]:
        """Keyword arguments of `DefaultRequestHandler`."""
        return {
            "push_config_store": self.configs,
            "push_sender": self.sender,
            "push_url_validator": self.policy.validate,
        }

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        try:
            async with self.sender.running():
                yield
        finally:
            if isinstance(self.configs, SQLitePushConfigStore):
                self.configs.close()

    @staticmethod
    def describe(policy: PushPolicy) -> str:
        nets: Sequence[_Network] = policy.allow
        allowed = ", ".join(str(n) for n in nets)
        return "public addresses" + (f" and {allowed}" if allowed else " only")
