"""The two transports of the delegation interface."""

from .local import LocalDelegate as LocalDelegate
from .local import LocalRun as LocalRun
from .remote import RemoteDelegate as RemoteDelegate
from .remote import RemoteRun as RemoteRun
from .remote import translate_error as translate_error

__all__ = ["LocalDelegate", "LocalRun", "RemoteDelegate", "RemoteRun", "translate_error"]
