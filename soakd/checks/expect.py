"""Checks room, the user's own: a JSONL file, one check a line, each with an ``expect``.

A line is ``{"prompt": "..."}`` or ``{"messages": [{"role": ..., "content": "..."}]}`` and
``"expect"``: a string (the exact answer, surrounding whitespace aside) or an object with
one of ``exact``, ``regex`` (Python's ``re``, searched), ``contains`` or ``json_schema`` (the
answer parsed as JSON, a fenced code block's content too, and validated by ``jsonschema``).
A bad line stops ``soakd check`` with one line naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonschema

from soakd.checks.verdict import FAIL, PASS, UNPARSEABLE, Verdict
from soakd.config import ConfigError

WAYS: Final = ("exact", "regex", "contains", "json_schema")
_FENCE: Final = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Expected:
    """One line's check: its prompt and how its answer is judged."""

    prompt: str
    way: str  # one of WAYS
    value: Any  # the text, a compiled pattern, or a jsonschema validator

    def judge(self, answer: str) -> Verdict:
        if self.way == "exact":
            return Verdict(PASS if answer.strip() == self.value.strip() else FAIL)
        if self.way == "contains":
            return Verdict(PASS if self.value in answer else FAIL)
        if self.way == "regex":
            return Verdict(PASS if self.value.search(answer) else FAIL)
        fenced = _FENCE.search(answer)
        try:
            doc = json.loads(fenced.group(1) if fenced else answer)
        except ValueError:
            return Verdict(UNPARSEABLE)
        return Verdict(PASS if self.value.is_valid(doc) else FAIL)


def read_checks(path: Path) -> list[Expected]:
    """Every line's check; ConfigError naming the file, line and field of the first bad one."""
    where = "checks.file"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    checks: list[Expected] = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            checks.append(_line(json.loads(raw)))
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: {path}:{lineno}: not valid UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {path}:{lineno}: not valid JSON ({exc.msg})") from None
        except _Bad as exc:
            raise ConfigError(f"{where}: {path}:{lineno}: {exc}") from None
    if not checks:
        raise ConfigError(f"{where}: {path} holds no checks")
    return checks


class _Bad(Exception):
    """What is wrong with one line (the caller adds file:line)."""


def _line(obj: Any) -> Expected:
    if not isinstance(obj, dict):
        raise _Bad(f'expected an object with "prompt" or "messages", got {type(obj).__name__}')
    unknown = sorted(set(obj) - {"prompt", "messages", "expect"})
    if unknown:
        raise _Bad(f"unknown key {unknown[0]!r} (known: prompt, messages, expect)")
    prompt = _prompt(obj)
    if "expect" not in obj:
        raise _Bad('"expect" is missing')
    expect = obj["expect"]
    if isinstance(expect, str):
        expect = {"exact": expect}
    if not isinstance(expect, dict) or len(expect) != 1 or next(iter(expect)) not in WAYS:
        raise _Bad(f'"expect" must be a string or an object with one of {", ".join(WAYS)}')
    ((way, value),) = expect.items()
    return Expected(prompt, way, _compiled(way, value))


def _prompt(obj: dict[str, Any]) -> str:
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise _Bad('"prompt" must be a non-empty string')
        return str(obj["prompt"])
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Bad('expected "prompt" or a non-empty "messages" list')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise _Bad(f'"messages[{i}].content" must be a string')
    return "\n".join(m["content"] for m in messages if m["content"])


def _compiled(way: str, value: Any) -> Any:
    field = f'"expect.{way}"'
    if way == "json_schema":
        if not isinstance(value, dict | bool):
            raise _Bad(f"{field} must be a JSON schema (an object)")
        cls = jsonschema.validators.validator_for(value)
        try:
            cls.check_schema(value)
        except jsonschema.SchemaError as exc:
            raise _Bad(f"{field} is not a valid schema: {exc.message}") from None
        return cls(value)
    if not isinstance(value, str) or not value:
        raise _Bad(f"{field} must be a non-empty string")
    if way == "regex":
        try:
            return re.compile(value)
        except re.error as exc:
            raise _Bad(f"{field} is not a valid regular expression: {exc}") from None
    return value
