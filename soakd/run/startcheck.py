"""Start check room: what a config needs beyond its own fields before a run may start.

The config model checks each value; some things it names live elsewhere: key files and
variables, CA files, the exporter's certificate and password, the prompt file, the proxy
the environment names, the OOM log (a file, or none yet; never a directory); and the plan's
longest request against a context the config gives (``targets[].max_model_len``). ``soakd
run`` reads them all before it touches a run dir, and ``soakd check`` calls the same
function, so the two never disagree, and a problem is the same line in both (a run that
failed after its journal opened would be "resumed" by the next try).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from soakd.config import Config, ConfigError, TargetConfig
from soakd.workload.fits import Longest, check_fits, longest_request
from soakd.workload.prompts import make_prompt_source


def check_start(cfg: Config) -> Longest | None:
    """Every file and variable the run reads at start, read now; ConfigError listing
    every problem (one line each, naming the field). Returns the plan's longest request
    (None: its prompts could not be made), for the run to hold against the contexts its
    targets' models lists say."""
    problems: list[str] = []
    for target in cfg.targets:
        # (a default TLS context cannot fail, and loading the system store costs 30-100 ms
        # a target: only a CA file the target names is loaded here)
        steps: list[Callable[[], object]] = [target.api_key, partial(_env_proxy, target)]
        if target.tls.ca_file is not None:
            steps.insert(1, target.ssl_context)
        for step in steps:
            try:
                step()
            except ConfigError as exc:
                problems += exc.problems
        if target.oom_log is not None and target.oom_log.is_dir():  # may not exist yet
            problems.append(f"targets[{target.name}].oom_log: {target.oom_log} is a directory")
    exporter = cfg.exporter
    try:
        if exporter.basic_auth is not None:
            exporter.basic_auth.password()
        if exporter.tls is not None:
            exporter.tls.context()
    except ConfigError as exc:
        problems += exc.problems
    longest = None
    try:
        longest = longest_request(cfg.workload, make_prompt_source(cfg.workload))
        check_fits(cfg, longest, {})  # read and parsed as the run will; the configs' contexts
    except ConfigError as exc:
        problems += exc.problems
    if cfg.checks is not None and cfg.checks.file is not None:
        from soakd.checks.expect import read_checks

        try:
            read_checks(cfg.checks.file)  # read and parsed as the run will
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError.of(problems)
    return longest


def _env_proxy(target: TargetConfig) -> None:
    """The proxy HTTP(S)_PROXY names for the target (when it sets none), as the client
    will read it: a malformed one stops the start, not every request. (Its value is not
    shown: it may carry a password.)"""
    if target.proxy is not None or target.simulator:
        return
    why = _proxy_problem(target.endpoint)
    if why is not None:
        raise ConfigError(
            f"targets[{target.name}]: the proxy the environment names for it "
            f"(HTTP_PROXY, HTTPS_PROXY) cannot be used: {why}"
        )


def _proxy_problem(endpoint: str) -> str | None:
    try:
        proxy, _ = get_env_proxy_for_url(URL(endpoint))
        port = proxy.port
    except LookupError:
        return None  # none applies
    except ValueError as exc:
        return str(exc)
    if proxy.scheme not in ("http", "https") or not proxy.host:
        return "not an http(s) URL with a host"
    if not port or not 1 <= port <= 65535:
        return f"port {port}"
    return None
