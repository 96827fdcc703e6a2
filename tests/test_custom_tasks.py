"""The user's own task (`--task-file`): TSV, CSV and JSONL files, any number of labels, pairs, end to end on tiny
models; every bad task file or data file is one line naming the file, line and value, and leaves no artifact.
Also: GLUE files with a byte-order mark, and local Hugging Face dataset folders (offline)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from pipeline.data.loaders import load_task_data, resolve_source
from pipeline.data.tasks import custom_spec, get_task, load_task_file
from pipeline.errors import PipelineError
from tests.helpers import (
    INTENTS,
    LOOSE_GATES,
    ServerProcess,
    assert_one_line_error,
    cli_deploy,
    intent_task_file,
    quick_deploy,
    run_cli,
    sample_sentences,
)


def _pair_task(folder):
    """A two-label sentence-pair task in CSV with integer labels, quoted fields holding commas and newlines."""
    data = folder / "pairs"
    data.mkdir(parents=True, exist_ok=True)
    texts = sample_sentences()
    for name, lo, hi in (("train", 0, 160), ("dev", 160, 200)):
        with (data / f"{name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["question1", "question2", "is_duplicate"])
            for i in range(lo, hi):
                second = texts[i + 1] if i % 2 else texts[i] + ",\nagain"
                w.writerow([texts[i], second, i % 2])
    path = folder / "pairs.yaml"
    path.write_text(
        "name: dup-questions\ntrain: pairs/train.csv\ndev: pairs/dev.csv\n"
        "text_columns: [question1, question2]\nlabel_column: is_duplicate\nlabels: [0, 1]\nmetric: f1\n"
    )
    return path


@pytest.mark.e2e
def test_a_five_label_jsonl_task_deploys_end_to_end(base_dirs, tmp_path):
    task_file = intent_task_file(tmp_path)
    _, artifact = quick_deploy(
        "mlp_fusion", base_dirs["bert"], tmp_path, "--steps", "4", task=("--task-file", str(task_file))
    )
    assert artifact.name.startswith("intents-mlp_fusion-")
    config = json.loads((artifact / "config.json").read_text())
    assert config["id2label"] == {str(i): name for i, name in enumerate(INTENTS)}
    block = {
        "name": "intents",
        "kind": "sequence-classification",
        "labels": INTENTS,
        "text_columns": ["utterance"],
        "pair": False,
        "metric": "macro_f1",
        "max_length": 128,  # trained at: what the server reads at by default
        "positions": 160,  # the tiny model's position embeddings: the longest text the server takes
    }
    assert config["encoder_deploy_task"] == block
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["task"] == block and manifest["config"]["custom_task"]["labels"] == INTENTS
    report = json.loads((artifact / "report.json").read_text())
    validation = report["validation"]
    assert validation["metric"] == "macro_f1" and validation["examples"] == {"validation": 50, "dev": 32}
    dev = validation["metrics"]["dev"]["onnx_int8"]
    assert set(dev) == {"accuracy", "macro_f1"} and 0 <= dev["macro_f1"] <= 100
    assert "task files" in report["data"]["source"]

    from serving.session import ArtifactSession

    session = ArtifactSession(artifact)
    assert not session.pair and {p[0]["label"] for p in session.predict(sample_sentences()[:20])} <= set(INTENTS)

    # `pipeline evaluate` finds the task's own files through the manifest and agrees with validation
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "evaluate", str(artifact), "--split", "dev", "--max-examples", "32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    scored = json.loads(out.stdout)
    assert scored["metric"] == "macro_f1" and scored["metrics"]["onnx_int8"] == dev


@pytest.mark.e2e
def test_a_csv_pair_task_deploys_and_serves_pairs(base_dirs, tmp_path):
    task_file = _pair_task(tmp_path)
    budget = ("--steps", "4", "--set", "config.prune_steps=3", "--set", "config.recover_steps=2")
    _, artifact = quick_deploy("smp", base_dirs["bert"], tmp_path, *budget, task=("--task-file", str(task_file)))
    config = json.loads((artifact / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["encoder_deploy_task"]["pair"] is True
    report = json.loads((artifact / "report.json").read_text())
    assert report["validation"]["metric"] == "f1" and "f1" in report["validation"]["metrics"]["dev"]["onnx_fp32"]

    data = load_task_data(custom_spec(load_task_file(task_file)))
    assert data.dev.texts[0][1].endswith(",\nagain")  # row 160: even rows repeat the text, quoted
    pairs = data.dev.texts[:6]

    from transformers import AutoTokenizer, pipeline

    from pipeline.models.io import load_model
    from serving.session import ArtifactSession

    session = ArtifactSession(artifact)
    expected = session.predict(pairs)
    tokenizer = AutoTokenizer.from_pretrained(artifact)
    # transformers' pipeline on the artifact's torch model classifies the pairs as the graph does (Optimum's class
    # on the graph too: tests/consumer/)
    model = load_model(artifact / "pytorch")
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    got = classify([{"text": a, "text_pair": b} for a, b in pairs])
    assert [g["label"] for g in got] == [e[0]["label"] for e in expected]
    assert [g["score"] for g in got] == pytest.approx([e[0]["score"] for e in expected], abs=1e-4)

    import httpx

    with ServerProcess(artifact, log=tmp_path / "server.log") as proc:
        r = httpx.post(
            f"{proc.url}/predict", json={"inputs": [{"text": a, "text_pair": b} for a, b in pairs]}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert [row[0]["label"] for row in r.json()] == [e[0]["label"] for e in expected]
        single = httpx.post(f"{proc.url}/predict", json={"inputs": pairs[0][0]}, timeout=60)
        assert single.status_code == 422 and "classifies sentence pairs" in single.json()["error"]


def _bad(tmp_path, task_file):
    result = cli_deploy("--method", "mlp_fusion", "--task-file", str(task_file), "--output", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    return result


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"text_columns": ["utterance", "reply", "third"]}, "text_columns: give one text column, or two for a pair"),
        ({"labels": ["greet"]}, "labels: a classification task needs at least two labels"),
        ({"labels": ["greet", "greet"]}, "each label once"),
        ({"metric": "f1"}, "metric f1 is for two labels; 5 labels"),
        ({"metric": "auc"}, "metric: Input should be 'accuracy', 'f1', 'macro_f1', 'spearman'"),
        ({"name": "sst2"}, "name 'sst2' is a built-in task"),
        ({"train": "data/train.parquet"}, "train.parquet': the format comes from the extension, one of .tsv, .csv"),
        ({"label": "intent"}, "label: Extra inputs are not permitted"),
    ],
)
def test_bad_task_files_are_one_line_errors(tmp_path, changes, needle):
    result = _bad(tmp_path, intent_task_file(tmp_path, **changes))
    assert_one_line_error(result, needle)
    assert "intents.yaml" in result.stderr


def test_bad_data_files_name_the_file_line_and_value(tmp_path):
    task_file = intent_task_file(tmp_path)
    train = tmp_path / "data" / "train.jsonl"
    lines = train.read_text().splitlines()

    def with_line(n, obj):
        train.write_text("\n".join([*lines[: n - 1], json.dumps(obj), *lines[n:]]) + "\n")

    with_line(7, {"utterance": "hello", "intent": "order_pizza"})
    assert_one_line_error(_bad(tmp_path, task_file), "train.jsonl:7: label 'order_pizza' is not one of task intents")
    with_line(3, {"text": "hello", "intent": "greet"})
    assert_one_line_error(_bad(tmp_path, task_file), "train.jsonl:3: missing column(s) utterance; the object has")
    with_line(3, {"utterance": None, "intent": "greet"})
    assert_one_line_error(_bad(tmp_path, task_file), "train.jsonl:3: column 'utterance' is missing (null)")
    train.write_text("")
    assert_one_line_error(_bad(tmp_path, task_file), "train.jsonl: no examples")
    train.write_text('{"utterance": "hi", "intent": "greet"}\n[1, 2]\n')
    assert_one_line_error(_bad(tmp_path, task_file), "train.jsonl:2: expected a JSON object")

    pair_file = _pair_task(tmp_path)  # a pair task whose file lacks the second text column
    dev = tmp_path / "pairs" / "dev.csv"
    dev.write_text("question1,is_duplicate\nhow are you,1\n")
    assert_one_line_error(_bad(tmp_path, pair_file), "dev.csv: missing column(s) question2; header is question1")
    dev.write_text("question1,question2,is_duplicate\na,b,2\n")
    assert_one_line_error(_bad(tmp_path, pair_file), "dev.csv:2: label '2' is not one of task dup-questions's labels")
    dev.write_text("")
    assert_one_line_error(_bad(tmp_path, pair_file), "dev.csv: file is empty")


def test_task_options_are_exclusive(tmp_path):
    task_file = intent_task_file(tmp_path)
    both = cli_deploy("--method", "none", "--task", "sst2", "--task-file", str(task_file))
    assert_one_line_error(both, "name one task: --task or --task-file, not both")
    assert_one_line_error(cli_deploy("--method", "none"), "name a task: --task NAME")
    with_dir = cli_deploy("--method", "none", "--task-file", str(task_file), "--data-dir", str(tmp_path))
    assert_one_line_error(with_dir, "names its own train and dev files (--task-file): drop --data-dir")
    assert_one_line_error(cli_deploy("--method", "none", "--task-file", "nope.yaml"), "task file not found: nope.yaml")


def test_glue_files_with_a_byte_order_mark(tmp_path):
    """MRPC as GLUE ships it: UTF-8 with a BOM before the first column's name."""
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    rows = "".join(f"{i % 2}\t{i}\t{i + 1}\tsentence {i}\tsentence {i + 1}\n" for i in range(12))
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + (header + rows).encode())
    data = load_task_data("mrpc", tmp_path)
    assert data.dev.texts[0] == ("sentence 0", "sentence 1") and data.dev.labels[:2] == [0, 1]


