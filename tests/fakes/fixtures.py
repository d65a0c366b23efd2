"""pytest fixtures around the fake OpenAI-compatible server.

Import ``fake_openai`` into a conftest (or a test module) to use it::

    from tests.fakes.fixtures import fake_openai  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import FakeOpenAIServer


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """Yield a started fake OpenAI server on loopback; stop it after the test."""
    with FakeOpenAIServer() as server:
        yield server
