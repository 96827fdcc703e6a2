"""Before/after check for a restructuring: the same deploys give the same reports.

    python benchmarks/same_reports.py run OUT --cache CACHE [--only mlp_fusion target ner qa]
    python benchmarks/same_reports.py compare OUT_BEFORE OUT_AFTER

`run` deploys, through the real command, the main job (`--method mlp_fusion --task sst2`, every default), a speed
target (`distill+smp --target-speedup 4`, budgets cut, gates loosened), and a NER and a QA deploy on a tiny random
BERT (CoNLL-2003 and SQuAD, 200 training examples), each into OUT/<name>, with the cache CACHE. Run it from the
checkout to measure (it imports the code of the current folder). To compare code rather than the machine, give the
second run a copy of the first run's cache holding only its teachers and latency tables (`--keep-from`), so both
compress from the same teacher on the same plan, and run both with one thread (training is then bit-reproducible).

`compare` prints every difference between the two folders' report.json files (and the configs their manifests
record) after dropping what differs from run to run by nature (timings, speeds, paths, pids, cache hits, the
artifact's timestamped name) and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout this script lives in, not an installed copy

DATA = ROOT.parent / "shared" / "data"
LOOSE = ["--set", "gates.max_metric_drop=100", "--set", "gates.int8_max_drop=100"]
SHORT_BENCH = ["--set", "bench.batch_sizes=[1]", "--set", "bench.seq_lens=[32]", "--bench-runs", "3"]
TINY = ["--teacher-steps", "8", "--max-train", "200", "--max-dev", "64", "--steps", "6", *LOOSE, *SHORT_BENCH]
DEPLOYS = {
    "mlp_fusion": ["--method", "mlp_fusion", "--task", "sst2"],
    "target": ["--method", "distill+smp", "--task", "sst2", "--target-speedup", "4", "--steps", "20",
               "--set", "config.distill.transfer_steps=20", *LOOSE, *SHORT_BENCH],
    "ner": ["--method", "gmp", "--task", "conll2003", "--data-dir", str(DATA / "conll2003"), "--model", "{tiny}",
            "--set", "config.prune_every=1", *TINY],
    "qa": ["--method", "distill", "--task", "squad", "--data-dir", str(DATA / "squad"), "--model", "{tiny}",
           "--set", "config.student.layers=1", "--set", "config.transfer_steps=2", *TINY],
}  # fmt: skip
# what differs between two runs of the same code: timings and speeds, paths, pids, what the cache did, and the
# artifact's name (its suffix hashes the config with the time it was made)
VOLATILE = {"speed", "timings", "path", "ran_on", "cached", "cache", "pid", "source", "base_model", "hit", "artifact"}
VOLATILE_SUFFIXES = ("seconds", "_s", "_ms")


def tiny_bert(folder: Path) -> Path:
    """A random 2 x 32 BERT base model with 512 positions (question answering's 384 tokens) and a WordPiece
    tokenizer trained on the shipped SST-2 sample."""
    import torch
    from transformers import BertConfig, BertModel

    from tests.helpers import VOCAB, tiny_tokenizer

    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(
        BertConfig(**shape, vocab_size=VOCAB, max_position_embeddings=512, initializer_range=0.02)
    ).save_pretrained(folder)
    tokenizer = tiny_tokenizer("bert")
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(folder)
    return folder


def run(out: Path, cache: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tiny = out / "tiny-bert"
    if not tiny.is_dir():
        tiny_bert(tiny)
    env = {**os.environ, "PIPELINE_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    for name in only:
        args = [a.replace("{tiny}", str(tiny)) for a in DEPLOYS[name]]
        cmd = [sys.executable, "-m", "pipeline.cli", "deploy", *args, "--output", str(out / name)]
        print("$", " ".join(cmd[2:]), flush=True)
        with (out / f"{name}.log").open("w") as log:
            code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{name}: exit {code}", flush=True)


def keep_from(source: Path, cache: Path) -> None:
    """A new cache holding only `source`'s fine-tuned teachers and latency tables."""
    for part in ("teachers", "latency"):
        if (source / part).is_dir():
            shutil.copytree(source / part, cache / part, dirs_exist_ok=True)


def stable(value):
    """`value` without what differs between two runs of the same code."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE and not k.endswith(VOLATILE_SUFFIXES)}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                found.append(f"{where}.{k}: only in {'after' if k in b else 'before'}")
            else:
                found += differences(a[k], b[k], f"{where}.{k}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}"]


def reports(out: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(out.glob("*/*/report.json")):
        manifest = json.loads((path.parent / "manifest.json").read_text())
        found[path.parent.parent.name] = {"artifact": path.parent.name, **json.loads(path.read_text()),
                                          "config (manifest)": manifest["config"]}  # fmt: skip
    return found


def compare(before: Path, after: Path) -> int:
    a, b = reports(before), reports(after)
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: a report only {'after' if name in b else 'before'}")
            bad += 1
            continue
        found = differences(stable(a[name]), stable(b[name]))
        print(
            f"{name}: {'equal' if not found else f'{len(found)} difference(s)'} ({a[name]['artifact']} and "
            f"{b[name]['artifact']})"
        )
        for line in found:
            print("   ", line)
        bad += bool(found)
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--cache", type=Path, required=True)
    r.add_argument("--keep-from", type=Path, help="start the cache with this cache's teachers and latency tables")
    r.add_argument("--only", nargs="+", choices=sorted(DEPLOYS), default=list(DEPLOYS))
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        sys.exit(compare(args.before, args.after))
    if args.keep_from:
        keep_from(args.keep_from, args.cache)
    run(args.out, args.cache, args.only)


if __name__ == "__main__":
    main()
