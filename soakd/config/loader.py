"""Config room, loading: YAML, the ``SOAKD__`` environment overlay, and pydantic's errors
turned into one line per problem, each naming its field path."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from soakd.config.base import NAME_PATTERN, ConfigError, TooLarge, _yaml_load
from soakd.config.gateway import GatewayConfig
from soakd.config.run import Config
from soakd.config.slo import THRESHOLDS_MOVED, Decisions, JudgedTarget
from soakd.config.targets import TargetConfig

ENV_PREFIX = "SOAKD__"


def _env_value(key: str, text: str) -> Any:
    try:
        return _yaml_load(text)
    except TooLarge as exc:
        raise ConfigError(f"{key}: {exc}") from None
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{key}: not a YAML value: {why}") from None


def _apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], prefix: str = ENV_PREFIX
) -> dict[str, Any]:
    """Overlay ``SOAKD__SECTION__KEY=value``. List items by index or by their ``name``:
    ``SOAKD__TARGETS__LOCAL__BASE_URL`` or ``SOAKD__TARGETS__0__BASE_URL``. Values are
    parsed as YAML scalars, so numbers and booleans keep their type."""
    for key in sorted(environ):
        if not key.startswith(prefix):
            continue
        path = [p.lower() for p in key[len(prefix) :].split("__") if p]
        if not path:
            continue
        node: Any = raw
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):
                idx = _list_index(node, part)
                if idx is None:
                    raise ConfigError(f"{key}: no list item {part!r} in {'.'.join(path[:i])}")
                if last:
                    node[idx] = _env_value(key, environ[key])
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = _env_value(key, environ[key])
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"{key}: {'.'.join(path[:i])} is not a section")
    return raw


def _list_index(items: list[Any], part: str) -> int | None:
    if part.isascii() and part.isdigit():  # str.isdigit alone takes '²' and '٣' too
        return int(part) if int(part) < len(items) else None
    for i, item in enumerate(items):
        if isinstance(item, dict) and str(item.get("name", "")).lower().replace("-", "_") == (
            part.replace("-", "_")
        ):
            return i
    return None


_NAME_RE = re.compile(NAME_PATTERN)


_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _error_lines(
    exc: ValidationError, raw: Any, model: type[BaseModel], whole: str = "config"
) -> list[str]:
    """Every pydantic error -> ``field.path: message (got VALUE)``, list items by name. An
    error of the whole config (names, compare...: no field path of its own) is ``whole:
    message``: the file's path when it came from one."""
    errors = exc.errors(include_url=False)
    return list(dict.fromkeys(_one_error(err, raw, model, whole) for err in errors))


def _one_error(err: Any, raw: Any, model: type[BaseModel], whole: str = "config") -> str:
    parts: list[str] = []
    node: Any = raw
    for loc in err["loc"]:
        if isinstance(loc, int) and isinstance(node, list) and loc < len(node):
            item = node[loc]
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                name = None  # a name that is itself the problem (a newline...): the index
            parts.append(f"{parts.pop() if parts else ''}[{name or loc}]")
            node = item
            continue
        if isinstance(loc, str) and loc.startswith(("function-", "literal[", "nullable")):
            continue
        # a key that is not plain text (a CR, a space...) is shown quoted, on one line
        parts.append(str(loc) if _KEY_RE.fullmatch(str(loc)) else repr(loc))
        node = node.get(loc) if isinstance(node, dict) else None
    where = ".".join(parts) or whole
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        hint = _did_you_mean(model, err["loc"])
        return f"{where}: unknown key ({hint or 'check the spelling'})"
    if err["type"] == "missing":
        return f"{where}: required, but missing"
    if (
        "input" in err
        and err["type"] not in ("value_error",)
        and not isinstance(err["input"], dict | list)
    ):
        got = repr(err["input"])
        return f"{where}: {msg} (got {got if len(got) <= 80 else got[:77] + '...'})"
    return f"{where}: {msg}"


def _did_you_mean(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """'did you mean X?' for a misspelled key: the closest field of the model it is in."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list item: same model
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        current = _model_in(field.annotation)
        if current is None:
            return None
    names = list(getattr(current, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]`` or ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_config(path: Path | str, environ: Mapping[str, str] | None = None) -> Config:
    """Read, overlay env, validate. Every problem is a ConfigError with one line."""
    raw = _read_yaml(Path(path))
    return config_from_dict(raw, environ if environ is not None else os.environ, source=path)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        raw = _yaml_load(text)
    except TooLarge as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(
            f"{path}: not valid YAML at {where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    return raw


def load_decisions(path: Path | str) -> Decisions:
    """``soakd report --config``: the sections of a file that decide a run (``slo``,
    ``compare``, ``report``, and each target's ``name``, ``slo`` and ``cost``), checked as
    strictly as in a whole config. The file may be just those, or a whole config: its
    other sections (known ones; a misspelled key is still an error) are not used."""
    path = Path(path)
    raw = _read_yaml(path)
    problems = [_unknown(key, Config) for key in raw if key not in Config.model_fields]
    picked: dict[str, Any] = {k: raw[k] for k in Decisions.model_fields if k in raw}
    targets = raw.get("targets")
    if isinstance(targets, list):
        picked["targets"] = []
        for i, t in enumerate(targets):
            if not isinstance(t, dict):
                picked["targets"].append(t)  # the model says what is wrong with it
                continue
            where = f"targets[{t.get('name', i)}]"
            problems += [
                f"{where}.{_unknown(key, TargetConfig)}"
                for key in t
                if key not in TargetConfig.model_fields
            ]
            picked["targets"].append({k: t[k] for k in JudgedTarget.model_fields if k in t})
    decisions = None
    try:
        decisions = Decisions.model_validate(picked)
    except ValidationError as exc:
        problems += _error_lines(exc, picked, Decisions)
    if problems or decisions is None:
        raise ConfigError.of([f"{path}: {p}" for p in problems])
    return decisions


def _unknown(key: Any, model: type[BaseModel]) -> str:
    close = difflib.get_close_matches(str(key), list(model.model_fields), n=1, cutoff=0.6)
    return (
        f"{key}: unknown key ({f'did you mean {close[0]!r}?' if close else 'check the spelling'})"
    )


def config_from_dict(
    raw: dict[str, Any],
    environ: Mapping[str, str] | None = None,
    source: Path | str | None = None,
) -> Config:
    """``source``: the file it was read from, named by the errors of the whole config."""
    raw = _apply_env(raw, environ or {})
    exporter = raw.get("exporter")
    if isinstance(exporter, dict) and "thresholds" in exporter:
        raise ConfigError(THRESHOLDS_MOVED)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        whole = "config" if source is None else str(source)
        raise ConfigError.of(_error_lines(exc, raw, Config, whole)) from None


GATEWAY_ENV_PREFIX = "SOAKD_GATEWAY__"


def load_gateway_config(
    path: Path | str, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """A ``soakd gateway`` config file, read like the run's (``SOAKD_GATEWAY__`` env)."""
    raw = _read_yaml(Path(path))
    return gateway_config_from_dict(raw, environ if environ is not None else os.environ)


def gateway_config_from_dict(
    raw: dict[str, Any], environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    raw = _apply_env(raw, environ or {}, GATEWAY_ENV_PREFIX)
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError.of(_error_lines(exc, raw, GatewayConfig)) from None
