"""A minimal Alertmanager webhook receiver: one JSON line per alert on stdout.

deploy/alertmanager.yml sends every notification to ``http://alert-webhook:5001/alerts``;
in docker compose this script is that service (run with the soakd image's Python, no
dependencies), so ``docker compose logs -f alert-webhook`` shows each page as it goes
out. Replace it with a real receiver (chat, incident tool) in alertmanager.yml.

    python deploy/alert_webhook.py --host 0.0.0.0 --port 5001
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

MAX_BODY = 1 << 20


def alert_lines(payload: dict) -> list[str]:  # type: ignore[type-arg]
    """Alertmanager's webhook payload -> one compact JSON line per alert."""
    lines = []
    for alert in payload.get("alerts", []):
        labels = alert.get("labels", {})
        annotations = alert.get("annotations", {})
        lines.append(
            json.dumps(
                {
                    "status": alert.get("status", payload.get("status")),
                    "alertname": labels.get("alertname"),
                    "severity": labels.get("severity"),
                    "node": labels.get("node"),
                    "site": labels.get("site"),
                    "target": labels.get("target"),
                    "summary": annotations.get("summary"),
                    "starts_at": alert.get("startsAt"),
                    "receiver": payload.get("receiver"),
                },
                separators=(",", ":"),
            )
        )
    return lines


class Handler(BaseHTTPRequestHandler):
    server_version = "soakd-alert-webhook"

    def do_GET(self) -> None:
        self._reply(200, b"ok\n")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            self._reply(400, b"bad length\n")
            return
        try:
            payload = json.loads(self.rfile.read(length))
        except ValueError:
            self._reply(400, b"not JSON\n")
            return
        for line in alert_lines(payload if isinstance(payload, dict) else {}):
            print(line, flush=True)
        self._reply(200, b"ok\n")

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the alert lines are the log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Handler)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    print(json.dumps({"event": "listening", "url": f"http://{host}:{port}/alerts"}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
