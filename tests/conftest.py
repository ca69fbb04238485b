"""Fixtures only; the helpers tests import live in `support/`."""

import pytest
from support.postgres import postgres  # noqa: F401  (a session fixture)


@pytest.fixture
def anyio_backend() -> str:
    # The a2a-sdk server and client are asyncio-only.
    return "asyncio"
