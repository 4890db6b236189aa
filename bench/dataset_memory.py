"""What a large dataset file costs a process: a ShareGPT array, a Mooncake trace and a
BurstGPT CSV of about --mb MB each, written to --dir, then each read as its prompt source in
a fresh process: the index's size, the resident memory after the first pass and after
building 2,000 prompts spread over the file, the peak, and the first pass's time.

    .venv/bin/python bench/dataset_memory.py --mb 200 --dir .cache/bench/datasets
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

MEASURE = """
import resource, sys, time
from soakd.config import Workload
from soakd.workload.prompts import make_prompt_source

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

source, path = sys.argv[1], sys.argv[2]
base = rss()
t = time.monotonic()
s = make_prompt_source(Workload.model_validate({"prompts": {"source": source, "file": path}}))
took = time.monotonic() - t
after = rss()
for q in range(2000):
    s.spec_fields(q * 37)
used = rss()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(
    f"{source}: {len(s):,} records, index {s.index_bytes / 1e6:.1f} MB; resident {base:.0f} MB "
    f"before, {after:.0f} MB after the first pass, {used:.0f} MB after 2000 prompts, peak "
    f"{peak:.0f} MB; first pass {took:.1f} s"
)
"""


def write_files(folder: Path, size: int) -> dict[str, Path]:
    r = random.Random(1)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "sharegpt": folder / "big.json",
        "mooncake": folder / "big.jsonl",
        "burstgpt": folder / "big.csv",
    }
    with paths["sharegpt"].open("w") as f:
        f.write("[")
        written = i = 0
        while written < size:
            turns = [
                {"from": "human", "value": "question " * r.randint(20, 400)},
                {"from": "gpt", "value": "answer ü " * r.randint(20, 400)},
            ]
            text = ("," if i else "") + json.dumps({"id": str(i), "conversations": turns})
            written += f.write(text)
            i += 1
        f.write("]")
    with paths["mooncake"].open("w") as f:
        written = i = 0
        while written < size:
            ids = [r.randint(0, 10**6) for _ in range(r.randint(1, 60))]
            rec = {"timestamp": i, "input_length": 512 * len(ids) - 3, "output_length": 30}
            written += f.write(json.dumps({**rec, "hash_ids": ids}) + "\n")
            i += 1
    with paths["burstgpt"].open("w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        written = i = 0
        while written < size:
            a, b = r.randint(1, 4000), r.randint(0, 800)
            written += f.write(f"{i * 0.1:.1f},ChatGPT,{a},{b},{a + b},Conversation log\n")
            i += 1
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--dir", type=Path, default=Path(".cache/bench/datasets"))
    args = ap.parse_args()
    for source, path in write_files(args.dir, args.mb * 1_000_000).items():
        subprocess.run([sys.executable, "-c", MEASURE, source, str(path)], check=True)


if __name__ == "__main__":
    main()
