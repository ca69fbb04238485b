"""Python's cyclic garbage collector, set for the long-running commands
(`run`, `resume`, `serve`).

CPython collects its youngest generation every 700 net allocations of
container objects and the whole heap every hundred of those (plus a rule on
how much has survived). A process with a thousand children in flight holds
hundreds of thousands of live objects (start-up alone leaves 80,000 to
170,000: the SDK's protobuf descriptors, pydantic models, a model client),
so each full collection walks them all to find almost nothing: in
bench/fanout.py that was a third of the orchestrator's CPU, 1.7 of 4.9 s for
1,000 children.

`settle()` moves what exists into the collector's permanent generation
(`gc.freeze`: never walked again; reference counting still frees a frozen
object without a cycle, a frozen cycle stays) and collects the young less
often. `serve` calls it once it has built its server and model; `run` and
`resume` once their session's modules are loaded, before the session opens
(a pass's model client, imported when the pass starts, is not among what is
frozen). Everything without a cycle is still freed at once; cyclic garbage
waits longer: a young cycle until the next young collection (10,000
allocations), an older one until a full collection.

A library caller (`Session`, `run_role_server` in a host's process) keeps
its own settings: this is the commands' choice, not the package's.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["THRESHOLDS", "settle"]

#: Allocations between two collections of the youngest generation (CPython:
#: 700), and collections of one generation per collection of the next
#: (CPython: 10 and 10).
THRESHOLDS = (10_000, 10, 10)

logger = logging.getLogger(__name__)


def settle() -> None:
    """Freeze what start-up made and collect the young less often."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    logger.info(
        "garbage collector: %d start-up objects frozen, thresholds %s",
        gc.get_freeze_count(),
        THRESHOLDS,
    )
