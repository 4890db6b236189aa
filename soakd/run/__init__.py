"""Run room: one ``soakd run`` from its directory and journal to its live view and status."""
