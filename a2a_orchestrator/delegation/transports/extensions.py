"""The A2A extensions the remote transport activates on its calls.

`ExtensionsInterceptor` is an a2a-sdk client interceptor: before each call
it adds the extension URIs it was given to the call's `A2A-Extensions`
service parameter (an HTTP header, or gRPC metadata), merged with any the
call names itself (a control message names the control extension). The
remote transport gives it the extensions it reads that the agent's card
declares (`wanted_extensions`), so an agent that declares none gets no header.
"""

from __future__ import annotations

from a2a.client import ClientCallContext
from a2a.client.interceptors import AfterArgs, BeforeArgs, ClientCallInterceptor
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
from a2a.types import AgentCard

from ...protocol.wire import BATCH_VERSIONS

__all__ = ["READ_EXTENSIONS", "ExtensionsInterceptor", "wanted_extensions"]

READ_EXTENSIONS = (BATCH_VERSIONS,)
"""Extensions whose frames the remote transport reads (`decoding.events_of`),
each as its versions, newest first."""


def wanted_extensions(card: AgentCard) -> list[str]:
    """Of each extension in `READ_EXTENSIONS`, the newest version `card` declares."""
    declared = {extension.uri for extension in card.capabilities.extensions}
    wanted = []
    for versions in READ_EXTENSIONS:
        uri = next((uri for uri in versions if uri in declared), None)
        if uri is not None:
            wanted.append(uri)
    return wanted


class ExtensionsInterceptor(ClientCallInterceptor):
    """Activates `extensions` on each call."""

    def __init__(self, extensions: list[str]) -> None:
        self.extensions = list(extensions)

    async def before(self, args: BeforeArgs) -> None:
        if args.context is None:
            args.context = ClientCallContext()
        # A new mapping: the context may be one the caller reuses.
        args.context.service_parameters = ServiceParametersFactory.create_from(
            args.context.service_parameters, [with_a2a_extensions(self.extensions)]
        )

    async def after(self, args: AfterArgs) -> None:
        return None