def _rte_dataset():
    import datasets

    def part(n, offset):
        return {
            "sentence1": [f"premise {i}" for i in range(offset, offset + n)],
            "sentence2": [f"hypothesis {i}" for i in range(offset, offset + n)],
            "label": [i % 2 for i in range(n)],
            "idx": list(range(n)),
        }

    return datasets.DatasetDict(
        train=datasets.Dataset.from_dict(part(16, 0)), validation=datasets.Dataset.from_dict(part(6, 100))
    )


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet", "jsonl"])
def test_local_hugging_face_dataset_folders(tmp_path, layout):
    """Offline sources: `save_to_disk` output, or data files named by split (as the hub's parquet exports)."""
    ds = _rte_dataset()
    folder = tmp_path / "rte"
    if layout == "save_to_disk":
        ds.save_to_disk(str(folder))
    else:
        (folder / "data").mkdir(parents=True)
        for split, part in ds.items():
            target = folder / "data" / f"{split}-00000-of-00001.{layout}"
            part.to_parquet(str(target)) if layout == "parquet" else part.to_json(str(target), lines=True)
    spec = get_task("rte")
    assert resolve_source(spec, folder) == "hf-folder"
    data = load_task_data(spec, folder)
    assert data.dev.texts[0] == ("premise 100", "hypothesis 100") and data.dev.labels[:2] == [0, 1]
    assert len(data.train) + len(data.validation) == 16 and "offline" in data.source


