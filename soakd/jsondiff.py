"""Documents room: where two JSON documents differ, the one walk a resume's config check
(soakd/journal/resume.py) and a fleet report's plan check (soakd/report/fleet.py) share.

Pure: the documents are what ``json.loads`` gives (dicts, lists, scalars).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Difference:
    """One place two documents differ: its dotted path (``targets[alpha].slo.ttft_p99``;
    "" for the documents themselves) and each one's value there (None: absent). Two lists
    of different lengths differ as wholes."""

    path: str
    a: object
    b: object


def differences(
    a: object, b: object, *, skip: Collection[str] = (), sort_keys: bool = False
) -> Iterator[Difference]:
    """Where ``a`` and ``b`` differ, depth first. Objects key by key: ``a``'s keys in
    their order, then the others of ``b`` (``sort_keys``: all of them sorted); lists of one
    length item by item, an item named by its ``name`` where it has one, else by its index;
    anything else compared whole. ``skip``: dotted paths not compared."""
    yield from _walk(a, b, "", frozenset(skip), sort_keys)


def _walk(
    a: object, b: object, path: str, skip: frozenset[str], sort_keys: bool
) -> Iterator[Difference]:
    if path in skip:
        return
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = list(a) + [k for k in b if k not in a]
        for key in sorted(keys) if sort_keys else keys:
            yield from _walk(
                a.get(key), b.get(key), f"{path}.{key}" if path else key, skip, sort_keys
            )
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            name = x.get("name") if isinstance(x, Mapping) else None
            yield from _walk(x, y, f"{path}[{name or i}]", skip, sort_keys)
        return
    if a != b:
        yield Difference(path, a, b)
