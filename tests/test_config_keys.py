"""The serialised deploy configuration did not move when the chain became a typed value: these digests were
taken from the code before it (a string `method` and a dict `config`), so artifact names and cache keys (each
method's `model_dump()`, the whole config's JSON) stay what they were and old caches keep their entries. The whole
config's digests moved once since, when the gates gained `onnx_min_cosine` (embeddings' parity gate); the methods'
dumps, which the stage caches key on, did not."""

import hashlib
import json

import pytest

from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.shapes import Shape, apply_shape
from pipeline.request import build_deploy_config

TEACHER = {"layers": 6, "heads": 12, "ffn": 1536, "hidden": 384}
PLANNED = Shape(3, 6, 768, 1.0, 4.0, 1, 384)
# (method, task, recipe, --set), digest of the config's JSON, of each method's model_dump(), of the planned config's
CASES = [
    (("mlp_fusion", "sst2", None, ()), "1a2733f03ef3aa58", ("661e2c332573ab4c",), None),
    (("smp", "sst2", None, ()), "6336e5eaea951662", ("30259205e027a310",), None),
    (("gmp", "mrpc", None, ("config.train.seed=3",)), "d816e4e1db108206", ("e198db3650aea280",), None),
    (("distill", "sst2", None, ()), "5bcb30f82fb57171", ("abc7e205c4aaa2ff",), None),
    (("none", "sst2", None, ()), "c2bb271f4ae3e539", ("12a8db3b5213c0ff",), None),
    (
        ("distill+smp", "sst2", None, ("target.speedup=4",)),
        "538f659bd59bef6c",
        ("abc7e205c4aaa2ff", "1de111eb9f2b9a83"),
        "281e1852df25b787",
    ),
    (
        ("distill+smp", "sst2", "layerwise", ("target.speedup=8",)),
        "c3438fedf4e83bf2",
        ("520a798f12e6dc96", "aa67787aefaa7e4b"),
        "8858ecf8d85cbd9b",
    ),
    (("distill+smp", "sst2", "long", ()), "c2bdb94ef470b299", ("8a1773b3db4da919", "5eca647658414ca8"), None),
    (
        ("distill+gmp", "rte", None, ("config.gmp.train.max_steps=70", "config.gmp.prune_every=2")),
        "3a319b329324d34a",
        ("abc7e205c4aaa2ff", "0de2ea299cf25003"),
        None,
    ),
    (("mlp_fusion", "conll2003", None, ()), "2e256e80edc3c79c", ("661e2c332573ab4c",), None),
    (("distill", "squad", None, ()), "91c95d7d889b027d", ("23447e8e4a4200b3",), None),
    (("smp+mlp_fusion", "sst2", None, ()), "33b6d0b98b9edec0", ("30259205e027a310", "661e2c332573ab4c"), None),
]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize(("args", "config", "sections", "planned"), CASES, ids=[f"{c[0][0]}-{c[0][1]}" for c in CASES])
def test_the_serialised_config_and_the_cache_key_parts_are_what_they_were(args, config, sections, planned):
    method, task, recipe, sets = args
    cfg = build_deploy_config(method, task, recipe, list(sets))
    assert digest(cfg.model_dump_json()) == config
    assert tuple(digest(json.dumps(c.model_dump(), sort_keys=True, default=str)) for c in cfg.chain) == sections
    if planned is not None:
        assert digest(apply_shape(cfg, PLANNED, TEACHER).model_dump_json()) == planned
    again = DeployConfig.model_validate_json(cfg.model_dump_json())  # a state file or a Prefect parameter
    assert (
        again == cfg
        and again.model_dump() == cfg.model_dump()
        and [type(c) for c in again.chain] == [type(c) for c in cfg.chain]
    )


def test_a_request_validates_against_the_flows_parameter_schema(tmp_path):
    """Prefect checks a deployment's parameters against the flow's JSON schema (`pipeline schedule`): the config's
    schema must describe its serialised form, the method string and its sections."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    from flows.deploy import deploy
    from pipeline.request import prepare_request

    request = prepare_request("distill+smp", "sst2", output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path),
                              overrides=["target.speedup=4"])  # fmt: skip
    schema = parameter_schema(deploy.fn).model_dump()
    validate({"request": request.model_dump(mode="json")}, schema, raise_on_error=True, ignore_required=False)
    assert DeployConfig.model_validate(request.config.model_dump(mode="json")).chain == request.config.chain
