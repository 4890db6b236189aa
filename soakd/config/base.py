"""Config room, base: the strict model, ConfigError, and the value types every section
uses (durations, sizes, limits, http URLs, HOST:PORT).

Nothing else in soakd reads config files or environment variables (API keys are read
here too, by reference, and kept out of every repr).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from soakd.net import parse_host_port, url_problem


class ConfigError(Exception):
    """A config problem, already phrased for the user: one line per problem, the first
    leading and the others indented under it (``str()``), each naming its field path."""

    def __init__(self, message: str, more: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = [message, *(more or [])]

    def __str__(self) -> str:
        return "\n  ".join(self.problems)

    @classmethod
    def of(cls, problems: list[str]) -> ConfigError:
        return cls(problems[0], problems[1:])


# --- durations, sizes, limits ----------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


MAX_DURATION_S = 100 * 365 * 86400
"""Longest duration accepted (100 years): beyond it calendar arithmetic overflows."""
MAX_CONCURRENCY = 28_000
"""The most requests one soakd can hold open to one server: each needs its own source
port, and Linux hands out about 28,000 of them (net.ipv4.ip_local_port_range) per
destination. A larger closed-loop concurrency or in-flight cap is a config error."""

_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


MAX_CONFIG_VALUES = 100_000
"""Most values (mappings, lists, keys and scalars) a config may hold with its YAML aliases
expanded, as every reader of it sees them (the JSON of each request, the journal's copy).
A real config holds hundreds; ten levels of ten aliases ("billion laughs") would hold
10^10 and end in MemoryError."""


_PATH_KEPT = 4


class TooLarge(ValueError):
    """A YAML document past MAX_CONFIG_VALUES (the caller names where it came from)."""


def _yaml_load(text: str) -> Any:
    """Parse YAML (the safe loader), then count its values as expanded: TooLarge past
    MAX_CONFIG_VALUES. The loader shares an aliased node, so parsing a bomb costs
    little; the count stops at the limit, so neither does this, nor an alias that
    holds itself."""
    data = yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a safe loader)
    seen = 1
    # each node with the first keys of its path (enough to name the section; a full path
    # would grow with the depth of an alias that holds itself)
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            seen += 2 * len(node)
            stack.extend((v, (*path, str(k))[:_PATH_KEPT]) for k, v in node.items())
        elif isinstance(node, list):
            seen += len(node)
            stack.extend((v, (*path, str(i))[:_PATH_KEPT]) for i, v in enumerate(node))
        else:
            continue
        if seen > MAX_CONFIG_VALUES:
            where = ".".join(path) + ("..." if len(path) == _PATH_KEPT else "")
            raise TooLarge(
                f"{where or 'the document'}: over {MAX_CONFIG_VALUES:,} values once its YAML "
                "aliases are expanded (an alias repeats all it names: one that holds "
                "itself, or aliases of aliases?)"
            )
    return data


def parse_duration(value: Any) -> float:
    """``"72h"``, ``"1h30m"``, ``"500ms"``, ``"2.5s"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic turns only ValueError into a field error
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ValueError("empty duration")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_RE.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text):
                raise ValueError(
                    f"bad duration {value!r}: use a number and a unit (ms, s, m, h, d), "
                    "e.g. 72h or 1h30m"
                ) from None
    else:
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004 (as above)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # nan, 1e400
        raise ValueError(f"not a finite duration: {value!r}")
    if seconds < 0:
        raise ValueError(f"negative duration {value!r}")
    if seconds > MAX_DURATION_S:  # past what a calendar (datetime) can add up
        raise ValueError(f"duration {value!r} is over {MAX_DURATION_S // 86400}d")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> a short human form (``"72h"``, ``"1h30m"``, ``"2.5s"``)."""
    if seconds < 60:
        return f"{seconds:g}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in YAML as ``72h``, ``5m``, ``500ms``... ."""
PositiveDuration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
"""A Duration that must be above zero (a deadline of 0 s would fail every request)."""

MAX_RATE = 1e12
"""Requests a second, far past any client (the overload tests ask 1e9): past it, the
expected counts of a long plan overflow."""
PositiveRate = Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Count = Annotated[int, Field(ge=1)]

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
"""A name soakd puts in labels, file names and run ids: a target's, a phase's, a run's."""
Name = Annotated[str, Field(pattern=rf"^{NAME_PATTERN}$")]


def repeated_name(section: str, names: Iterable[str]) -> str | None:
    """A list whose items are known by their name (``targets``, ``phases``) names each
    once: the line for the first item whose name an earlier one has (``phases[2]:
    duplicate name 'p' (phases[0] has it)``), by index, as the name no longer tells them
    apart; None when each name is its own. Linear (40,000 targets are checked)."""
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        was = first.setdefault(name, i)
        if was != i:
            return f"{section}[{i}]: duplicate name {name!r} ({section}[{was}] has it)"
    return None


Limit = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
"""A latency limit: a duration above zero (``2s``, ``100ms``)."""


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 1024.0,
    "mib": 1024.0**2,
    "gib": 1024.0**3,
    "tib": 1024.0**4,
}


def parse_bytes(value: Any) -> Any:
    """``"5GB"``, ``"512MiB"`` or a number -> bytes (other input is left to pydantic)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _BYTE_UNITS:
            raise ValueError(f"bad size {value!r}: use a number and a unit, e.g. 5GB or 512MiB")
        return int(float(match.group(1)) * _BYTE_UNITS[unit])
    return value


Bytes = Annotated[float, BeforeValidator(parse_bytes), Field(gt=0)]
"""Bytes, written in YAML as ``3.9GB``, ``512MiB`` or a number."""


class Logging(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"  # auto: console on a terminal


def http_url(value: str | None, *, base: bool = False) -> str | None:
    """A URL field: one the client can ask for as written (``net.url_problem``: http or
    https, a host, a port within 1-65535, no user info); ``base``: no query or fragment."""
    if not value:
        return value
    problem = url_problem(value, base=base)
    if problem is not None:
        raise ValueError(problem)
    return value


def base_http_url(value: str | None) -> str | None:
    """A URL soakd appends paths to (``targets[].base_url``, a gateway's ``upstream``)."""
    return http_url(value, base=True)


def host_port(value: str) -> str:
    """A HOST:PORT field (``exporter.listen``, a gateway's ``listen``), kept as written."""
    parse_host_port(value)
    return value


HostPort = Annotated[str, AfterValidator(host_port)]
"""A listening address, ``HOST:PORT`` (checked, kept as written)."""


class ListensOn:
    """``host`` and ``port`` of a model's ``listen`` field (a ``HostPort``)."""

    if TYPE_CHECKING:
        listen: str

    @property
    def host(self) -> str:
        return parse_host_port(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_host_port(self.listen)[1]
