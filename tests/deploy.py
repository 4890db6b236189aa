"""Test helpers for the deployment files: docker-compose.yml, the Dockerfile, deploy/.

Used by tests/unit/test_deploy_static.py (the files, checked without Docker),
tests/integration/test_deploy_runtime.py (the image's install steps and the compose
commands, run as plain processes), and tests/docker/ (the sim stack on a real engine).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
CENTRAL_COMPOSE_FILE = ROOT / "deploy" / "central" / "compose.yml"
COMPOSE_FILES = (COMPOSE_FILE, CENTRAL_COMPOSE_FILE)
BUILD_CA_COMPOSE_FILE = ROOT / "docker-compose.build-ca.yml"  # Compose v2 only
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
SYSTEMD_UNIT = ROOT / "deploy" / "soakd.service"
SYSTEMD_ENV_EXAMPLE = ROOT / "deploy" / "soakd.env.example"
SOAKD_COMPOSE_CONFIG = ROOT / "deploy" / "soakd.compose.yaml"
SOAKD_SIM_CONFIG = ROOT / "deploy" / "soakd.sim.yaml"
LITELLM_ENTRYPOINT = ROOT / "deploy" / "litellm-entrypoint.sh"
ALERT_WEBHOOK = ROOT / "deploy" / "alert_webhook.py"
CENTRAL_DIR = ROOT / "deploy" / "central"

PROFILE_SETS = {"gpu": {"gpu"}, "gpu+gpu-metrics": {"gpu", "gpu-metrics"}, "sim": {"sim"}}


# --- compose ----------------------------------------------------------------------------

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; $$ is a literal $.
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def strings(node: Any) -> Iterator[str]:
    """Every string in a YAML tree, keys included (compose interpolates both)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def variables(node: Any) -> set[str]:
    """The names of every ${VAR} that compose interpolates in a file's YAML tree."""
    return {m.group(1) for s in strings(node) for m in _VAR_RE.finditer(s.replace("$$", ""))}


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's interpolation of one string, with ``env`` (defaults where unset)."""
    env = env or {}

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        value = env.get(name)
        missing = not value if op in (":-", ":?") else value is None
        if op and op.endswith("-") and missing:
            return arg or ""
        if op and op.endswith("?") and missing:
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return _VAR_RE.sub(one, text).replace("$$", "$")


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def active(compose: dict[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile ... up` starts (no services named)."""
    return {
        name: svc
        for name, svc in services(compose).items()
        if not svc.get("profiles") or set(svc["profiles"]) & profiles
    }


def hostnames(name: str, svc: dict[str, Any]) -> set[str]:
    """The names a service answers to on the compose network: its name and aliases."""
    names = {name}
    networks = svc.get("networks") or {}
    if isinstance(networks, dict):
        for net in networks.values():
            names.update((net or {}).get("aliases", []))
    return names


def gpu_reserved(svc: dict[str, Any]) -> bool:
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return any(d.get("driver") == "nvidia" or "gpu" in d.get("capabilities", []) for d in devices)


@dataclass(frozen=True)
class BindMount:
    service: str
    source: Path
    target: str


def bind_mounts(compose_file: Path) -> list[BindMount]:
    """Every host path a service mounts (short syntax ./x:/y[:ro] or long syntax)."""
    compose = load_yaml(compose_file)
    mounts = []
    for name, svc in services(compose).items():
        for vol in svc.get("volumes", []):
            if isinstance(vol, str):
                source, _, rest = vol.partition(":")
                target = rest.split(":")[0]
                if not source.startswith((".", "/", "~")):
                    continue  # a named volume
            elif vol.get("type") == "bind":
                source, target = vol["source"], vol["target"]
            else:
                continue
            mounts.append(BindMount(name, (compose_file.parent / source).resolve(), target))
    return mounts


def named_volumes(svc: dict[str, Any]) -> set[str]:
    names = set()
    for vol in svc.get("volumes", []):
        if isinstance(vol, str):
            source = vol.partition(":")[0]
            if not source.startswith((".", "/", "~")):
                names.add(source)
        elif vol.get("type") == "volume":
            names.add(vol["source"])
    return names


def env_example(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """NAME=value lines of an env file (comments and blank lines skipped)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f"{path.name}: not NAME=value: {line!r}"
        values[name.strip()] = value.strip()
    return values


@dataclass(frozen=True)
class ComposeCli:
    """A Docker Compose CLI and its major version: 2 (`docker compose`, the Go rewrite)
    or 1 (`docker-compose` 1.29, Debian 12's package). The compose files must work with
    both; the one difference the tests see is that v1's `config --services` lists every
    service whatever the profiles (use ``services_for_profiles``)."""

    argv: list[str]
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


def _compose_version(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(
            [*argv, "version", "--short"], capture_output=True, text=True, timeout=60
        )
    except OSError:
        return None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", result.stdout)
    return match.group(0) if result.returncode == 0 and match else None


def compose_binary() -> ComposeCli | None:
    """A Docker Compose CLI, v2 or v1 >= 1.28 (profiles), for `config` (which needs no
    engine): $DOCKER_COMPOSE, `docker compose` (the CLI plugin) or `docker-compose`.
    None when there is none; an error naming it when it is older than 1.28."""
    candidates: list[list[str]] = []
    if os.environ.get("DOCKER_COMPOSE"):
        candidates.append(shlex.split(os.environ["DOCKER_COMPOSE"]))
    else:
        docker = shutil.which("docker")
        if docker:
            candidates.append([docker, "compose"])
        standalone = shutil.which("docker-compose")
        if standalone:
            candidates.append([standalone])
    for argv in candidates:
        version = _compose_version(argv)
        if version is None:
            continue
        cli = ComposeCli(argv, version)
        major, minor = (int(x) for x in version.split(".")[:2])
        if (major, minor) < (1, 28):
            raise RuntimeError(
                f"{shlex.join(argv)} is Compose {version}: profiles need 1.28 or later"
            )
        return cli
    return None


def services_for_profiles(
    cli: ComposeCli, rendered: str, listed: str, profiles: set[str]
) -> set[str]:
    """The services `up` starts for ``profiles``: v2's `config --services` output
    (``listed``) already is that; v1 lists every service, so its rendered `config`
    (``rendered``) is filtered by each service's profiles."""
    if cli.major >= 2:
        return set(listed.split())
    return set(active(yaml.safe_load(rendered), profiles))


# --- Dockerfile -------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage))
    return out


def exec_form(args: str) -> list[str]:
    """A JSON-array instruction argument (CMD ["a", "b"]) as a list."""
    import json

    value = json.loads(args)
    assert isinstance(value, list), args
    return [str(v) for v in value]
