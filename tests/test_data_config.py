"""Tasks, data sources, recipes and the method registry."""

import re

import pytest

from pipeline.compress.deploy_config import DeployConfig
from pipeline.compress.registry import get_method, methods
from pipeline.compress.shapes import layer_options
from pipeline.config.recipes import (
    RECIPES_DIR,
    TEACHERS_DIR,
    apply_override,
    default_recipe_path,
    load_recipe,
    read_yaml_mapping,
    stage_keys,
)
from pipeline.config.schema import TrainConfig
from pipeline.data.loaders import Split, carve_validation, load_task_data, resolve_source
from pipeline.data.tasks import TASKS, get_task
from pipeline.errors import PipelineError
from pipeline.request import build_deploy_config
from tests.helpers import SHARED_DATA


def _write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["\t".join(header), *("\t".join(r) for r in rows)]) + "\n")


def test_sample_is_used_offline_and_says_so():
    spec = get_task("sst2")
    assert resolve_source(spec, None) == "sample"  # the tests run with the hub offline and nothing cached
    data = load_task_data("sst2")
    assert "embedded sample" in data.source
    assert 300 <= len(data.train) + len(data.dev) <= 2000
    assert set(data.train.labels) == {0, 1}


def test_pair_task_from_tsv(tmp_path):
    rows = [("a man plays", "someone plays", "entailment"), ("a cat sleeps", "a dog barks", "not_entailment")]
    for name in ("train.tsv", "dev.tsv"):
        _write(
            tmp_path / name, ["index", "sentence1", "sentence2", "label"], [(str(i), *r) for i, r in enumerate(rows)]
        )
    data = load_task_data("rte", tmp_path)
    assert data.dev.texts[0] == ("a man plays", "someone plays") and data.dev.labels == [0, 1]
    assert len(data.train) == len(data.validation) == 1  # two training pairs: one is carved off for validation
    assert data.task.is_pair and "GLUE TSV folder" in data.source


def test_limits_take_a_seeded_train_subset_and_dev_head():
    full = load_task_data("sst2", source="sample")
    a = load_task_data("sst2", source="sample", max_train=50, max_dev=10)
    b = load_task_data("sst2", source="sample", max_train=50, max_dev=10)
    assert a.train == b.train and len(a.train) == 50
    assert a.dev.texts == full.dev.texts[:10]
    assert a.fingerprint == b.fingerprint != full.fingerprint


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "missing train.tsv"),
        (
            {"train.tsv": (["text", "label"], [("good", "1")]), "dev.tsv": (["text", "label"], [("bad", "0")])},
            "missing column",
        ),
        (
            {
                "train.tsv": (["sentence", "label"], [("good", "2")]),
                "dev.tsv": (["sentence", "label"], [("bad", "0")]),
            },
            r"train.tsv:2: label .2. is not one of task sst2.s labels \(0, 1\)",
        ),
        (
            {"train.tsv": (["sentence", "label"], []), "dev.tsv": (["sentence", "label"], [("bad", "0")])},
            "no examples",
        ),
    ],
)
def test_bad_data_folders(tmp_path, files, message):
    tmp_path.joinpath("data").mkdir()
    for name, (header, rows) in files.items():
        _write(tmp_path / "data" / name, header, rows)
    with pytest.raises(PipelineError, match=message):
        load_task_data("sst2", tmp_path / "data")


def test_every_task_resolves_and_unknown_lists_known():
    for name, spec in TASKS.items():
        assert get_task(name) is spec and len(spec.label_values) == len(spec.labels)
    with pytest.raises(PipelineError, match="known tasks: conll2003, mnli, mrpc"):
        get_task("cola")


