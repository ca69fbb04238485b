"""Inject templates: Jinja in a sandbox whose output, values and work are bounded.

An inject template is written by a parent's model (a `subscribe` call) or by
an operator (a reactions file) and rendered inside the orchestrator's event
loop each time an event matches, so it must not be able to take the process
down. Jinja's `SandboxedEnvironment` stops attribute walks to Python
internals, but it has no limit on what a template computes:
`{{ 'x' * 10**9 }}` builds a gigabyte before anything is written,
`{% for %}` over ranges nests into billions of steps, and any Python
exception (`OverflowError`, `ZeroDivisionError`, `RecursionError`) escapes
as itself. The contract kept here:

- `render_inject` raises only `ControlError`, whatever the template does
  (cancellation and interpreter exits still propagate: they are not the
  template's).
- The rendered text is at most `INJECT_LIMIT` bytes of UTF-8, cut with
  `INJECT_CUT` (the template is streamed and stopped there, never rendered
  whole first).
- No value a template makes is longer than `VALUE_LIMIT` plus the longest
  string in its context: operations that can grow a value faster than their
  inputs (`*`, `**`, `%` widths, `join`, `replace`, `indent`, padding
  widths, ...) are checked before they run, the rest after.
- The work of one rendering is metered: every loop step, call, filter and
  operator spends fuel, values spend by their size, and a rendering that
  runs out fails (which bounds its time as well as its memory).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextvars import ContextVar
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from ..errors import ControlError

__all__ = ["FUEL", "INJECT_CUT", "INJECT_LIMIT", "MAX_RANGE", "VALUE_LIMIT", "render_inject"]

INJECT_LIMIT = 64 * 1024
"""Bytes (UTF-8) of rendered text at most, the cut marker included."""
INJECT_CUT = "\n…[inject cut at 64 KiB]"
VALUE_LIMIT = 256 * 1024
"""How much longer than its context's longest string a template's value may grow."""
FUEL = 100_000
"""Units of work per rendering: one per loop step, call, filter or operator,
plus one per 256 characters of every value made."""
MAX_RANGE = 10_000
"""Items in one `range()`; Jinja's own sandbox allows 100 000."""
_INT_BITS = 100_000
"""The largest integer (in bits) an arithmetic operator may make."""


