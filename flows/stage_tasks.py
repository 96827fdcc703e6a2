"""Prefect tasks: each wraps exactly one stage's `run` (`pipeline/stages/`), passing paths and small reports,
never models.

Caching of the expensive stages (teacher, compress) lives in the library's content-addressed cache, keyed by
the digests of the actual input files: a Prefect input-hash cache would hand back a path after its folder was
deleted, and hashing models as task inputs costs seconds. So Prefect's own cache is off here.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.stages import bench, compact, compress, data, export, package, plan, teacher, validate

data = task(data.run, name="data", cache_policy=NO_CACHE)
teacher = task(teacher.run, name="teacher", cache_policy=NO_CACHE)
plan = task(plan.run, name="plan", cache_policy=NO_CACHE)
compress = task(compress.run, name="compress", cache_policy=NO_CACHE)
compact = task(compact.run, name="compact", cache_policy=NO_CACHE)
export = task(export.run, name="export", cache_policy=NO_CACHE)
validate = task(validate.run, name="validate", cache_policy=NO_CACHE)
bench = task(bench.run, name="bench", cache_policy=NO_CACHE)
package = task(package.run, name="package", cache_policy=NO_CACHE)

TASKS = {t.name: t for t in (data, teacher, plan, compress, compact, export, validate, bench, package)}  # `Run.stages`