def test_local_dataset_folder_errors(tmp_path):
    import datasets

    folder = tmp_path / "rte"
    ds = _rte_dataset()
    ds["train"] = ds["train"].rename_column("sentence2", "hypothesis")
    ds.save_to_disk(str(folder))
    with pytest.raises(PipelineError, match=r"split train has no column.s. sentence2; it has sentence1, hypothesis"):
        load_task_data("rte", folder)
    strings = datasets.DatasetDict(
        train=datasets.Dataset.from_dict(
            {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": ["entailment", "maybe"]}
        ),
        validation=datasets.Dataset.from_dict({"sentence1": ["a"], "sentence2": ["c"], "label": ["not_entailment"]}),
    )
    other = tmp_path / "strings"
    strings.save_to_disk(str(other))
    with pytest.raises(PipelineError, match=r"split train, row 1: label 'maybe' is not one of rte's labels"):
        load_task_data("rte", other)


@pytest.mark.e2e
def test_a_task_file_deploy_refuses_before_training(base_dirs, tmp_path):
    """A wrong label deep in the dev file stops the run before the teacher trains: nothing is cached or written."""
    task_file = intent_task_file(tmp_path)
    dev = tmp_path / "data" / "dev.jsonl"
    dev.write_text(dev.read_text() + json.dumps({"utterance": "x", "intent": 5}) + "\n")
    from tests.helpers import quick_args

    args, env = quick_args(
        "mlp_fusion", base_dirs["bert"], tmp_path, *LOOSE_GATES, task=("--task-file", str(task_file))
    )
    result = run_cli(args, env)
    assert result.returncode == 2 and "dev.jsonl:41: label 5 is not one of task intents" in result.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()