def test_registry_covers_every_method_with_a_default_recipe():
    import importlib

    for m in methods():
        assert default_recipe_path(m.name, "sst2") is not None
        if m.apply_path is not None:  # the lazy "module:function" path resolves
            module, _, func = m.apply_path.partition(":")
            assert callable(getattr(importlib.import_module(module), func))
        build_deploy_config(m.name, "sst2")  # every packaged recipe validates
    for folder in RECIPES_DIR.iterdir():  # methods and packaged chains
        for recipe in folder.glob("*.yaml") if folder.name not in ("teacher", "kinds", "general") else ():
            build_deploy_config(folder.name, "sst2", recipe.stem)  # by name, as `--recipe paper`
    with pytest.raises(PipelineError, match=re.escape("known methods: " + ", ".join(m.name for m in methods()))):
        get_method("smp2")


def test_recipe_overrides_and_validation(tmp_path):
    cfg = build_deploy_config(
        "mlp_fusion", "sst2", overrides=["config.ratio=0.5", "teacher.max_steps=7", "bench.seq_lens=[16]"]
    )
    assert cfg.method_config.ratio == 0.5 and cfg.teacher.max_steps == 7 and cfg.bench.seq_lens == (16,)
    for bad, message in [
        ("config.ratio=0", "greater than 0"),
        ("config.ratio=1.5", "less than or equal to 1"),
        ("config.ratoi=0.5", "ratoi: Extra inputs"),
        ("teacher.bogus=1", "teacher.bogus"),
        ("ratio", "key.path=value"),
    ]:
        with pytest.raises(PipelineError, match=message):
            build_deploy_config("mlp_fusion", "sst2", overrides=[bad])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: mlp_fusion\nconfig:\n  ratio: 0.5\n  layers: [1]\n")
    assert build_deploy_config("mlp_fusion", "sst2", recipe).method_config.layers == [1]
    recipe.write_text("method: mlp_fusion\nconfig: [1, 2\n")
    with pytest.raises(PipelineError, match="not valid YAML"):
        build_deploy_config("mlp_fusion", "sst2", recipe)


def test_a_recipe_extends_another_and_says_only_what_differs(tmp_path):
    """`extends: NAME` lays a recipe beside it, else the method's packaged NAME, under the recipe: its own values win,
    mappings merge key by key, lists replace; the packaged SQuAD recipe is the default with its one change."""
    base = load_recipe("smp", "sst2")
    squad = load_recipe("smp", "sst2", "squad")
    assert squad["config"]["smp"].pop("recover_steps") == 2000 and base["config"]["smp"].pop("recover_steps") == 250
    assert squad == base
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: default\nconfig:\n  train:\n    lr: 0.5\nbench:\n  seq_lens: [16]\n")  # the packaged one
    cfg = build_deploy_config("smp", "sst2", mine)
    assert cfg.method_config.train.lr == 0.5 and cfg.method_config.train.max_steps == 600
    assert cfg.bench.seq_lens == (16,) and cfg.method_config.recover_steps == 250
    (tmp_path / "default.yaml").write_text("method: smp\nconfig:\n  recover_steps: 7\n")  # a file beside it wins
    assert build_deploy_config("smp", "sst2", mine).method_config.recover_steps == 7
    for text, message in [
        ("extends: mine\n", "extends 'mine' goes round in a circle"),
        ("extends: [a]\n", "extends must name a recipe"),
        ("extends: nowhere\n", "recipe not found: nowhere"),
    ]:
        mine.write_text(text)
        with pytest.raises(PipelineError, match=re.escape(message)):
            build_deploy_config("smp", "sst2", mine)


