"""docs/architecture.md against the tree: it names no file that is gone, every module of
soakd/ is named there, and its Layers table is the one tests/unit/test_layers.py holds."""

from __future__ import annotations

import re

from tests.unit.test_layers import LAYERS, SOAKD

DOC = SOAKD.parent / "docs" / "architecture.md"


def test_every_path_it_names_exists() -> None:
    text = DOC.read_text()
    named = set(re.findall(r"soakd/[A-Za-z0-9_/]*[A-Za-z0-9_](?:\.py)?/?", text))
    gone = sorted(p for p in named if not (SOAKD.parent / p).exists())
    assert not gone, f"docs/architecture.md names what the tree lacks: {gone}"


def test_every_module_is_named() -> None:
    """Each module, by its path or, in its package's row or table, by its name."""
    text = DOC.read_text()
    unnamed = []
    for path in sorted(SOAKD.rglob("*.py")):
        rel = path.relative_to(SOAKD.parent).as_posix()
        names = (rel, f"`{path.name}`", f"`{path.stem}`", f"{path.name} ")
        if path.name == "__init__.py" or any(n in text for n in names):
            continue
        unnamed.append(rel)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def test_the_layers_table_is_the_contracts() -> None:
    section = DOC.read_text().split("### Layers", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| *(\d+) *\| ([^|]+)\|", section, re.M)
    drawn = [tuple(re.findall(r"`([a-z_]+)`", rooms)) for _, rooms in rows]
    assert drawn == [tuple(layer) for layer in LAYERS]
