"""`Metrics`: a server's Prometheus metrics, served at `/metrics`.

Each server keeps its own registry (never prometheus-client's global one),
so several servers in one process count apart. What is counted comes from
streams the server already has, through three hooks:

- the task store's saves (`task_saved`, an `ObservedTaskStore` listener):
  the A2A tasks by state;
- the events its conversations emit and their model calls (`event`,
  `model_call`: `instruments.py` installs this object for the server's
  requests and lifespan): turns, tokens, tool calls, model errors;
- at scrape time, `children` (the orchestrator: its sessions' children
  running now, by transport).

Each server counts the work done in its own process: a role server its
role's turns, the orchestrator its parent agents' and in-process children's
turns, so summing over servers counts every turn once. Label values come
from the operator's configuration (roles, models, tools) and the SDK's task
states. A tool call is labelled with its tool's name only when the
conversation has that tool; a name the model invented is `other`, so no
model chooses label values. Names are cut to `MAX_LABEL_LENGTH` characters,
and past `MAX_TOOL_LABELS` distinct names (a library user's many tools) the
rest are `other` too: the series stay bounded whatever runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.types import Task, TaskState
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ModelError
from ..models.base import Usage
from ..runtime.events import ChildEvent, Done, Failed, InputRequired, ToolResult

__all__ = [
    "MAX_LABEL_LENGTH",
    "MAX_TOOL_LABELS",
    "METRICS_PATH",
    "METRIC_NAMES",
    "Metrics",
    "running_children",
]

METRICS_PATH = "/metrics"
MAX_TOOL_LABELS = 64
MAX_LABEL_LENGTH = 64

METRIC_NAMES = (
    "a2a_tasks_total",
    "a2a_tasks_active",
    "a2a_turn_duration_seconds",
    "a2a_model_call_duration_seconds",
    "a2a_tokens_total",
    "a2a_tool_calls_total",
    "a2a_tool_failures_total",
    "a2a_model_errors_total",
    "a2a_children_running",
)
"""Every metric family a server exposes (the README and the dashboard use them)."""

# A turn lasts from well under a second (a scripted model) to many minutes.
_TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_MODEL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)

_ACTIVE_STATES = frozenset({"submitted", "working", "input_required", "auth_required"})
_REMEMBERED_ENDS = 4096
"""Tasks that ended, remembered so a re-save of one is not counted twice."""


def _state_name(state: int) -> str:
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower()


class _Children(Collector):
    """`a2a_children_running`, read from its source at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, int]] | None) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "a2a_children_running",
            "Children this server's sessions have running now, by transport",
            labels=["transport"],
        )
        for transport, count in sorted((self._source() if self._source else {}).items()):
            family.add_metric([transport], count)
        yield family


class Metrics:
    """One server's metrics (see the module docstring); an `Instruments`."""

    def __init__(self, *, children: Callable[[], Mapping[str, int]] | None = None) -> None:
        """`children`: the children running now by transport (None: this
        server runs none, a role server)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tasks = Counter(
            "a2a_tasks", "A2A tasks that entered each state", ["state"], registry=r
        )
        self.tasks_active = Gauge(
            "a2a_tasks_active", "A2A tasks in each unfinished state now", ["state"], registry=r
        )
        self.turn_seconds = Histogram(
            "a2a_turn_duration_seconds",
            "Turns by how they ended (done, input_required, or the failure reason); "
            "wall time, paused time not counted",
            ["role", "model", "outcome"],
            buckets=_TURN_BUCKETS,
            registry=r,
        )
        self.model_seconds = Histogram(
            "a2a_model_call_duration_seconds",
            "Model calls (streamed to the end or failed)",
            ["role", "model"],
            buckets=_MODEL_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "a2a_tokens",
            "Tokens the model calls reported, input and output",
            ["role", "model", "direction"],
            registry=r,
        )
        self.tool_calls = Counter(
            "a2a_tool_calls", "Tool calls that returned a result", ["role", "tool"], registry=r
        )
        self.tool_failures = Counter(
            "a2a_tool_failures", "Tool calls that failed or refused", ["role", "tool"], registry=r
        )
        self.model_errors = Counter(
            "a2a_model_errors",
            "Model calls that failed, by kind (timeout, unreachable, http_429, ...)",
            ["role", "model", "kind"],
            registry=r,
        )
        r.register(_Children(children))
        self._task_states: dict[str, str] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._tools: set[str] = set()

    # -- the hooks --------------------------------------------------------------------

    async def task_saved(self, task: Task, context: ServerCallContext) -> None:
        """Told each save of an A2A task (`ObservedTaskStore`)."""
        state = _state_name(task.status.state)
        previous = self._task_states.get(task.id)
        if state == previous or task.id in self._ended:
            return
        self.tasks.labels(state).inc()
        if previous is not None:
            self.tasks_active.labels(previous).dec()
        if state in _ACTIVE_STATES:
            self.tasks_active.labels(state).inc()
            self._task_states[task.id] = state
            return
        self._task_states.pop(task.id, None)
        self._ended[task.id] = None
        if len(self._ended) > _REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    def event(self, role: str, model: str, event: ChildEvent, tools: Collection[str] = ()) -> None:
        if isinstance(event, ToolResult):
            tool = self._tool_label(event.tool, tools)
            self.tool_calls.labels(role, tool).inc()
            if not event.success:
                self.tool_failures.labels(role, tool).inc()
        elif isinstance(event, Done | InputRequired | Failed):
            outcome = event.reason if isinstance(event, Failed) else event.kind
            self.turn_seconds.labels(role, model, outcome).observe(event.spent.seconds)

    def model_call(
        self, role: str, model: str, seconds: float, usage: Usage, error: ModelError | None
    ) -> None:
        self.model_seconds.labels(role, model).observe(seconds)
        if usage.input_tokens:
            self.tokens.labels(role, model, "input").inc(usage.input_tokens)
        if usage.output_tokens:
            self.tokens.labels(role, model, "output").inc(usage.output_tokens)
        if error is not None:
            self.model_errors.labels(role, model, error.kind).inc()

    def _tool_label(self, tool: str, tools: Collection[str]) -> str:
        """`tool`'s label: its name (cut short) if the conversation has it."""
        if tool not in tools:
            return "other"
        label = tool[:MAX_LABEL_LENGTH]
        if label in self._tools:
            return label
        if len(self._tools) >= MAX_TOOL_LABELS:
            return "other"
        self._tools.add(label)
        return label

    # -- the endpoint -----------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

    def route(self) -> Route:
        """`GET /metrics`."""

        async def metrics(request: Request) -> Response:
            return Response(self.exposition(), media_type=CONTENT_TYPE_LATEST)

        return Route(METRICS_PATH, metrics, methods=["GET"])


def running_children(sessions: Any) -> dict[str, int]:
    """Children running now in `sessions` (`Session`s), by transport."""
    counts: dict[str, int] = {}
    for session in sessions:
        for handle in session.children.values():
            if handle.running:
                counts[handle.transport] = counts.get(handle.transport, 0) + 1
    return counts