def test_question_answering_has_its_own_lengths_batching_and_int8_gate_unless_told_otherwise(tmp_path):
    """recipes/kinds/question-answering.yaml lies under every recipe of a QA task (built-in or a task file):
    training, the speed target and the benchmark's headline at 384 tokens, batches grouped by length, the int8 gate
    at 2.0 F1; a recipe or `--set` still decides."""
    for method in ("none", "distill", "smp", "distill+smp"):
        cfg = build_deploy_config(method, "squad")
        assert (cfg.teacher.max_length, cfg.target.seq, cfg.bench.seq_lens) == (384, 384, (128, 384))
        assert {name: section["train"]["max_length"] for name, section in cfg.config.items()} == {
            name: 384 for name in method.split("+")
        }
        assert cfg.teacher.group_by_length and cfg.gates.int8_max_drop == 2.0  # and batching and the int8 gate
        assert cfg.teacher.lr == build_deploy_config(method, "sst2").teacher.lr  # nothing else
    told = build_deploy_config("distill", "squad", overrides=["config.train.max_length=256", "target.seq=256"])
    trained_at = told.config["distill"]["train"]["max_length"]
    assert (trained_at, told.target.seq, told.teacher.max_length) == (256, 256, 384)
    assert (
        build_deploy_config("distill+smp", "squad", overrides=["config.smp.train.max_length=200"]).config["smp"][
            "train"
        ]["max_length"]
        == 200
    )
    from pipeline.request import check_lengths

    cfg = build_deploy_config("distill", "squad")  # a model with fewer positions is refused before any work
    with pytest.raises(PipelineError, match=r"^teacher.max_length=384 exceeds the model's 160 positions$"):
        check_lengths(cfg, cfg.chain_configs, {"model_type": "bert", "max_position_embeddings": 160})
    from pipeline.data.tasks import get_task

    squad = get_task("squad")  # two text columns, but not a sentence pair: the server reads questions
    assert squad.describe()["pair"] is False and get_task("mrpc").describe()["pair"] is True
    for task in ("sst2", "conll2003"):  # the other kinds keep the defaults
        cfg = build_deploy_config("distill", task)
        assert (cfg.teacher.max_length, cfg.target.seq, cfg.bench.seq_lens) == (128, 128, (32, 128))
        assert (cfg.teacher.group_by_length, cfg.gates.int8_max_drop) == (False, 1.0)


def test_config_round_trips_through_json():
    cfg = build_deploy_config("mlp_fusion", "sst2")
    assert DeployConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_apply_override_parses_yaml_values():
    data = {}
    apply_override(data, "a.b=[1, 2]")
    apply_override(data, "a.c=null")
    assert data == {"a": {"b": [1, 2], "c": None}}


def test_every_cpu_recipe_shares_one_teacher_definition():
    """The teacher is part of its cache key: every packaged CPU recipe must resolve to the one shared definition,
    so methods reuse one cached teacher; an inline mapping and `--set teacher=NAME` still work."""
    shared = read_yaml_mapping(TEACHERS_DIR / "default.yaml", "teacher definition")
    for m in methods():
        for recipe in (RECIPES_DIR / m.name).glob("*.yaml"):
            cfg = build_deploy_config(m.name, "sst2", recipe.stem)
            if recipe.stem != "paper":
                assert cfg.teacher.model_dump() == TrainConfig(**shared).model_dump(), recipe
    assert build_deploy_config("gmp", "sst2", "paper").teacher.lr == 2e-5
    assert build_deploy_config("smp", "sst2", overrides=["teacher=paper"]).teacher.max_steps == 6315
    with pytest.raises(PipelineError, match="unknown teacher definition 'nope'; known: default, paper"):
        build_deploy_config("smp", "sst2", overrides=["teacher=nope"])


def test_a_task_without_its_own_recipe_gets_the_methods_defaults():
    """Not the pydantic defaults: smp keeps its 250 recovery steps on rte as on sst2."""
    for task in ("sst2", "rte", "mrpc"):
        assert build_deploy_config("smp", task).method_config.recover_steps == 250
        assert build_deploy_config("mlp_fusion", task).method_config.tune_steps == 60


def test_conll2003_distils_and_recovers_longer_with_the_labels_than_a_sentence_task():
    """recipes/distill+smp/conll2003.yaml: entity F1 needs 6,000 recovery steps at 4x (1,000 left it 2.5 below the
    teacher on dev, 3,000 1.4 on an AVX2 CPU's narrower plan), and on whole-document validation 2,000 distillation
    steps and the labels in SMP (kd_alpha 0.5); a user's NER task names it with --recipe conll2003; sentence tasks
    keep the default's 1,000 recovery steps on the teacher's outputs alone."""
    for cfg in (
        build_deploy_config("distill+smp", "conll2003"),
        build_deploy_config("distill+smp", "sst2", "conll2003"),
    ):
        distill, smp = cfg.chain
        assert smp.recover_steps == 6000 and smp.train.kd_alpha == 0.5 and smp.train.group_by_length
        assert distill.train.max_steps == 2000 and distill.train.epochs >= 6 and distill.train.kd_alpha == 0.5
    sst2 = build_deploy_config("distill+smp", "sst2").method_config
    assert sst2.recover_steps == 1000 and sst2.train.kd_alpha == 1.0


