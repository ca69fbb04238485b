"""`RoleRequestHandler`: a2a-sdk's request handler with one repair.

A follow-up message that names only its task (no context id) is normal
A2A. When that task is no longer active in the server's memory (after a
restart, or once the SDK released an idle input-required task), a2a-sdk 1.3
starts the new active task under a freshly generated context id, and then
rejects the executor's events, which carry the task's real context id
("Context in event doesn't match TaskManager"). Filling the stored task's
context id into the message before the SDK sees it keeps the task's
conversation continuable across restarts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types import SendMessageRequest, Task

__all__ = ["RoleRequestHandler"]


class RoleRequestHandler(DefaultRequestHandler):
    async def _fill_context_id(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        message = params.message
        if message.task_id and not message.context_id:
            stored = await self.task_store.get(message.task_id, context)
            # A versioned (cluster) store wraps the task in a StoredTask.
            task = stored if isinstance(stored, Task) or stored is None else stored.task
            if task is not None:
                message.context_id = task.context_id

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Any:
        await self._fill_context_id(params, context)
        return await super().on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        await self._fill_context_id(params, context)
        async for event in super().on_message_send_stream(params, context):
            yield event
