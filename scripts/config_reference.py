"""Write docs/config.md, the config reference, from the pydantic models in soakd/config/.

``python scripts/config_reference.py`` writes it; ``--check`` exits 1 when the committed
file differs from what the models give (tests/unit/test_config_reference.py runs it), so
the reference cannot drift from the code. Every key, its type, its default and its
meaning: the meaning is the model's docstring and the comment written beside (or just
above) the field in the source, so a field is documented where it is defined.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.md"
sys.path.insert(0, str(ROOT))

from soakd.config import Config, GatewayConfig, format_duration  # noqa: E402

HEAD = """# Config reference

Generated from the models in `soakd/config/` by `python scripts/config_reference.py`;
do not edit by hand (`tests/unit/test_config_reference.py` fails when it is stale).

A config is YAML. Every section is strict: a key not listed here is an error, with a
"did you mean". Durations are written `72h`, `1h30m`, `500ms` or a number of seconds;
sizes `3.9GB` (decimal), `512MiB` (binary) or a number of bytes. Any key can be set from
the environment: `SOAKD__SECTION__KEY=value`, list items by index or name
(`SOAKD__TARGETS__LOCAL__BASE_URL`). `soakd check FILE` validates a file and prints the
plan. What the values mean in depth: README.md, docs/slo.md (slo, compare, costs),
docs/journal.md, docs/gateway.md, docs/alerting.md.
"""


# --- what the source says about a field -------------------------------------------------------


def field_notes(model: type[BaseModel]) -> dict[str, str]:
    """Per field: the comment on its line(s) or the comment lines just above it, or the
    string just below it (an attribute docstring)."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    notes: dict[str, str] = {}
    body = cls.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        trailing = [
            line.split("  # ", 1)[1].strip()
            for line in lines[stmt.lineno - 1 : stmt.end_lineno]
            if "  # " in line
        ]
        above = []
        j = stmt.lineno - 2
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        after = body[i + 1] if i + 1 < len(body) else None
        doc = ""
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            doc = " ".join(after.value.value.split())
        text = " ".join([*above, *trailing, doc]).strip()
        if text:
            notes[name] = _clean(text)
    return notes


def _clean(text: str) -> str:
    text = text.replace("|", "\\|").replace("``", "`")
    return text[0].upper() + text[1:] if text else text


# --- types and defaults -------------------------------------------------------------------------


SPECIAL = {"_regression": "`N%` (relative), or a number or duration (absolute)"}
"""Value types whose validator says more than their base type (by the validator's name)."""


def _validator_kind(meta: list[Any]) -> str | None:
    for m in meta:
        if isinstance(m, BeforeValidator) and getattr(m.func, "__name__", "") in SPECIAL:
            return SPECIAL[m.func.__name__]
        if isinstance(m, BeforeValidator):
            names = set(getattr(m.func, "__code__", types.SimpleNamespace(co_names=())).co_names)
            names.add(getattr(m.func, "__name__", ""))
            if "parse_duration" in names:
                return "duration"
            if "parse_bytes" in names:
                return "size"
    return None


def _bounds(meta: list[Any]) -> str:
    out = []
    for m in meta:
        items = m.metadata if isinstance(m, FieldInfo) else [m]
        for c in items:
            for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
                if isinstance(c, getattr(annotated_types, attr.capitalize())):
                    bound = getattr(c, attr)  # an integer whole (1,048,576, not 1.04858e+06)
                    out.append(
                        f"{sign} {bound:,}" if float(bound).is_integer() else f"{sign} {bound:g}"
                    )
            if isinstance(c, annotated_types.MinLen) and c.min_length:
                out.append(f"at least {c.min_length}")
    return ", ".join(out)