def test_a_training_phase_is_not_capped_by_epochs():
    """A sub-phase runs exactly its steps, however small the training set (mlp_fusion's tuning was capped at one
    epoch: 32 steps instead of 60 on the 1,000-sentence sample)."""
    from pipeline.train.loop import num_steps

    cfg = TrainConfig(max_steps=300, epochs=3.0, lr=5e-5, kd_alpha=0.5)
    phase = cfg.phase(60, 1e-4, warmup_ratio=0.1)
    assert num_steps(phase, 1000) == 60 and phase.lr == 1e-4 and phase.warmup_ratio == 0.1 and phase.kd_alpha == 0.5
    assert num_steps(cfg, 1000) == 94  # the task phase keeps its epoch cap


def test_the_validation_split_is_carved_from_train_disjoint_and_fixed_by_seed():
    full = load_task_data("sst2", source="sample", validation=(10_000, 0.5, 0, "example"))  # raw train, halved
    a = load_task_data("sst2", source="sample")
    b = load_task_data("sst2", source="sample", max_train=50)
    c = load_task_data("sst2", source="sample", validation=(2000, 0.1, 1, "example"))
    raw = set(full.train.texts) | set(full.validation.texts)
    assert len(a.validation) == 250 and len(a.train) + len(a.validation) == len(raw)  # 10% of 1,000 is under 250
    assert not set(a.validation.texts) & set(a.train.texts)  # disjoint
    assert set(a.validation.texts) <= raw and not set(a.validation.texts) & set(a.dev.texts)
    assert a.validation == b.validation  # max_train never changes it
    assert set(b.train.texts) <= set(a.train.texts)
    assert c.validation != a.validation  # another seed, another slice
    assert a.describe()["validation_split"] == {**a.describe()["validation_split"], "seed": 0, "examples": 250}
    big = carve_validation(Split([(str(i),) for i in range(30_000)], [0] * 30_000), 2000, 0.1, 0)
    assert (len(big[0]), len(big[1])) == (28_000, 2000)


def test_a_training_set_too_small_to_carve_is_one_line(tmp_path):
    _write(tmp_path / "train.tsv", ["sentence", "label"], [("good", "1")])
    _write(tmp_path / "dev.tsv", ["sentence", "label"], [("bad", "0")])
    with pytest.raises(PipelineError, match="too few to carve a validation split"):
        load_task_data("sst2", tmp_path)


def test_a_sentence_validation_split_shares_no_phrase_with_train():
    """SST-2's train set is phrases of sentences: a random slice leaks (docs/results.md). With the sentence unit,
    validation draws only texts inside no other text, and their phrases leave train."""
    roots = [f"the {w} film is a gem , full of {w} scenes" for w in ("quiet", "loud", "long", "odd", "warm", "cold")]
    phrases = [p for r in roots for p in (r, r.split(" is ")[0], r.split(" , ")[1], "a gem")]
    split = Split([(p,) for p in phrases], [i % 2 for i in range(len(phrases))])
    train, val, dropped = carve_validation(split, 2, 0.5, 0, "sentence")
    val_texts = [t[0] for t in val.texts]
    assert val_texts and set(val_texts) <= set(roots)
    train_texts = [t[0] for t in train.texts]
    assert not any(f" {t} " in f" {v} " for t in train_texts for v in val_texts)  # no phrase of them is trained on
    assert dropped == 2 * len(val_texts) + 6  # each drawn root's two own phrases, and every "a gem"
    assert len(train_texts) + len(val_texts) + dropped == len(phrases)
    random_train, random_val, none_dropped = carve_validation(split, 2, 0.5, 0)
    assert none_dropped == 0 and len(random_train) == len(phrases) - len(random_val)


