"""Workload, traces: a trace file's timestamps, read once for ``load.mode: trace``.

One streaming pass (a line at a time, never the whole file) into an ``array('q')`` of ns
after the first record, 8 bytes a record, with the busiest second counted on the way
(the sender sizing's peak). Formats: ``mooncake`` (JSONL, ``timestamp`` in ms) and
``burstgpt`` (CSV with a header, ``Timestamp`` in s). A timestamp that goes backwards, a
malformed record, an empty trace: one line naming the field, the file and the line
(ConfigError, exit 2 at ``soakd check``, before the journal opens).
"""

from __future__ import annotations

import csv
import json
import math
from array import array
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from soakd.config import ConfigError
from soakd.model import NS_PER_S
from soakd.shapes import TraceTimes

FORMATS = ("mooncake", "burstgpt")
"""The trace formats, and the prompt sources whose file is a trace (``trace_of``)."""
_FIELD = {"mooncake": "timestamp", "burstgpt": "Timestamp"}
_UNIT_NS = {"mooncake": NS_PER_S // 1000, "burstgpt": NS_PER_S}
_UNIT = {"mooncake": "ms", "burstgpt": "s"}


def format_of(path: Path, given: str | None) -> str:
    """The trace's format: as given, else by its name (``.csv``: burstgpt, else mooncake)."""
    if given is not None:
        return given
    return "burstgpt" if path.suffix.lower() == ".csv" else "mooncake"


def read_trace(path: Path, fmt: str, where: str) -> TraceTimes:
    """The trace's instants; ``where``: the config field that names it (for messages)."""
    field, unit = _FIELD[fmt], _UNIT[fmt]
    times: array[int] = array("q")
    window: deque[int] = deque()  # the instants within the last second
    busiest = 0
    first: float = 0
    last: float = 0
    last_line = 0
    try:
        with path.open("rb") as fh:
            for lineno, value in _values(fh, fmt, field, where, path):
                if not math.isfinite(value) or value < 0:
                    raise ConfigError(
                        f"{where}: {path}:{lineno}: field {field!r} must be a number >= 0, "
                        f"got {value!r}"
                    )
                if not times:
                    first = value
                elif value < last:
                    raise ConfigError(
                        f"{where}: {path}:{lineno}: field {field!r} goes backwards "
                        f"({value:g} {unit}, below line {last_line}'s {last:g} {unit})"
                    )
                last, last_line = value, lineno
                # from the first record: exact for whole ms (a Mooncake timestamp is ~1.7e12)
                ns = round((value - first) * _UNIT_NS[fmt])
                times.append(ns)
                window.append(ns)
                while window[0] <= ns - NS_PER_S:
                    window.popleft()
                busiest = max(busiest, len(window))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if not times:
        raise ConfigError(f"{where}: {path} holds no records")
    return TraceTimes(times, busiest)


def _values(
    fh: Iterator[bytes], fmt: str, field: str, where: str, path: Path
) -> Iterator[tuple[int, float]]:
    """(line number, timestamp) of each record, in file order."""
    if fmt == "burstgpt":
        yield from _csv_values(fh, field, where, path)
        return
    for lineno, raw in enumerate(fh, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: {path}:{lineno}: not valid UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {path}:{lineno}: not valid JSON ({exc.msg})") from None
        value = obj.get(field) if isinstance(obj, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{where}: {path}:{lineno}: field {field!r} must be a number (ms), "
                f"got {_shown(value)}"
            )
        yield lineno, value


def _csv_values(
    fh: Iterator[bytes], field: str, where: str, path: Path
) -> Iterator[tuple[int, float]]:
    try:
        lines = (raw.decode() for raw in fh)
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None:
            return
        if field not in header:
            raise ConfigError(
                f"{where}: {path}:1: no {field!r} column in the header "
                f"(BurstGPT: Timestamp,Model,Request tokens,Response tokens,...)"
            )
        col = header.index(field)
        for row in reader:
            if not row:
                continue
            lineno = reader.line_num
            try:
                text = row[col].strip()
                value: float = int(text) if text.isdigit() else float(text)
            except (IndexError, ValueError):
                got = _shown(row[col]) if col < len(row) else "nothing"
                raise ConfigError(
                    f"{where}: {path}:{lineno}: field {field!r} must be a number (s), got {got}"
                ) from None
            yield lineno, value
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path}: not valid UTF-8") from None
    except csv.Error as exc:
        raise ConfigError(f"{where}: {path}: not valid CSV ({exc})") from None


def _shown(value: object) -> str:
    """A bad value, short (a record may be large)."""
    text = "nothing" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
