"""soakd/net.py: one HOST:PORT rule, one TLS rule, the same answer wherever they are used."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from soakd.cli import build_parser
from soakd.config import ConfigError, config_from_dict
from soakd.metrics.run import ProbeMetrics
from soakd.net import TlsFileError, client_ssl, parse_host_port
from soakd.probes import make_probes


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:8080", ("::1", 8080)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_host_port(text: str, want: tuple[str, int]) -> None:
    assert parse_host_port(text) == want


@pytest.mark.parametrize(
    "text", ["", "9464", ":9464", "host:", "host:port", "host:65536", "host:-1"]
)
def test_bad_host_port_is_the_same_error_in_config_and_cli(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_host_port(text)
    with pytest.raises(ConfigError, match=r"exporter\.listen: expected HOST:PORT"):
        config_from_dict(
            {
                "targets": [{"name": "t", "simulator": "fast"}],
                "phases": [{"name": "p", "duration": "1s"}],
                "exporter": {"listen": text},
            }
        )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "x.yaml", "--metrics-addr", text])


def test_tls_settings() -> None:
    assert client_ssl(False, None) is False
    assert isinstance(client_ssl(True, None), ssl.SSLContext)


def bad_ca_config(tmp_path: Path) -> dict[str, object]:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    return {
        "targets": [
            {"name": "edge", "base_url": "https://127.0.0.1:1", "tls": {"ca_file": str(bad)}}
        ],
        "phases": [{"name": "p", "duration": "1s"}],
    }


def test_a_bad_ca_file_is_a_config_error_for_the_probes_too(tmp_path: Path) -> None:
    cfg = config_from_dict(bad_ca_config(tmp_path))
    with pytest.raises(TlsFileError, match="cannot load"):
        client_ssl(True, cfg.targets[0].tls.ca_file)
    # the probes used to fall back to the default trust store without a word
    with pytest.raises(ConfigError, match=r"^targets\[edge\]\.tls\.ca_file: cannot load "):
        make_probes(
            cfg, ProbeMetrics(CollectorRegistry()), {"edge": "https://127.0.0.1:1"}, lambda s: None
        )


def test_a_missing_ca_file_names_the_field(tmp_path: Path) -> None:
    raw = bad_ca_config(tmp_path)
    raw["targets"][0]["tls"]["ca_file"] = str(tmp_path / "gone.pem")  # type: ignore[index]
    cfg = config_from_dict(raw)
    with pytest.raises(ConfigError, match=r"targets\[edge\]\.tls\.ca_file: cannot load .*gone"):
        cfg.targets[0].ssl_context()
