"""A2A requests and what their streams answer, for a stock a2a-sdk client."""

from __future__ import annotations

from typing import Any

from a2a.helpers import new_text_message
from a2a.types import (
    Role,
    SendMessageRequest,
    StreamResponse,
)

from a2a_orchestrator.protocol.decoding import StreamDecoder
from a2a_orchestrator.runtime.events import ChildEvent


def user_message(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    message = new_text_message(text, role=Role.ROLE_USER)
    if task_id:
        message.task_id = task_id
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


async def collect(
    client: Any, request: SendMessageRequest
) -> tuple[list[StreamResponse], list[ChildEvent]]:
    decoder = StreamDecoder()
    responses: list[StreamResponse] = []
    events: list[ChildEvent] = []
    async for response in client.send_message(request):
        responses.append(response)
        events.extend(decoder.decode(response))
    return responses, events


def task_id_of(responses: list[StreamResponse]) -> str:
    first = responses[0]
    return first.task.id if first.HasField("task") else first.status_update.task_id
