"""Targets room: clients that turn a RequestSpec into an Outcome (OpenAI API over aiohttp)."""

from soakd.targets.openai import OpenAITarget, open_target

__all__ = ["OpenAITarget", "open_target"]