class _Meter:
    """One rendering's budget."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.fuel = FUEL

    def spend(self, units: int = 1) -> None:
        self.fuel -= units
        if self.fuel < 0:
            raise SecurityError(f"the template does too much work (more than {FUEL} steps)")

    def allow(self, size: int, what: str) -> None:
        """Refuse, before it is made, a value of `size` past the ceiling."""
        if size > self.ceiling:
            raise SecurityError(f"{what} would make a value of {size} items (limit {self.ceiling})")

    def made(self, value: Any, what: str) -> Any:
        """Account for a value just made; pass it on."""
        if isinstance(value, str | bytes | list | tuple | dict | set):
            self.allow(len(value), what)
            self.spend(1 + len(value) // 256)
        else:
            self.spend()
        return value


_meter: ContextVar[_Meter | None] = ContextVar("inject_template_meter", default=None)


def _current() -> _Meter:
    meter = _meter.get()
    # Outside `render_inject` (a template rendered by hand) each operation
    # still meets the size limits, over an empty context; only a rendering
    # has a budget of work to spend.
    return meter if meter is not None else _Meter(VALUE_LIMIT)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, Sized) else 1


def _longest_string(value: Any, depth: int = 0) -> int:
    """The longest string in a context (events nest a few levels at most)."""
    if isinstance(value, str | bytes):
        return len(value)
    if depth > 8:
        return 0
    if isinstance(value, Mapping):
        return max((_longest_string(v, depth + 1) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return max((_longest_string(v, depth + 1) for v in value), default=0)
    return 0


# -- checks before growth ---------------------------------------------------------

_FORMAT_WIDTHS = re.compile(r"%[^a-zA-Z%]*|\{[^{}]*\}")
_DIGITS = re.compile(r"\d+")
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")
_FORMATTING = frozenset(["format", "format_map"])
"""Calls whose integer arguments are values to print, not sizes."""


def _check_format(meter: _Meter, template: str, args: Iterable[Any]) -> None:
    """Widths and precisions in a `%` or `{}` format string stay under the
    ceiling, and so do the integers given for widths taken from the arguments
    (`%*d`, `{:{}}`); other numbers are values to print, of any size."""
    for spec in _FORMAT_WIDTHS.findall(template):
        for digits in _DIGITS.findall(spec):
            if len(digits) > 12 or int(digits) > meter.ceiling:
                raise SecurityError(f"format width {digits} is too large")
    if "*" in template or _NESTED_FIELD.search(template):
        _check_arguments(meter, args)


def _check_arguments(meter: _Meter, args: Iterable[Any]) -> None:
    """Integers passed to a call or filter (widths, counts, sizes) stay under the ceiling."""
    for value in args:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > meter.ceiling:
            raise SecurityError(f"argument {value} is too large")


def _joined_size(separator: Any, items: Any) -> int:
    if not isinstance(items, list | tuple | str):
        return 0  # a lazy iterable is measured after, by its result
    parts = sum(len(x) if isinstance(x, str) else 20 for x in items)
    return parts + _size(separator) * max(0, len(items) - 1)


def _replaced_size(text: Any, old: Any, new: Any) -> int:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    count = text.count(old) if old else len(text) + 1
    return len(text) + count * max(0, len(new) - len(old))


def _check_growth(meter: _Meter, name: str, subject: Any, args: tuple[Any, ...], kw: Any) -> None:
    """The calls and filters whose result can outgrow their inputs many times over."""
    if name == "join":  # str.join(items) and the `join` filter (items, separator)
        if isinstance(subject, str) and args:
            size = _joined_size(subject, args[0])
        else:
            size = _joined_size(args[0] if args else kw.get("d", ""), subject)
        meter.allow(size, "join")
    elif name == "replace" and len(args) >= 2:
        meter.allow(_replaced_size(subject, args[0], args[1]), "replace")
    elif name == "indent" and isinstance(subject, str):
        width = args[0] if args else kw.get("width", 4)
        unit = len(width) if isinstance(width, str) else int(width)
        meter.allow(len(subject) + (subject.count("\n") + 1) * unit, "indent")
    elif name == "wordwrap" and isinstance(subject, str):
        wrap = kw.get("wrapstring") or (args[2] if len(args) > 2 else None) or "\n"
        width = args[0] if args else kw.get("width", 79)
        breaks = len(subject) // max(1, int(width)) + subject.count(" ") + 1
        meter.allow(len(subject) + breaks * len(str(wrap)), "wordwrap")
    elif name == "expandtabs" and isinstance(subject, str):
        tab = args[0] if args else kw.get("tabsize", 8)
        meter.allow(len(subject) + subject.count("\t") * int(tab), "expandtabs")
    elif name == "translate" and isinstance(subject, str) and args:
        table = args[0]
        longest = max((_size(v) for v in getattr(table, "values", lambda: ())()), default=1)
        meter.allow(len(subject) * max(1, longest), "translate")
    elif name in _FORMATTING and isinstance(subject, str):
        _check_format(meter, subject, [*args, *kw.values()])


def _guard_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that checks its arguments first and accounts for its result."""

    @functools.wraps(function)  # keeps Jinja's pass_context/pass_environment marks
    def guarded(*args: Any, **kwargs: Any) -> Any:
        meter = _current()
        meter.spend()
        # Context-, eval-context- or environment-passing filters get that first.
        values = [a for a in args if not isinstance(a, jinja2.runtime.Context | jinja2.Environment)]
        values = [a for a in values if not isinstance(a, jinja2.nodes.EvalContext)]
        if name not in _FORMATTING:
            _check_arguments(meter, [*values, *kwargs.values()])
        if values:
            _check_growth(meter, name, values[0], tuple(values[1:]), kwargs)
        return meter.made(function(*args, **kwargs), f"filter {name!r}")

    return guarded


# -- the environment ----------------------------------------------------------------


