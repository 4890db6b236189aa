"""Metrics room: soakd's Prometheus families and their names (docs/metrics.md)."""
