"""Shared fixtures. The real vLLM CPU server is started once per session (about 30 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vllm_server import VllmServer, start_vllm


@pytest.fixture(scope="session")
def vllm() -> Iterator[VllmServer]:
    """A real vLLM OpenAI server (CPU) serving the tiny local model as ``tiny``.

    Tests that kill or restart it must leave it running again when they end."""
    with start_vllm() as server:
        yield server
