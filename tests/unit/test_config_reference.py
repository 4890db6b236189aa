"""docs/config.md is what scripts/config_reference.py writes from the config models: a key
added, renamed or given another default without regenerating it fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from soakd.config import Config, GatewayConfig

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    """scripts/config_reference.py, imported from its path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "soakd_config_reference", ROOT / "scripts" / "config_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_up_to_date() -> None:
    text = generator().build()
    on_disk = (ROOT / "docs" / "config.md").read_text()
    assert on_disk == text, "docs/config.md is stale: run python scripts/config_reference.py"


def test_every_key_of_every_section_is_in_it() -> None:
    """Each model reachable from the run's config (and a stand-alone gateway's) has a
    section listing each of its keys."""
    models_in = generator()._models_in
    text = (ROOT / "docs" / "config.md").read_text()
    sections = dict(re.findall(r"### (\w+)\n(.*?)(?=\n### |\n## |\Z)", text, re.S))
    seen: set[type] = set()

    def walk(model: type) -> None:
        if model in seen:
            return
        seen.add(model)
        body = sections.get(model.__name__)
        assert body is not None, f"no section for {model.__name__}"
        for name, info in model.model_fields.items():
            assert f"| `{name}` |" in body, f"{model.__name__}.{name}"
            for sub, _ in models_in(info.rebuild_annotation()):
                walk(sub)

    walk(Config)
    walk(GatewayConfig)
    assert len(seen) > 20
    # a few rows as a user reads them: type, default, meaning from the source's comment
    assert (
        "| `drain_timeout` | duration | `30s` | On stop: how long requests in flight may finish |"
        in text
    )
    assert "| `server_error_ratio` | number (≥ 0, ≤ 1), or null | not set |" in text
    assert "| `max_regression` | map of name to `N%` (relative), or a number or duration" in text