def test_the_sentence_unit_is_recorded_refused_for_pairs_and_unsaid_at_its_default(tmp_path):
    from pipeline.config.schema import DataLimits

    assert "validation_unit" not in DataLimits().model_dump()  # `auto`: cached stages keep their keys
    assert DataLimits(validation_unit="sentence").model_dump()["validation_unit"] == "sentence"
    assert DataLimits(validation_unit="example").model_dump()["validation_unit"] == "example"
    data = load_task_data("sst2", source="sample", validation=DataLimits(validation_unit="sentence").validation)
    assert data.describe()["validation_split"]["unit"] == "sentence"
    assert data.describe()["validation_split"]["dropped_from_train"] == data.dropped_from_train
    pairs = Split([("a b", "c d"), ("e f", "g h"), ("i", "j"), ("k", "l")], [0, 1, 0, 1])
    with pytest.raises(PipelineError, match="validation_unit=sentence is for tasks of one text"):
        carve_validation(pairs, 1, 0.5, 0, "sentence")


def test_the_data_stage_measures_and_warns_of_a_validation_split_inside_train(tmp_path, caplog):
    from pipeline.data.loaders import DataRef
    from pipeline.stages.data import run as data_stage

    sample = data_stage(DataRef(get_task("sst2"), "sample"))
    assert sample["validation_split"]["inside_train"] == 0.0  # hand-written sentences: nothing leaks
    words = ["the", "film", "is", "warm", "and", "odd", "and", "long", "but", "never", "dull", "for", "once"]
    rows = [(" ".join([str(k), *words[i:j]]) if j == 12 else " ".join(words[i:j]), str(k % 2))
            for k in range(40) for i, j in ((0, 12), (2, 8), (4, 7))]  # fmt: skip
    _write(tmp_path / "train.tsv", ["sentence", "label"], rows)
    _write(tmp_path / "dev.tsv", ["sentence", "label"], [("a new sentence", "1")])
    with caplog.at_level("WARNING", logger="pipeline.stages.data"):  # a random slice, asked for: measured, warned
        phrases = data_stage(DataRef(get_task("sst2"), "tsv", str(tmp_path), validation=(30, 0.25, 0, "example")))
    assert phrases["validation_split"]["inside_train"] > 0.2 and "holds out whole sentences" in caplog.text
    held_out = DataRef(get_task("sst2"), "tsv", str(tmp_path), validation=(30, 0.25, 0, "sentence"))
    assert "inside_train" not in data_stage(held_out)["validation_split"]


def test_validation_holds_out_whole_sentences_by_default_where_a_random_slice_leaks(tmp_path, caplog):
    """`auto` (the default): a training set of phrases of its sentences is carved by whole sentences, and says so;
    data that does not leak is carved by example, exactly as before (the same split, so the same cache keys)."""
    from pipeline.config.schema import DataLimits
    from pipeline.data.loaders import DataRef
    from pipeline.stages.data import run as data_stage

    words = ["the", "film", "is", "warm", "and", "odd", "and", "long", "but", "never", "dull", "for", "once"]
    rows = [(" ".join([str(k), *words[i:j]]) if j == 12 else " ".join(words[i:j]), str(k % 2))
            for k in range(40) for i, j in ((0, 12), (2, 8), (4, 7))]  # fmt: skip
    _write(tmp_path / "train.tsv", ["sentence", "label"], rows)
    _write(tmp_path / "dev.tsv", ["sentence", "label"], [("a new sentence", "1")])
    default = DataLimits().validation
    assert default[-1] == "auto"
    leaking = load_task_data("sst2", tmp_path, source="tsv", validation=default)
    sentences = load_task_data("sst2", tmp_path, source="tsv", validation=(*default[:3], "sentence"))
    assert leaking.validation_unit == "sentence" and leaking.random_slice_inside > 0.2
    assert leaking.validation == sentences.validation and leaking.dropped_from_train == sentences.dropped_from_train
    split = leaking.describe()["validation_split"]
    assert split["chosen"].startswith("auto: ")
    assert split["random_slice_inside"] == round(leaking.random_slice_inside, 4)  # the report's number behind it
    with caplog.at_level("INFO", logger="pipeline.stages.data"):
        data_stage(DataRef(get_task("sst2"), "tsv", str(tmp_path)))
    assert "validation holds out whole sentences (data.validation_unit auto)" in caplog.text
    clean = load_task_data("sst2", source="sample", validation=default)
    example = load_task_data("sst2", source="sample", validation=(*default[:3], "example"))
    assert clean.validation_unit == "example" and clean.random_slice_inside == 0.0  # measured: no leak
    assert clean.fingerprint == example.fingerprint and clean.describe() == example.describe()
    pairs = load_task_data("rte", SHARED_DATA / "rte", source="tsv", max_train=200, validation=default)
    assert pairs.validation_unit == "example"  # pairs cannot leak so: carved by example


