"""Targets room: clients that turn a RequestSpec into an Outcome (OpenAI API over aiohttp)."""

from soakd.targets.openai import OpenAITarget, new_outcome, open_target

__all__ = ["OpenAITarget", "new_outcome", "open_target"]
