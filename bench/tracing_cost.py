"""What tracing costs, off and on.

    python bench/tracing_cost.py [--rounds 7] [-n 40] [--quick]

Off is what runs without the OTEL_* variables: no SDK tracer provider, so
every span of `tracing.py` is the OpenTelemetry API's no-op. On is the SDK's
provider with the batch processor the CLI installs; its exporter encodes
each batch to OTLP protobuf, as the OTLP/HTTP exporter does, and drops it
(the POST to a collector happens on the processor's thread, off the traced
code's path, and depends on the collector).

Measured, in this process:

  span         one `execute_tool` span opened and closed (the cheapest hook)
  local        `Session.spawn` of an in-process child, then `wait()`:
               spans child, turn, chat
  remote       the same on a role server in this process (`run_role_server`):
               spans child, turn, and the server's turn, chat; trace context
               injected into the call and read back

Off and on alternate within each of `--rounds` rounds (`-n` calls each, the
span figure 500 times as many), so a change in the machine's load falls on
both; the batch is flushed between blocks, untimed, so one block's export
does not fall on the next. CPU is the process's, so it counts the batch
thread's encoding within a block. Prints wall and CPU per call (min and
median) and on minus off.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.to_thread
from benchkit import machine_line, min_median, scratch
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.observe import tracing
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

Call = Callable[[], Awaitable[None]]
SPANS_PER_CALL = 500


class EncodingExporter(SpanExporter):
    """Encodes each batch as OTLP protobuf bytes, then drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


async def spans() -> None:
    for _ in range(SPANS_PER_CALL):
        with tracing.tool_call("read_file") as traced:
            traced.succeeded(True)


async def timed(count: int, call: Call, wall: list[float], cpu: list[float]) -> None:
    for _ in range(count):
        started, used = time.perf_counter(), time.process_time()
        await call()
        cpu.append(time.process_time() - used)
        wall.append(time.perf_counter() - started)


async def main(rounds: int, n: int) -> None:
    work = scratch("a2a-bench-")
    model = ScriptedModel(lambda messages: {"text": "ok"})
    exporter = EncodingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    modes = {"off": None, "on": provider}
    async with run_role_server(find_role("coder"), model, work, db=str(work / "role.db")) as server:
        network = Network.of(
            AgentSpec(name="remote", role="coder", url=server.url),
            AgentSpec(name="local", role="coder"),
        )
        async with Session(
            Store(work / "o.db"), workdir=work, network=network, models=lambda name: model
        ) as session:

            def delegate(agent: str) -> Call:
                async def call() -> None:
                    handle = await session.spawn(ChildConfig(role=agent, prompt="hi"))
                    await handle.wait()

                return call

            variants: dict[str, Call] = {
                "span": spans,
                "local": delegate("local"),
                "remote": delegate("remote"),
            }
            for chosen in modes.values():  # warm up connections, caches, imports
                tracing.use_provider(chosen)
                for call in variants.values():
                    for _ in range(min(5, n)):
                        await call()
            keys = [(name, mode) for name in variants for mode in modes]
            wall: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
            cpu: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
            try:
                for _ in range(rounds):
                    for name, call in variants.items():
                        for mode, chosen in modes.items():
                            tracing.use_provider(chosen)
                            await timed(n, call, wall[name, mode], cpu[name, mode])
                            # The batch thread's export of this block is not the next one's.
                            await anyio.to_thread.run_sync(provider.force_flush)
            finally:
                tracing.use_provider(None)
    provider.shutdown()

    print(f"tracing cost: {rounds} rounds x {n} calls per variant and mode, instant model")
    print(f"machine: {machine_line()}")
    print(f"  exported while on: {exporter.spans} spans (encoded to OTLP, dropped)")
    print(
        f"  {'variant':<8} {'mode':<4} {'wall min':>10} {'median':>10}"
        f" {'cpu min':>10} {'median':>10}"
    )
    for name in variants:
        per = SPANS_PER_CALL if name == "span" else 1
        unit, scale = ("us", 1e6) if name == "span" else ("ms", 1e3)
        for mode in modes:
            wall_min, wall_median = min_median(wall[name, mode])
            cpu_min, cpu_median = min_median(cpu[name, mode])
            print(
                f"  {name:<8} {mode:<4} {wall_min / per * scale:7.2f} {unit}"
                f" {wall_median / per * scale:7.2f} {unit}"
                f" {cpu_min / per * scale:7.2f} {unit} {cpu_median / per * scale:7.2f} {unit}"
            )
    for name in variants:
        per = SPANS_PER_CALL if name == "span" else 1
        unit, scale = ("us", 1e6) if name == "span" else ("ms", 1e3)
        off_cpu = statistics.median(cpu[name, "off"]) / per
        on_cpu = statistics.median(cpu[name, "on"]) / per
        off_wall = statistics.median(wall[name, "off"]) / per
        on_wall = statistics.median(wall[name, "on"]) / per
        print(
            f"  {name:<8} on - off, medians: wall {(on_wall - off_wall) * scale:+.2f} {unit}"
            f" ({on_wall / off_wall:.2f}x), cpu {(on_cpu - off_cpu) * scale:+.2f} {unit}"
            f" ({on_cpu / off_cpu:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=40, help="calls per variant and mode per round")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.n = 2, 5
    anyio.run(main, args.rounds, args.n)
