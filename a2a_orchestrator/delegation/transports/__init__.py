"""The transports of the delegation interface: each one a `Delegate`."""

from ..base import Delegate
from .client_errors import translate_error as translate_error
from .local import LocalDelegate as LocalDelegate
from .local import LocalRun as LocalRun
from .memory import MemoryDelegate as MemoryDelegate
from .memory import MemoryRun as MemoryRun
from .remote import RemoteDelegate as RemoteDelegate
from .remote_run import RemoteRun as RemoteRun

__all__ = [
    "LocalDelegate",
    "LocalRun",
    "MemoryDelegate",
    "MemoryRun",
    "RemoteDelegate",
    "RemoteRun",
    "translate_error",
]

# Checked by mypy: every transport implements `Delegate` exactly, and the
# runs it opens implement `ChildRun`.
_DELEGATES: tuple[type[Delegate], ...] = (LocalDelegate, RemoteDelegate, MemoryDelegate)