def type_text(annotation: Any, models: list[type[BaseModel]]) -> str:
    """A field's type in words; a model inside it is queued in ``models`` (documented
    below, linked)."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        base, *meta = get_args(annotation)
        kind = _validator_kind(meta) or type_text(base, models)
        bounds = _bounds(meta)
        return f"{kind} ({bounds})" if bounds and kind not in ("duration", "size") else kind
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        text = " or ".join(type_text(a, models) for a in args)
        return text + (", or null" if len(args) < len(get_args(annotation)) else "")
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in get_args(annotation))
    if origin is list:
        return "list of " + type_text(get_args(annotation)[0], models)
    if origin is dict:
        return "map of name to " + type_text(get_args(annotation)[1], models)
    if origin is tuple:
        return "(" + ", ".join(type_text(a, models) for a in get_args(annotation)) + ")"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in models:
            models.append(annotation)
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    names = {bool: "boolean", int: "integer", float: "number", str: "text", Path: "path"}
    if annotation in names:
        return names[annotation]
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo, kind: str) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        factory = info.default_factory
        if factory in (list, dict):
            return "empty"
        return "computed (see meaning)"
    value = info.default
    if value is None:
        return "not set"
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if kind.startswith("duration") and isinstance(value, int | float):
        return f"`{format_duration(value)}`"
    if kind.startswith("size") and isinstance(value, int | float):
        return f"`{_size(value)}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value}`"


def _size(value: float) -> str:
    """As it would be written: binary units for a power-of-two multiple, else decimal."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def _first_sentence(model: type[BaseModel]) -> str:
    doc = " ".join(inspect.cleandoc(model.__dict__.get("__doc__") or "").split())
    return doc.split(". ")[0].rstrip(".") + "." if doc else ""


# --- the document -----------------------------------------------------------------------------


def model_section(
    model: type[BaseModel], where: list[str], models: list[type[BaseModel]]
) -> list[str]:
    doc = _clean(inspect.cleandoc(model.__dict__.get("__doc__") or ""))  # its own
    out = [f"### {model.__name__}", "", "Where: " + ", ".join(f"`{w}`" for w in where) + ".", ""]
    if doc:
        out += [" ".join(doc.split()), ""]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    notes = field_notes(model)
    for name, info in model.model_fields.items():
        annotation = info.rebuild_annotation()
        kind = type_text(annotation, models)
        note = notes.get(name) or next(
            (_clean(_first_sentence(m)) for m, _ in _models_in(annotation) if m.__doc__), ""
        )
        out.append(f"| `{name}` | {kind} | {default_text(info, kind)} | {note} |")
    return out


def _paths(root: type[BaseModel]) -> dict[type[BaseModel], list[str]]:
    """Where each model appears, as key paths (``targets[].timeouts``)."""
    found: dict[type[BaseModel], list[str]] = {}

    def walk(model: type[BaseModel], path: str, seen: tuple[type[BaseModel], ...]) -> None:
        for name, info in model.model_fields.items():
            for sub, suffix in _models_in(info.rebuild_annotation()):
                key = f"{path}.{name}{suffix}" if path else f"{name}{suffix}"
                found.setdefault(sub, []).append(key)
                if sub not in seen:
                    walk(sub, key, (*seen, sub))

    walk(root, "", (root,))
    return found


def _models_in(annotation: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, suffix)]
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is list:
        return _models_in(args[0], suffix + "[]")
    if origin is dict:
        return _models_in(args[1], suffix + ".<name>")
    out: list[tuple[type[BaseModel], str]] = []
    for a in args:
        out += _models_in(a, suffix)
    return out


def part(root: type[BaseModel], title: str, intro: str, done: set[type[BaseModel]]) -> list[str]:
    """A config file's models, each once: those another part documented already are
    linked to, not repeated."""
    out = ["", f"## {title}", "", intro, ""]
    models: list[type[BaseModel]] = []
    out += model_section(root, ["the file's top level"], models)
    paths = _paths(root)
    done.add(root)
    while models:
        model = models.pop(0)
        if model in done:
            continue
        done.add(model)
        out += ["", *model_section(model, paths.get(model, ["?"]), models)]
    return out


def build() -> str:
    lines = HEAD.splitlines()
    done: set[type[BaseModel]] = set()
    lines += part(
        Config,
        "`soakd run` and `soakd check`: the run's config",
        "The file `soakd run FILE` and `soakd check FILE` read (examples/demo.yaml, "
        "examples/edge-72h.yaml). `soakd report --config FILE` reads only its `slo`, "
        "`compare`, `report` and `targets[].name`, `.slo`, `.cost` (docs/slo.md).",
        done,
    )
    lines += part(
        GatewayConfig,
        "`soakd gateway --config FILE`: a stand-alone gateway",
        "The guard gateway run on its own (docs/gateway.md); a gateway soakd starts for "
        "a target is configured by `targets[].gateway` above instead.",
        done,
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is stale")
    args = ap.parse_args()
    text = build()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/config_reference.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
