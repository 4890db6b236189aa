# device-only diagnostic: per process, time every GC pass by generation; optional thresholds
import atexit, gc, json, os, sys, time
out = os.environ.get("GCDIAG_OUT")
if out and "soakd" in " ".join(sys.argv) or (out and sys.argv and sys.argv[0] == "-m"):
    pass
if out:
    t2 = os.environ.get("GCDIAG_T")
    if t2:
        gc.set_threshold(*map(int, t2.split(",")))
        _set = gc.set_threshold
        gc.set_threshold = lambda *a: None
    _p = {0: [], 1: [], 2: []}
    _s = [0]
    def _cb(phase, info):
        if phase == "start":
            _s[0] = time.perf_counter_ns()
        else:
            _p[info["generation"]].append((time.perf_counter_ns() - _s[0]) / 1e6)
    gc.callbacks.append(_cb)
    def _dump():
        if not _p[0]:
            return
        doc = {"argv": sys.argv[:3], "thresholds": gc.get_threshold()}
        for g, v in _p.items():
            v = sorted(v)
            doc[f"gen{g}"] = {"n": len(v), "total_ms": round(sum(v), 1), "max_ms": round(v[-1], 2) if v else 0,
                              "p50_ms": round(v[len(v)//2], 3) if v else 0}
        os.makedirs(out, exist_ok=True)
        with open(f"{out}/gc-{os.getpid()}.json", "w") as f:
            json.dump(doc, f)
    atexit.register(_dump)
