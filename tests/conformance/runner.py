"""Compare CPython's asyncio test suite on the stock loop vs asyncio_relaxed.Loop.

    cd /work/main && python -m tests.conformance.runner [--python PATH ...]
        [--modes stock,eager,deferred] [--modules test_events ...] [--jobs 2]
        [--timeout 900] [--json out.json] [--logdir DIR]

One swap.py process per (python, module, mode).  Exit status is 0 only if every
relaxed run matches stock (passed, skipped, failed+errors) and created loops.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWAP = os.path.join(ROOT, "tests", "conformance", "swap.py")
MARKER = "CONFORMANCE_RESULT "
MODULES = ["test_events", "test_sock_lowlevel", "test_sendfile", "test_server", "test_streams",
           "test_base_events", "test_sslproto", "test_unix_events", "test_subprocess",
           "test_tasks", "test_buffered_proto", "test_runners"]
# Measured stock wall seconds on a 2-core box (the rest take <= 4 s);
# only used to start the slow runs first.
COST = {"test_tasks": 16, "test_subprocess": 15, "test_events": 8, "test_sslproto": 5}
# (python minor, module) pairs whose tests build every loop by hand (BaseEventLoop mocks),
# so zero swapped loops is expected there and not a swap failure.
ZERO_LOOPS_OK = {("3.10", "test_runners"), ("3.11", "test_runners"), ("3.12", "test_runners")}
Key = tuple[str, str, str]  # (python path, module, mode)


def probe(python: str) -> tuple[str | None, list[str]]:
    """Return (version, modules present) or (None, [reason])."""
    code = ("import os,platform,test.test_asyncio as t;"
            "print(platform.python_version());print(*os.listdir(os.path.dirname(t.__file__)))")
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return None, [str(exc)]
    if p.returncode:
        return None, [(p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]]
    version, files = p.stdout.splitlines()[:2]
    return version, [f[:-3] for f in files.split() if f.endswith(".py")]


def run_one(python: str, module: str, mode: str, timeout: float, logdir: str,
            tests: list[str] | None = None, tag: str = "") -> dict:
    env = dict(os.environ)  # PYTHONASYNCIODEBUG / PYTHONWARNINGS pass through untouched
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.pop("ASYNCIO_RELAXED_WRITE", None)
    if mode != "stock":
        env["ASYNCIO_RELAXED_WRITE"] = mode
    cmd = [python, SWAP, module, "--mode", "stock" if mode == "stock" else "relaxed",
           "--timeout", str(max(timeout - 10, 1))]  # faulthandler fires first: tracebacks in log
    if tests:
        cmd += ["--tests", *tests]
    log = os.path.join(logdir, f"{os.path.basename(os.path.dirname(os.path.dirname(python)))}"
                               f"-{module}-{mode}{tag}.log")
    start = time.monotonic()
    with open(log, "w") as fh:
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=fh,
                               text=True, timeout=timeout)
            out, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as exc:
            out, rc = (exc.stdout or b"").decode(errors="replace"), "timeout"
        fh.write(out)
    lines = [ln for ln in out.splitlines() if ln.startswith(MARKER)]
    if lines:
        res = json.loads(lines[-1][len(MARKER):])
    else:  # name the test that was running: verbose unittest prints "name (id) ... " first
        with open(log, errors="replace") as fh:
            started = [ln.split(" ... ")[0] for ln in fh if " ... " in ln]
        res = {"error": f"no result (rc={rc}, last test: {started[-1] if started else '-'})"}
    res.update(wall=round(time.monotonic() - start, 1), log=log)
    return res


def outcome(res: dict) -> tuple | None:
    return None if res.get("error") else (res["passed"], res["skipped"], len(res["bad"]))


def resolve(py: str, mod: str, mode: str, res: dict, timeout: float, logdir: str) -> list[str]:
    """Rerun tests whose outcome differs once in both modes; return confirmed regressions."""
    stock, rel = res[(py, mod, "stock")], res[(py, mod, mode)]
    diff = sorted(set(stock["bad"]) ^ set(rel["bad"]))
    rerun = [t for t in diff if " " not in t]  # "setUpClass (x.Y)" holders are not loadable
    if rerun:
        again = {m: run_one(py, mod, m, timeout, logdir, rerun, "-rerun") for m in ("stock", mode)}
        if any(a.get("error") for a in again.values()):
            return diff
        s2, r2 = set(again["stock"]["bad"]), set(again[mode]["bad"])
        # Flaky = outcome changed between runs in either mode; only stable differences count.
        stable = [t for t in rerun if (t in stock["bad"]) == (t in s2)
                  and (t in rel["bad"]) == (t in r2)]
        diff = [t for t in diff if t not in rerun] + stable
    rel["confirmed_diff"] = diff
    return [t for t in diff if t in rel["bad"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", help="interpreter path (repeatable)")
    ap.add_argument("--modes", default="stock,eager,deferred")
    ap.add_argument("--modules", nargs="+", default=MODULES)
    ap.add_argument("--jobs", type=int, default=2)
    # Slowest stock module takes ~16 s; 120 s caps the cost of a relaxed-loop hang.
    ap.add_argument("--timeout", type=float, default=120, help="per-process seconds")
    ap.add_argument("--json", help="save all results here")
    ap.add_argument("--logdir", help="per-run logs (default: a new temp dir)")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    logdir = a.logdir or tempfile.mkdtemp(prefix="conformance-")
    os.makedirs(logdir, exist_ok=True)
    pythons = a.python or sorted(glob.glob("/root/.pyenv/versions/3.1[0-3].*/bin/python"),
                                 key=lambda p: [int(x) for x in p.split("/")[-3].split(".")])
    pythons = pythons or [sys.executable]

    versions: dict[str, str] = {}
    jobs: list[Key] = []
    for py in pythons:
        version, present = probe(py)
        if version is None:
            print(f"SKIP {py}: no test.test_asyncio ({present[0]})")
            continue
        versions[py] = version
        jobs += [(py, m, mode) for m in a.modules if m in present for mode in modes]
        missing = [m for m in a.modules if m not in present]
        if missing:
            print(f"note: {version} lacks {', '.join(missing)}")
    jobs.sort(key=lambda k: -COST.get(k[1], 5))  # longest first packs the pool better
    print(f"{len(jobs)} runs, {a.jobs} at a time, logs in {logdir}", flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        futs = {k: pool.submit(run_one, *k, a.timeout, logdir) for k in jobs}
        res = {k: f.result() for k, f in futs.items()}

    ok, regressions = True, {}
    def cell(r: dict) -> str:
        return ("ERR" if r.get("error") else "{}/{}/{}".format(*outcome(r))) + f" {r['wall']:.0f}s"

    hdr = f"{'python':8} {'module':20} " + " ".join(f"{m + ' p/s/f':>20}" for m in modes)
    print("\n" + hdr + f" {'loops':>11}  diff\n" + "-" * (len(hdr) + 18))
    for py, version in versions.items():
        for mod in (m for m in a.modules if (py, m, modes[0]) in res):
            row = {m: res[(py, mod, m)] for m in modes}
            marks = []
            for mode, r in row.items():
                if r.get("error"):
                    ok = False
                    marks.append(f"{mode}:{r['error']} (log {r['log']})")
                if mode == "stock" or r.get("error"):
                    continue
                # Zero loops means the swap missed this module's loop construction path.
                if not r["loops_created"] and (version.rsplit(".", 1)[0], mod) not in ZERO_LOOPS_OK:
                    ok = False
                    marks.append(f"{mode}:0 loops")
                if r.get("write_seen", [mode]) not in ([], [mode]):
                    ok = False
                    marks.append(f"{mode}:loops used write={r['write_seen']}")
                s = row.get("stock", {"error": "not run"})
                if s.get("error"):
                    continue
                if outcome(r) != outcome(s) or r["bad"] != s["bad"]:
                    regressed = resolve(py, mod, mode, res, a.timeout, logdir)
                    if r["confirmed_diff"] or (r["skipped"], r["run"]) != (s["skipped"], s["run"]):
                        ok = False
                        marks.append(f"{mode}:DIFF")
                        skips = set(r["skipped_names"]) ^ set(s["skipped_names"])
                        regressions[(version, mod, mode)] = regressed + [
                            f"skip differs: {n}" for n in sorted(skips)]
                    else:
                        marks.append(f"{mode}:flaky-only")
            loops = "/".join(str(r.get("loops_created")) for m, r in row.items() if m != "stock")
            print(f"{version:8} {mod:20} " + " ".join(f"{cell(r):>20}" for r in row.values())
                  + f" {loops or '-':>11}  {' '.join(marks)}")
    print(f"\ntotal wall {time.monotonic() - t0:.0f}s")
    for (version, mod, mode), names in regressions.items():
        print(f"\n{version} {mod} [{mode}] fails under relaxed but passes under stock:")
        print("\n".join(f"  {n}" for n in names)
              or "  (none: only skips, test counts or stock-only failures differ)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump([{"python_path": k[0], "run_mode": k[2], **v} for k, v in res.items()],
                      fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
