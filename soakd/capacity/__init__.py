"""Capacity room: ``soakd capacity``, each target's knee found by a bounded search
(docs/capacity.md): ``search`` (pure: which load next, is the queue steady), ``step`` (one
load run and judged), ``sweep`` (the servers, the clients, every target in turn),
``result`` (the knee and the curve: JSON, the table), ``command`` (the CLI's body)."""
