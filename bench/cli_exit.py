"""What the CLI's exit saves: one ``flatlab`` command timed with the interpreter's normal exit and with the
entry point's (:func:`flatlab.cli.main.main`: every ``atexit`` handler run, module teardown skipped).

The two ways alternate, ``--rounds`` times each, in fresh processes; each time is the child's wall time
and its CPU time (user + system, which a busy machine moves less). Give the command to time after
``--``, with a store to read, e.g.

    python bench/cli_exit.py --rounds 6 -- results digits_demo --root flatlab-runs
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

WAYS = {
    "normal exit": "import sys; from flatlab.cli.main import app; sys.argv[0] = 'flatlab'; app()",
    "flatlab's exit": "import sys; from flatlab.cli.main import main; sys.argv[0] = 'flatlab'; main()",
}


def timed(code: str, args: Sequence[str]) -> Dict[str, float]:
    """Wall and CPU seconds of ``python -c code args`` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu}


def summary(times: Dict[str, List[Dict[str, float]]]) -> Dict[str, Dict[str, float]]:
    """Per way, the median wall and CPU seconds; ``saved``: normal minus flatlab's, medians."""
    out = {way: {k: statistics.median(t[k] for t in ts) for k in ("wall", "cpu")} for way, ts in times.items()}
    normal, quick = out["normal exit"], out["flatlab's exit"]
    out["saved"] = {k: normal[k] - quick[k] for k in ("wall", "cpu")}
    return out


def main(argv: Sequence[str] = ()) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("command", nargs="+", help="the flatlab command line to time, after --")
    opts = parser.parse_args(list(argv) or None)
    os.environ.setdefault("COLUMNS", "160")
    times: Dict[str, List[Dict[str, float]]] = {way: [] for way in WAYS}
    for i in range(opts.rounds):
        for way, code in WAYS.items():
            times[way].append(timed(code, opts.command))
        print(f"round {i + 1}: " + ", ".join(f"{w} {times[w][-1]['wall']:.2f} s" for w in WAYS), flush=True)
    result = summary(times)
    for way, t in result.items():
        print(f"{way:15s} wall {t['wall']:.2f} s, CPU {t['cpu']:.2f} s (median)")
    return result


if __name__ == "__main__":
    main()
