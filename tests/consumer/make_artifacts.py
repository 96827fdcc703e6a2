"""Artifacts for the consumer check (`tests/consumer/test_loading.py`), made in the project's own environment.

`python -m tests.consumer.make_artifacts OUT` writes, under OUT: every family's tiny sequence classifier as the
export makes it; published tiny artifacts of each task kind (SST-2, an RTE pair task, CoNLL-2003 tags, SQuAD spans,
and an STS-B sentence embedder through the real `pipeline deploy`); and `expected.json`, what the project's own
serving session answers on each. The consumer virtualenv (transformers < 4.58, optimum-onnx, sentence-transformers'
ONNX backend, not this project) loads them as its users do and must answer the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from export.onnx import export_optimized
from pipeline.models.families import family_of
from serving.session import ArtifactSession
from serving.spans import MAX_ANSWER_LEN, window_stride
from serving.validation import Question
from tests.helpers import (
    FAMILY_TYPES,
    LOOSE_GATES,
    SHARED_DATA,
    quick_args,
    run_cli,
    sample_inputs,
    sample_sentences,
    tiny_artifact,
    tiny_family_model,
    write_tiny_model_dir,
)

QUESTION = "what comes first?"


def families(out: Path) -> dict:
    """Each family's classifier graph and the logits torch gives on a fixed padded batch (fp32), and ONNX
    Runtime on the int8 graph."""
    expected = {}
    for family in FAMILY_TYPES:
        model = tiny_family_model(family)
        folder = out / f"family-{family}"
        export_optimized(model, None, folder, fusion=family_of(model).ort_fusion)
        ids, mask = sample_inputs()
        feeds = {"input_ids": ids, "attention_mask": mask}
        if family_of(model).token_types:
            feeds["token_type_ids"] = torch.zeros_like(ids)
        with torch.no_grad():
            fp32 = model(**feeds).logits.numpy()
        session = ort.InferenceSession(str(folder / "model.int8.onnx"), providers=["CPUExecutionProvider"])
        int8 = session.run(["logits"], {i.name: feeds[i.name].numpy() for i in session.get_inputs()})[0]
        inputs = {name: value.tolist() for name, value in feeds.items()}
        expected[folder.name] = {"kind": "family", "inputs": inputs, "model.onnx": fp32.tolist(),
                                 "model.int8.onnx": int8.tolist()}  # fmt: skip
    return expected


def task_artifacts(out: Path) -> dict:
    """Published tiny artifacts of the classification and span kinds: the session's top answers on the fp32 graph,
    the int8 graph's outputs (`graph_outputs`)."""
    texts = sample_sentences("dev")[:6]
    sentences = sample_sentences("dev")
    # short contexts, and long ones the session cuts into overlapping windows as the pipeline does
    contexts = [" ".join(texts[i : i + 3]) for i in range(3)] + [" ".join(sentences[i : i + 12]) for i in (6, 30)]
    inputs = {
        "sst2": texts,
        "rte": list(zip(texts[:3], texts[3:], strict=True)),  # pairs: (text, text_pair) tuples
        "conll2003": texts,
        "squad": [{"question": QUESTION, "context": c} for c in contexts],
    }
    expected = {}
    for task, items in inputs.items():
        artifact = tiny_artifact(out, task)
        asked = [Question(**i) for i in items] if task == "squad" else items
        session = ArtifactSession(artifact, spinning=False)
        answers = [session.predict([item])[0] for item in asked]  # one item a call, as a pipeline runs them
        kind = json.loads((artifact / "config.json").read_text())["encoder_deploy_task"]["kind"]
        windows = {"max_answer_len": MAX_ANSWER_LEN, "max_seq_len": session.max_length,
                   "doc_stride": window_stride(session.max_length)}  # fmt: skip
        if task == "squad":
            assert max(len(session.encode([q])) for q in asked) > 1, "no context was windowed"
        graphs = {g: graph_outputs(artifact, g) for g in ("model.int8.onnx", "model.fp16.onnx")}
        expected[artifact.name] = {"kind": kind, "inputs": items, **windows, "model.onnx": answers, **graphs}
    return expected


def graph_outputs(artifact: Path, graph: str) -> dict:
    """The int8 or fp16 graph's outputs on a fixed padded batch, by output name. int8 quantises activations by each
    batch's range, and fp16 rounds, so a pipeline that pads otherwise than the session may flip a random model's
    near-tied answers: those graphs are compared tensor for tensor on the same inputs, the fp32 graph answer for
    answer."""
    ids, mask = sample_inputs()
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    session = ort.InferenceSession(str(artifact / graph), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(None, {n: feeds[n] for n in names})
    return {"inputs": {n: feeds[n].tolist() for n in names},
            "outputs": {o.name: v.tolist() for o, v in zip(session.get_outputs(), outputs, strict=True)}}  # fmt: skip


# the sentence-transformers layout's graphs, and the precision the serving session reads each from
ST_PRECISIONS = (
    ("onnx/model.onnx", "fp32"),
    ("onnx/model_qint8_avx512_vnni.onnx", "int8"),
    ("onnx/model_O4.onnx", "fp16"),
)


def embedder(out: Path) -> dict:
    """A sentence embedder published by the real command (the tiny base model as its own teacher, mean pooling),
    and the vectors its graphs give."""
    work = out / "embedding-work"
    base = write_tiny_model_dir(work / "base", classifier=False, layers=2, heads=4)
    (base / "1_Pooling").mkdir()
    (base / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    task = ("--task", "stsb", "--data-dir", str(SHARED_DATA / "stsb"))
    args, env = quick_args("none", base, work, *LOOSE_GATES, task=task, ephemeral=True)
    result = run_cli(args, env)
    if result.returncode != 0:
        raise SystemExit(f"the embedding deploy failed: {result.stderr[-2000:]}")
    artifact = Path(result.stdout.strip().splitlines()[-1]).rename(out / "stsb-tiny-embedder")
    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The cat sleeps on the mat."]
    answers = {
        graph: np.asarray(ArtifactSession(artifact, precision=precision, spinning=False).predict(texts))
        for graph, precision in ST_PRECISIONS
    }
    return {artifact.name: {"kind": "sentence-embedding", "inputs": texts,
                            **{graph: v.tolist() for graph, v in answers.items()}}}  # fmt: skip


def main(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: the consumer artifacts are made into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    expected = {**families(out), **task_artifacts(out), **embedder(out)}
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(f"{len(expected)} artifacts and their answers under {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
