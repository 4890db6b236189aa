"""Small dataset files in each source's format, written by the tests (no download)."""

from __future__ import annotations

import json
import random
from pathlib import Path


def sharegpt(path: Path, n: int = 12, seed: int = 1) -> Path:
    """A ShareGPT array: each conversation a system prompt, then two human turns each
    answered by gpt; the first answer of conversation i is 4 * (10 + 3 i) characters."""
    r = random.Random(seed)
    items = []
    for i in range(n):
        question = " ".join(r.choice(("the", "sea", "sky", "red", "big")) for _ in range(20 + i))
        items.append(
            {
                "id": f"c{i}",
                "conversations": [
                    {"from": "system", "value": "You answer briefly."},
                    {"from": "human", "value": question},
                    {"from": "gpt", "value": "abcd" * (10 + 3 * i)},
                    {"from": "human", "value": "and then?"},
                    {"from": "gpt", "value": "wxyz" * 7},
                ],
            }
        )
    path.write_text(json.dumps(items, indent=1))
    return path


def mooncake(path: Path, n: int = 12, seed: int = 1) -> Path:
    """A Mooncake trace: every request opens with blocks 0 and 1 (a shared 1024-token
    prefix), then blocks of its own; the last block is cut."""
    r = random.Random(seed)
    lines = []
    for i in range(n):
        ids = [0, 1, *(1000 + 10 * i + j for j in range(r.randint(0, 2)))]
        n_in = 512 * (len(ids) - 1) + r.randint(16, 512)
        rec = {"timestamp": 250 * i, "input_length": n_in, "output_length": 8 + i, "hash_ids": ids}
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def burstgpt(path: Path, n: int = 12, seed: int = 1, failed: int = 2) -> Path:
    """A BurstGPT CSV of ``n`` answered requests and ``failed`` with no response tokens."""
    r = random.Random(seed)
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(n + failed):
        req = r.randint(20, 300)
        resp = 0 if i < failed else 5 + i
        rows.append(f"{i * 0.5},ChatGPT,{req},{resp},{req + resp},Conversation log")
    path.write_text("\n".join(rows) + "\n")
    return path
