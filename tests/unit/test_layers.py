"""The import contract: soakd's rooms stand in layers and import downward only.

Each module may import its own room and the rooms of lower layers, never a room of its
own layer or above. Every import counts, a function's lazy one included (it runs at run
time all the same); only imports under ``if TYPE_CHECKING:`` are left out. docs/
architecture.md draws these layers ("Layers"); a new room must be placed here first.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOAKD = Path(__file__).resolve().parents[2] / "soakd"

LAYERS: tuple[tuple[str, ...], ...] = (
    # the vocabulary: what flows (model), then the words built on it
    ("units", "curves"),
    ("model",),
    ("types", "outcome_record", "shapes", "profiles"),
    # leaves that know no other room
    ("net", "childlog", "logs", "runtime", "lifeline", "framing", "jsondiff"),
    ("spawn",),
    ("config",),
    ("tracing", "measure", "gpu", "http", "checks"),
    ("metrics",),
    ("journal", "sim"),
    ("workload",),
    ("targets",),
    ("probes", "workers", "report"),
    ("gateway",),
    ("run",),
    ("capacity",),
    ("cli_check",),
    ("cli",),
    ("__main__",),
)
"""Bottom first. A room is a package of soakd/ or one of its top-level modules."""

LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def room(module: str) -> str:
    """``soakd.journal.store`` -> ``journal``; ``soakd.model`` -> ``model``."""
    return module.split(".")[1]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST) -> list[tuple[str, int]]:
    """Every ``soakd.*`` module ``tree`` imports at run time, with its line."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "soakd":  # from soakd import shapes: the module named
                found.extend((f"soakd.{a.name}", node.lineno) for a in node.names)
            else:
                found.append((node.module, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(m, line) for m, line in found if m.startswith("soakd.")]


def rooms_on_disk() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in SOAKD.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and any(p.glob("*.py")))
    }


def test_every_room_has_a_layer() -> None:
    assert rooms_on_disk() - set(LAYER) == set(), "place the new room in LAYERS"
    assert set(LAYER) - rooms_on_disk() == set(), "a room in LAYERS is gone"


def test_rooms_import_downward_only() -> None:
    wrong = []
    for path in sorted(SOAKD.rglob("*.py")):
        rel = path.relative_to(SOAKD.parent)
        here = rel.parts[1].removesuffix(".py")
        if here == "__init__.py" or here == "__init__":
            continue
        for module, line in imports(ast.parse(path.read_text(), str(path))):
            there = room(module)
            if there == here or there not in LAYER:
                continue
            if LAYER[there] >= LAYER[here]:
                wrong.append(f"{rel}:{line}: {here} (layer {LAYER[here]}) imports {module}")
    assert not wrong, "imports that do not point down:\n" + "\n".join(wrong)


def test_the_contract_sees_a_wrong_import() -> None:
    """The checker itself: an upward import and a lazy one are found, TYPE_CHECKING's not."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from soakd.run import app\n"
        "if TYPE_CHECKING:\n    from soakd.cli import main\n"
        "def f():\n    import soakd.gateway.proxy\n"
    )
    assert [m for m, _ in imports(ast.parse(src))] == ["soakd.run", "soakd.gateway.proxy"]
