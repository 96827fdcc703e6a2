"""Prefect tasks: each wraps exactly one stage's `run` (`pipeline/stages/`, by way of the run engine's table),
passing paths and small reports, never models.

Caching of the expensive stages (teacher, compress) lives in the library's content-addressed cache, keyed by
the digests of the actual input files: a Prefect input-hash cache would hand back a path after its folder was
deleted, and hashing models as task inputs costs seconds. So Prefect's own cache is off here.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.run import PLAIN

# each stage's `run` as a Prefect task of the stage's name: the Run's `stages` in a flow
TASKS = {name: task(run, name=name, cache_policy=NO_CACHE) for name, run in PLAIN.items()}
compress = TASKS["compress"]  # the sweep submits it to its task runner
