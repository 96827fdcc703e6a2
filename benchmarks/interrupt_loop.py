"""Interrupt `pipeline deploy` at random moments and check that it never publishes: exit 130, no artifact, no staging
folder, every time.

    python benchmarks/interrupt_loop.py --runs 20 [--signal INT|TERM] [--seed 0] [-- DEPLOY OPTIONS]

Two uninterrupted runs of the same deploy come first: the first fills the cache (teacher, compressed model), the
second measures how long a run takes once they are cached, as every later run's are; each later run gets the
signal at a moment drawn uniformly from that duration. It prints one line per run (the moment, the last stage the
log had reached, the exit code, what the output folder holds) and exits 1 if any run published or exited
otherwise. A run that finished before its signal arrived, or had published (the output folder changed before the
signal was sent, or the run says the signal came after publishing), is counted apart, not as a pass.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = ["--method", "mlp_fusion", "--task", "sst2", "--teacher-steps", "4", "--steps", "3", "--max-train", "64",
        "--max-dev", "16", "--set", "config.tune_steps=2", "--set", "gates.int8_max_drop=100",
        "--set", "gates.max_metric_drop=100", "--set", "bench.batch_sizes=[1]", "--set", "bench.seq_lens=[16]",
        "--bench-runs", "2", "--set", "bench.min_runs=1", "--set", "bench.warmup=0"]  # fmt: skip
STAGE = re.compile(r"Task run '([a-z_]+)-[0-9a-f]+' - Finished")


def run_once(args: list[str], out: Path, env: dict, log: Path, delay: float | None, sig: int) -> dict:
    start, sent = time.monotonic(), None
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "deploy", *args, "--output", str(out)],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)  # fmt: skip
        if delay is not None:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                sent = time.time()
                proc.send_signal(sig)
        code = proc.wait(timeout=600)
    text = log.read_text()
    finished = STAGE.findall(text)
    # the publishing rename and, just after it, the removal of the staging lock are the output folder's last
    # changes: an mtime before the signal means both preceded it (a signal between them the run notes itself)
    renamed = out.stat().st_mtime if out.exists() and any(out.iterdir()) else None
    return {
        "published_first": renamed is not None and sent is not None and renamed <= sent,
        "noted": "was published; it stands" in text,
        "seconds": time.monotonic() - start,
        "code": code,
        "after": finished[-1] if finished else "start",
        "left": sorted(p.name for p in out.iterdir()) if out.exists() else [],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--signal", choices=("INT", "TERM"), default="INT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("deploy", nargs="*", help="deploy options after --; default: a tiny deploy of the embedded model")
    opts = p.parse_args()
    sig = getattr(signal, f"SIG{opts.signal}")
    args = opts.deploy or TINY
    rng = random.Random(opts.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "PIPELINE_CACHE_DIR": str(root / "cache"), "PREFECT_HOME": str(root / "prefect")}
        for warm in ("cache", "timing"):
            first = run_once(args, root / f"out-{warm}", env, root / f"run-{warm}.log", None, sig)
            if first["code"] != 0:
                print((root / f"run-{warm}.log").read_text()[-3000:], file=sys.stderr)
                return 2
        duration = first["seconds"]
        print(f"uninterrupted run: {duration:.1f} s; signal SIG{opts.signal} at a uniform moment in that time")
        failures = late = 0
        for i in range(1, opts.runs + 1):
            delay = rng.uniform(0, duration)
            r = run_once(args, root / f"out-{i}", env, root / f"run-{i}.log", delay, sig)
            if r["code"] == 0 and (r["seconds"] < delay or r["published_first"] or r["noted"]):
                late += 1  # it ended, or published (a rename cannot be undone), before the signal arrived
                verdict = "finished before the signal" if r["seconds"] < delay else "published before the signal"
            else:
                # killed by the signal itself (it landed before Python installed any handler) is a stop too
                ok = r["code"] in (128 + sig, -sig) and r["left"] == []
                failures += not ok
                verdict = "ok" if ok else "FAILED"
            print(f"run {i:2d}: signal at {delay:5.1f} s after {r['after']:<9} exit {r['code']:3d}  "
                  f"left {r['left'] or 'nothing'}  {verdict}")  # fmt: skip
        stopped = opts.runs - late
        print(f"{stopped - failures} of {stopped} interrupted runs stopped with exit {128 + sig} and published nothing"
              f"; {late} finished before their signal")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
