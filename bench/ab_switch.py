"""A/B of `soakd run`'s GIL switch interval: 0.5 ms (as shipped, soakd/runtime.py GIL_SWITCH_S)
against Python's default 5 ms, interleaved rounds, through bench/suite.py's run_case (CPU of
the process tree, TTFT/ITL error from the journal).

    .venv/bin/python bench/ab_switch.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import suite  # noqa: E402

_command = suite.command
_env = suite._env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for conc, n in ((64, 6000), (8, 1500)):
        for rnd in range(a.rounds):
            for variant, switch in (("5 ms (default)", "0.005"), ("0.5 ms", "")):

                def command(case, url, out, switch=switch):  # type: ignore[no-untyped-def]
                    argv, stop = _command(case, url, out)
                    return [suite.PY, str(ROOT / "bench" / "diag_soakd.py"),
                            str(out / "diag.json"), *argv[1:]], stop

                def env(switch=switch):  # type: ignore[no-untyped-def]
                    e = _env() | {"DIAG_QUIET": "1"}
                    if switch:
                        e["DIAG_SWITCH"] = switch
                    return e

                suite.command, suite._env = command, env
                case = suite.Case("soakd", "closed", concurrency=conc, requests=n, rep=rnd,
                                  extra={"switch": variant})
                r = suite.run_case(case)
                rows.append({"variant": variant, "streams": conc, "round": rnd,
                             "cpu_ms_per_req": r.get("cpu_ms_per_req"),
                             "ttft_err": r["ttft_err"], "itl_err": r["itl_err"],
                             "stub_late_p99": r["stub"].get("late", {}).get("p99_ms")})
    suite.command, suite._env = _command, _env
    (suite.RESULTS / "ab_switch.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
