"""A/B of the open-loop sleep: `soakd run` with the runner's timerfd sleep (as shipped) against
the plain asyncio.sleep it replaced (bench/diag_soakd.py DIAG_COARSE=1), interleaved rounds.

    .venv/bin/python bench/ab_dispatch.py --rounds 2 --seconds 15

Per run: dispatch lag from soakd's journal, inter-arrival CV and largest gap at the stub.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import suite  # noqa: E402


def one(variant: str, mode: str, rate: float, seconds: float, rnd: int) -> dict:
    out = suite.WORK / f"ab-{variant}-{mode}{rate:g}-r{rnd}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stub = suite.Stub(out, ttft=suite.TTFT_S, itl=suite.ITL_S, arrivals=True)
    case = suite.Case("soakd", mode, rate=rate, requests=int(rate * seconds))
    suite.soakd_config(case, stub.url, out / "soak.yaml")
    env = suite._env()
    if variant == "asyncio-sleep":
        env["DIAG_COARSE"] = "1"
    try:
        subprocess.run([suite.PY, str(ROOT / "bench" / "diag_soakd.py"), str(out / "diag.json"),
                        "run", str(out / "soak.yaml"), "--no-live", "--run-dir", str(out / "run"),
                        "--metrics-addr", f"127.0.0.1:{suite.free_port()}"], env=env,
                       stdout=open(out / "log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                       preexec_fn=suite._client_nice, timeout=seconds * 4 + 60, check=False)
    finally:
        st = stub.stop()
    con = sqlite3.connect(out / "run" / "journal.db")
    lag = [r[0] / 1e6 for r in con.execute("SELECT lag_ns FROM requests")]
    con.close()
    arr = suite.arrival_stats(st.get("arrivals_ns", []), rate, mode)
    return {"variant": variant, "mode": mode, "rate": rate, "round": rnd,
            "lag_p50": suite.pct(lag, 0.5), "lag_p99": suite.pct(lag, 0.99), "lag_max": max(lag),
            "cv": arr.get("cv"), "gap_max": arr.get("gap_max_ms"), "n": arr.get("n"),
            "stub_late_p99": st.get("late", {}).get("p99_ms"), "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15)
    a = ap.parse_args()
    rows = []
    for rnd in range(a.rounds):
        for mode, rate in (("constant", 200), ("poisson", 200), ("poisson", 1000)):
            for variant in ("asyncio-sleep", "timerfd"):
                r = one(variant, mode, rate, a.seconds, rnd)
                rows.append(r)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in r.items()}), flush=True)
    suite.RESULTS.mkdir(parents=True, exist_ok=True)
    (suite.RESULTS / "ab_dispatch.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
