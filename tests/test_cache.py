"""The stage cache: one builder per key, a waiting run reuses the entry, a crashed builder's leftovers go."""

import multiprocessing
import os
import time

from pipeline.cache import DONE, cached_build


def _slow_build(root, log):
    def build(out):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.5)
        (out / "weights").write_text("w")

    path, hit = cached_build(root, "teachers", "k1", build)
    with open(log, "a") as f:
        f.write(f"{'hit' if hit else 'built'} {path}\n")


def test_two_runs_building_one_key_build_it_once(tmp_path):
    """The second run waits for the first and reuses its entry (it used to build again and replace the first
    run's finished entry, which that run may still be reading)."""
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_slow_build, args=(tmp_path / "cache", log)) for _ in range(2)]
    for p in procs:
        p.start()
        time.sleep(0.3)  # the first holds the lock before the second asks
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    lines = log.read_text().splitlines()
    builds = [ln for ln in lines if ln.isdigit()]
    assert len(builds) == 1, lines
    assert sorted(ln.split()[0] for ln in lines if not ln.isdigit()) == ["built", "hit"]
    assert (tmp_path / "cache" / "teachers" / "k1" / DONE).is_file()


def test_a_crashed_builders_leftovers_are_removed(tmp_path):
    root = tmp_path / "cache"
    stage = root / "teachers"
    (stage / ".k1-abandoned").mkdir(parents=True)  # a killed build's temporary folder
    (stage / ".k1-abandoned" / "half").write_text("x")
    (stage / "k1").mkdir()  # an entry without its completion marker
    path, hit = cached_build(root, "teachers", "k1", lambda out: (out / "weights").write_text("w"))
    assert not hit and (path / "weights").is_file() and (path / DONE).is_file()
    assert not (stage / ".k1-abandoned").exists()
    assert cached_build(root, "teachers", "k1", lambda out: 1 / 0) == (path, True)  # a hit builds nothing