@pytest.mark.parametrize("method", ["smp", "distill+smp"])
def test_stage_keys_address_every_method_of_a_chain(method):
    cfg = build_deploy_config(method, "sst2", overrides=[f"{k}=cpu" for k in stage_keys(method, "train.device")])
    stages = cfg.chain_configs
    assert [m.name for m, _ in stages] == method.split("+")
    assert all(stage.train.device == "cpu" for _, stage in stages)


SECOND_PHASE = {"smp": "recover_steps", "distill": "transfer_steps", "mlp_fusion": "tune_steps"}


@pytest.mark.parametrize("method", ["smp", "distill+smp", "mlp_fusion"])
def test_steps_budget_every_phase_of_every_method_of_a_chain(method):
    """`--steps N` is N steps of each phase (the recipes' second phases run 60 to 6,000 steps otherwise)."""
    stages = build_deploy_config(method, "sst2", steps=4).chain_configs
    assert [m.name for m, _ in stages] == method.split("+")
    for m, stage in stages:
        assert (stage.train.max_steps, getattr(stage, SECOND_PHASE[m.name])) == (4, 4), m.name


def test_steps_leave_a_skipped_phase_skipped_and_a_set_wins(tmp_path):
    (tmp_path / "pure.yaml").write_text("method: smp\nconfig:\n  recover_steps: 0\n")  # pure SMP
    assert build_deploy_config("smp", "sst2", tmp_path / "pure.yaml", steps=4).method_config.recover_steps == 0
    joint = build_deploy_config("distill", "sst2", overrides=["config.transfer_steps=0"], steps=4).method_config
    assert (joint.transfer_steps, joint.train.max_steps) == (0, 4)
    told = ["config.smp.recover_steps=2", "config.distill.train.max_steps=3"]
    distill, smp = build_deploy_config("distill+smp", "sst2", overrides=told, steps=4).chain
    assert (distill.train.max_steps, distill.transfer_steps, smp.train.max_steps, smp.recover_steps) == (3, 4, 4, 2)


def test_the_layerwise_recipe_is_long_with_an_augmented_copy_and_layer_kd_in_both_stages():
    """recipes/distill+smp/layerwise.yaml: what the 6x, 8x and 10x runs set by hand on `long` (docs/results.md),
    nothing else; half the teacher's depth at least (the 8x and 10x runs' `target.layers=[3]` of 6)."""
    by_hand = [
        "config.distill.train.augment.copies=1",
        "config.distill.train.layer_kd=1.0",
        "config.smp.train.layer_kd=1.0",
        "target.min_depth=0.5",
    ]
    layerwise, plain = (build_deploy_config("distill+smp", "sst2", name) for name in ("layerwise", "long"))
    long = build_deploy_config("distill+smp", "sst2", "long", overrides=by_hand).model_dump()
    assert layerwise.model_dump() == long
    assert plain.model_dump() != long
    # the depths the plan may pick for a 6-layer teacher: 3 to 6 (`long` alone: 1 to 6)
    assert layer_options(layerwise, 6) == [3, 4, 5, 6]
    assert layer_options(plain, 6) == [1, 2, 3, 4, 5, 6]
