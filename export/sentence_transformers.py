"""The sentence-transformers and Text Embeddings Inference layout of a sentence-embedding artifact, beside its graphs.

sentence-transformers (`SentenceTransformer(dir, backend="onnx")`) reads `modules.json` (Transformer, Pooling,
Normalize), `1_Pooling/config.json`, `sentence_bert_config.json` and the graph under `onnx/`: `onnx/model.onnx`, or
the int8 one by the name its own quantiser gives (`model_kwargs={"file_name": "onnx/model_qint8_avx512_vnni.onnx"}`).
It feeds the tokenizer's inputs, reads `last_hidden_state` and pools in torch. Text Embeddings Inference reads the
root `model.onnx`, `tokenizer.json` and a `config.json` whose architecture is the bare encoder's, and takes
`sentence_embedding` when the graph has it. The graphs under `onnx/` are hard links to the root ones where the file
system allows (copies elsewhere): the same bytes, listed twice in the manifest.
"""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import version
from pathlib import Path

from export.releases import optimum_onnx

# sentence-transformers' own names: its int8 export's, and O4 (its optimised fp16 level, for GPUs) for fp16
ST_GRAPHS = {
    "model.onnx": "onnx/model.onnx",
    "model.int8.onnx": "onnx/model_qint8_avx512_vnni.onnx",
    "model.fp16.onnx": "onnx/model_O4.onnx",
}
MODULES = "modules.json"
POOLING = "1_Pooling/config.json"
ST_CONFIG = "sentence_bert_config.json"
ST_MODEL_CONFIG = "config_sentence_transformers.json"


def write_layout(folder: str | Path, width: int, pooling: str, max_length: int, versions: dict[str, str]) -> list[str]:
    """Write the layout into `folder` (which holds `model.onnx`, `model.int8.onnx` and `model.fp16.onnx`); `width`:
    the embedding's dimension, `pooling`: mean or cls, `max_length`: the tokens per text it was trained and
    validated at. Returns the files written."""
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    modes = {
        "word_embedding_dimension": width,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    files = {
        MODULES: modules,
        POOLING: modes,
        ST_CONFIG: {"max_seq_length": max_length, "do_lower_case": False},
        ST_MODEL_CONFIG: {"__version__": versions, "similarity_fn_name": "cosine"},
    }
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2) + "\n")
    (folder / "2_Normalize").mkdir(exist_ok=True)
    for src, dst in ST_GRAPHS.items():
        target = folder / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / src, target)
        except OSError:
            shutil.copy2(folder / src, target)
    return [*files, *ST_GRAPHS.values()]


def quantisation_config() -> str:
    """The config sentence-transformers' quantiser names for this CPU (what its user here would pick): avx512_vnni,
    avx512, avx2 or arm64."""
    import platform

    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def st_onnx_missing() -> str | None:
    """Why sentence-transformers' ONNX backend cannot run here (None: it can): it runs through optimum-onnx."""
    if optimum_onnx():
        return None
    return (
        "sentence-transformers' ONNX export needs optimum-onnx (`pip install optimum-onnx[onnxruntime]`), "
        f"which requires transformers < 4.58 (installed: {version('transformers')})"
    )


def dense_int8_baseline(model_dir: str | Path, out: str | Path) -> dict:
    """sentence-transformers' own dynamic-int8 ONNX export of the dense model in `model_dir` (its
    `export_dynamic_quantized_onnx_model`, the int8 graph its users get for free), written to `out`: the benchmark's
    third baseline. Returns what was made."""
    import tempfile

    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    config = quantisation_config()
    with tempfile.TemporaryDirectory() as tmp:
        model = SentenceTransformer(str(model_dir), backend="onnx", device="cpu")
        export_dynamic_quantized_onnx_model(model, config, tmp)
        made = next(Path(tmp).rglob("*.onnx"))
        shutil.move(str(made), out)
    return {"library": "sentence-transformers", "quantization_config": config, "file": Path(out).name}
