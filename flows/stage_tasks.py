"""Prefect tasks: each wraps exactly one library call and passes paths and small reports, never models.

Caching of the expensive stages (teacher, compress) lives in the library's content-addressed cache, keyed by
the digests of the actual input files: a Prefect input-hash cache would hand back a path after its folder was
deleted, and hashing models as task inputs costs seconds. So Prefect's own cache is off here.
"""

from prefect import task
from prefect.cache_policies import NO_CACHE

from export import latency_table, onnx, package, speed, validate
from pipeline import stages

describe_data = task(stages.describe_data, name="data", cache_policy=NO_CACHE)
prepare_teacher = task(stages.prepare_teacher, name="teacher", cache_policy=NO_CACHE)
plan_target = task(latency_table.plan_target, name="plan", cache_policy=NO_CACHE)
compress = task(stages.compress, name="compress", cache_policy=NO_CACHE)
compact = task(stages.compact, name="compact", cache_policy=NO_CACHE)
export_models = task(onnx.export_stage, name="export", cache_policy=NO_CACHE)
validate_models = task(validate.validate, name="validate", cache_policy=NO_CACHE)
measure_speed = task(speed.measure_speed, name="benchmark", cache_policy=NO_CACHE)
publish = task(package.publish, name="package", cache_policy=NO_CACHE)