class _MeteredCode(CodeGenerator):
    """Routes what Jinja compiles to plain Python through the meter: each
    `{% for %}` iterates through `environment.metered`, each `~` through
    `environment.concat_metered`, each slice through `environment.slice_metered`."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        metered = nodes.Call(
            nodes.EnvironmentAttribute("metered", lineno=node.lineno),
            [node.iter],
            [],
            None,
            None,
            lineno=node.lineno,
        )
        super().visit_For(
            nodes.For(
                node.target,
                metered,
                node.body,
                node.else_,
                node.test,
                node.recursive,
                lineno=node.lineno,
                environment=self.environment,
            ),
            frame,
        )

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        # Jinja writes slices as plain Python (`x[::-1]`), past the sandbox's
        # `getitem`; a copy of a long value costs by its size like any other.
        if not isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.slice_metered(")
        self.visit(node.node, frame)
        self.write(", slice(")
        for place, part in enumerate((node.arg.start, node.arg.stop, node.arg.step)):
            self.write(", " if place else "")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write("))")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat_metered((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _metered(iterable: Any) -> Iterator[Any]:
    meter = _current()
    for item in iterable:
        meter.spend()
        yield item


def _range(*args: int) -> range:
    meter = _current()
    _check_arguments(meter, args)
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise SecurityError(f"range of {len(numbers)} items (limit {MAX_RANGE})")
    meter.spend()
    return numbers


class BoundedSandbox(SandboxedEnvironment):
    """A `SandboxedEnvironment` with the limits of the module docstring."""

    code_generator_class = _MeteredCode
    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _range
        # Paragraphs of filler text on demand: no use in an injection, and a
        # cheap way to ask for megabytes.
        self.globals.pop("lipsum", None)
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.metered = _metered
        self.concat_metered = self._concat
        self.slice_metered = self._slice

    def _slice(self, value: Any, part: slice) -> Any:
        meter = _current()
        meter.spend()
        return meter.made(value[part], "a slice")

    def _concat(self, values: tuple[Any, ...]) -> str:
        meter = _current()
        parts = [str(v) for v in values]
        meter.allow(sum(len(p) for p in parts), "'~'")
        return meter.made("".join(parts), "'~'")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # Jinja hands templates its own wrapper for `str.format` (it runs the
        # formatting in its sandbox); the widths are checked before it runs.
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        template = str(value.__self__)

        @functools.wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(_current(), template, [*args, *kwargs.values()])
            return wrapper(*args, **kwargs)

        return checked

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        meter = _current()
        meter.spend()
        sequences = str | bytes | list | tuple
        if operator == "*":
            if isinstance(left, sequences) and isinstance(right, int):
                meter.allow(len(left) * max(0, right), "'*'")
            elif isinstance(right, sequences) and isinstance(left, int):
                meter.allow(len(right) * max(0, left), "'*'")
            elif isinstance(left, int) and isinstance(right, int):
                _check_bits(left.bit_length() + right.bit_length())
        elif operator == "+" and isinstance(left, sequences) and isinstance(right, sequences):
            meter.allow(len(left) + len(right), "'+'")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _check_bits(right * max(1, abs(left).bit_length()))
        elif operator == "%" and isinstance(left, str):
            _check_format(meter, left, right if isinstance(right, tuple) else (right,))
        return meter.made(super().call_binop(context, operator, left, right), repr(operator))

    def call(
        __self,  # Jinja's signature: `self` may be a keyword argument of the call
        __context: jinja2.runtime.Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        meter = _current()
        meter.spend()
        subject = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if name not in _FORMATTING:
            _check_arguments(meter, [*args, *kwargs.values()])
        if subject is not None and name:
            _check_growth(meter, name, subject, args, kwargs)
        result = SandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        return meter.made(result, f"call to {name or type(__obj).__name__}")


def _check_bits(bits: int) -> None:
    if bits > _INT_BITS:
        raise SecurityError(f"an integer of about {bits} bits is too large")


class _Undefined(jinja2.ChainableUndefined):
    """A missing field renders empty (events differ in their fields); an unsafe
    attribute fails at once instead of rendering empty the same way."""

    def __init__(self, hint: str | None = None, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("exc") is SecurityError:
            raise SecurityError(hint or "unsafe access in an inject template")
        super().__init__(hint, *args, **kwargs)


_SANDBOX = BoundedSandbox(autoescape=False, undefined=_Undefined)


@functools.lru_cache(maxsize=256)
def _compile(template: str) -> jinja2.Template:
    # A subscription renders the same template on every matching event.
    return _SANDBOX.from_string(template)


def render_inject(template: str, context: Mapping[str, Any]) -> str:
    """Render an inject template with `event` = `context`, bounded (see the
    module docstring); any failure is a `ControlError` saying what went wrong."""
    token = _meter.set(_Meter(VALUE_LIMIT + _longest_string(context)))
    try:
        return _stream(_compile(template).generate(event=context))
    except ControlError:
        raise
    except jinja2.TemplateError as exc:
        raise ControlError(f"inject template: {exc}") from exc
    except Exception as exc:  # OverflowError, ZeroDivisionError, RecursionError, MemoryError...
        raise ControlError(f"inject template: {type(exc).__name__}: {exc}") from exc
    finally:
        _meter.reset(token)


def _stream(chunks: Iterator[str]) -> str:
    """Join a rendering's chunks, stopping (and closing the generator) once
    `INJECT_LIMIT` bytes would be passed."""
    room = INJECT_LIMIT - len(INJECT_CUT.encode())
    out: list[str] = []
    used = 0
    try:
        for chunk in chunks:
            size = len(chunk.encode())
            if used + size > room:
                # The part that fits, cut on a character boundary.
                out.append(chunk.encode()[: room - used].decode(errors="ignore"))
                return "".join(out) + INJECT_CUT
            out.append(chunk)
            used += size
        return "".join(out)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
