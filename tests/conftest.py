import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The a2a-sdk server and client are asyncio-only.
    return "asyncio"
