"""The serialised deploy configuration did not move when the chain became a typed value: these digests were
taken from the code before it (a string `method` and a dict `config`), so artifact names and cache keys (each
method's `model_dump()`, the whole config's JSON) stay what they were and old caches keep their entries. The whole
config's digests moved twice since, when the gates gained `onnx_min_cosine` (embeddings' parity gate) and the bench
`passes`; the methods' dumps, which the stage caches key on, did not."""

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
    (("mlp_fusion", "sst2", None, ()), "6d99c4e460dbfd60", ("661e2c332573ab4c",), None),
    (("smp", "sst2", None, ()), "4becb27d19bb8066", ("30259205e027a310",), None),
    (("gmp", "mrpc", None, ("config.train.seed=3",)), "1818111efff41b50", ("e198db3650aea280",), None),
    (("distill", "sst2", None, ()), "a68aad9ed2ba51a6", ("abc7e205c4aaa2ff",), None),
    (("none", "sst2", None, ()), "964b1b214b74540c", ("12a8db3b5213c0ff",), None),
    (
        ("distill+smp", "sst2", None, ("target.speedup=4",)),
        "a71f5af05a881e2c",
        ("abc7e205c4aaa2ff", "1de111eb9f2b9a83"),
        "80840432a3917a96",
    ),
    (
        ("distill+smp", "sst2", "layerwise", ("target.speedup=8",)),
        "6b30601d32681259",
        ("520a798f12e6dc96", "aa67787aefaa7e4b"),
        "16e9ed92b9adb70e",
    ),
    (("distill+smp", "sst2", "long", ()), "d9d10e5a3eed300b", ("8a1773b3db4da919", "5eca647658414ca8"), None),
    (
        ("distill+gmp", "rte", None, ("config.gmp.train.max_steps=70", "config.gmp.prune_every=2")),
        "4a8cc90947fa7ee6",
        ("abc7e205c4aaa2ff", "0de2ea299cf25003"),
        None,
    ),
    (("mlp_fusion", "conll2003", None, ()), "9bb579e1aca7263c", ("661e2c332573ab4c",), None),
    (("distill", "squad", None, ()), "ec34ed1d604123d8", ("23447e8e4a4200b3",), None),
    (("smp+mlp_fusion", "sst2", None, ()), "d053ed53024d6ac4", ("30259205e027a310", "661e2c332573ab4c"), None),
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
