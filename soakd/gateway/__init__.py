"""Gateway room: ``soakd gateway``, the guard in front of a model server (docs/gateway.md).

A reverse proxy that streams answers through unbuffered and sheds load before the server
falls over: a VRAM circuit breaker (429 + Retry-After), an error-rate breaker (503), and a
concurrency limit that can adapt to the upstream's latency (AIMD), with a bounded queue.
"""

from soakd.gateway.server import GatewayServer, run_gateway, start_gateway

__all__ = ["GatewayServer", "run_gateway", "start_gateway"]
