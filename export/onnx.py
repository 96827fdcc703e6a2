"""ONNX export of an in-memory (compacted) model, ORT transformer fusion, and dynamic int8 quantisation.

We export the in-memory model ourselves (`export_onnx`): reloading a compacted folder through a stock loader would
fail on per-layer widths, and an exporter library's pins would hold back the transformers users have. The graph's
names and axes are Optimum's, so its `ORTModelFor*` classes load the artifact as their own export. TorchScript's
tracer on purpose: ORT's attention fusion does not recognise graphs from the dynamo exporter.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from export.attention_graph import eager_attention, name_heads
from export.int8 import REDUCE_RANGE
from serving.artifact import EMBEDDING, QA, SEQUENCE, TOKEN, kind_of_class

log = logging.getLogger(__name__)

OPSET = 18
EXPORT_LIBRARIES = ("torch", "transformers", "onnx", "onnxruntime")  # what makes the graphs (a dense-graph cache key)


def library_versions(names: tuple[str, ...] = EXPORT_LIBRARIES) -> dict[str, str]:
    """The installed versions of `names` (those installed). ONNX Runtime's is the imported module's own:
    onnxruntime-gpu installs under another distribution name beside (or instead of) onnxruntime, whose version may
    be another one."""
    from importlib import metadata

    import onnxruntime

    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    if "onnxruntime" in names:
        found["onnxruntime"] = onnxruntime.__version__
    return found


def graph_structure(path: Path) -> str:
    """A digest of the work an ONNX graph does, without its weights or names: every node's operator, domain and
    attributes in order (float attributes left out: an epsilon or a mask's fill value changes no kernel's work, and
    the fused attention carries a fill value under transformers 4 and none under 5), and the shapes and types of the
    inputs, outputs and initialisers. Two exports that agree here run the same kernels on the same shapes, whichever
    library versions made them."""
    import hashlib

    import onnx
    from onnx import helper, numpy_helper

    def attribute(a: onnx.AttributeProto) -> str:
        value = helper.get_attribute_value(a)
        if isinstance(value, onnx.TensorProto):  # a constant: its values (shape constants, small) matter
            value = (
                tuple(value.dims),
                value.data_type,
                hashlib.sha256(numpy_helper.to_array(value).tobytes()).hexdigest(),
            )
        elif isinstance(value, onnx.GraphProto):
            value = len(value.node)
        return f"{a.name}={value!r}"

    graph = onnx.load(str(path), load_external_data=False).graph
    h = hashlib.sha256()
    for node in graph.node:
        work = [a for a in node.attribute if a.type not in (onnx.AttributeProto.FLOAT, onnx.AttributeProto.FLOATS)]
        h.update(f"{node.domain}:{node.op_type}({','.join(sorted(map(attribute, work)))})\n".encode())
    for part in (graph.input, graph.output):
        h.update(str([str(v.type) for v in part]).encode())
    h.update(str(sorted((tuple(t.dims), t.data_type) for t in graph.initializer)).encode())
    return h.hexdigest()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter's tracer warnings and the quantiser's root-logger advice (both expected here)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)
        hf_logging.set_verbosity(verbosity)


INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")  # Optimum's order, which the server feeds by name
BATCH, TOKENS = {0: "batch_size"}, {0: "batch_size", 1: "sequence_length"}  # Optimum's axis names
# Each head's graph outputs, named and shaped as Optimum's exporter writes them (what `ORTModelFor*` reads).
HEAD_OUTPUTS = {
    SEQUENCE: {"logits": BATCH},
    TOKEN: {"logits": TOKENS},
    QA: {"start_logits": TOKENS, "end_logits": TOKENS},
    EMBEDDING: {"last_hidden_state": TOKENS, "sentence_embedding": BATCH},
}


def export_onnx(model, tokenizer, out_dir: str | Path, opset: int = OPSET) -> Path:
    """Export `model` to `out_dir/model.onnx` (dynamic batch and sequence axes) with its config and tokenizer.

    The graph's outputs are its head's (`HEAD_OUTPUTS`, the kind read from the model's class): `logits` (sequence
    or token classification), `start_logits` and `end_logits` (question answering), or for a sentence-embedding
    model `last_hidden_state` (B, T, D), every token after any projection (what sentence-transformers' ONNX backend
    reads, pooling in torch), and `sentence_embedding` (B, D), pooled and normalised in the graph (what Text
    Embeddings Inference and the server read). Names, order and axes are Optimum's, so `ORTModelFor*` and
    sentence-transformers load the folder as their own export; config.json is the model's (an embedder's
    architecture the bare encoder's).

    `torch.onnx.export` with TorchScript's tracer (`dynamo=False`), as Optimum's exporter does: ORT's attention
    fusion recognises its graphs, not the dynamo exporter's; doing it here keeps artifact production free of
    optimum's pins (its releases trail transformers'). The wrapper is put in eval mode itself: the exporter
    restores the wrapper's mode after tracing, and a fresh module's is training, which would leave `model`'s
    dropout on. The attention is traced in the form ORT's fuser recognises (`export.attention_graph`).
    """
    import torch

    out_dir = Path(out_dir)
    kind = EMBEDDING if hasattr(model, "pooling") else head_kind(model)  # SentenceEmbedder: no task head
    outputs = HEAD_OUTPUTS[kind]
    names = graph_inputs(model.config)

    class Outputs(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = self.inner(**dict(zip(names, args, strict=True)))
            return tuple(getattr(out, name) for name in outputs)

    ids = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    sample = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    with _quiet(), torch.no_grad(), eager_attention(model):
        torch.onnx.export(
            Outputs(model).eval(),
            tuple(sample[n] for n in names),
            str(path),
            input_names=names,
            output_names=list(outputs),
            dynamic_axes={**dict.fromkeys(names, TOKENS), **outputs},
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    name_heads(path)
    config = copy.deepcopy(model.config)  # as `save_pretrained` writes it: the architecture is the exported class
    config.architectures = [type(model.base_model if kind == EMBEDDING else model).__name__]
    config.save_pretrained(str(out_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))
    return path


def graph_inputs(config) -> list[str]:
    """The graph's inputs, in Optimum's order: `token_type_ids` only where the model has segment types to tell
    apart (BERT's and ELECTRA's two; RoBERTa's single type and DeBERTa-v2's none make it a constant), as Optimum's
    per-family export configs decide."""
    types = getattr(config, "type_vocab_size", 0) or 0
    return [n for n in INPUT_ORDER if n != "token_type_ids" or types > 1]


def head_kind(model) -> str:
    """The task kind of a transformers model with a task head (its class says which)."""
    kind = kind_of_class(type(model).__name__)
    if kind is None:
        raise ValueError(f"{type(model).__name__} has no sequence-classification, token-classification or "
                         "question-answering head")  # fmt: skip
    return kind


def _pruned_heads_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Input hidden size")


def optimize_onnx(
    src: str | Path,
    dst: str | Path,
    embed_layer_norm: bool = True,
    gelu_approximation: bool = False,
    model_type: str | None = "bert",
) -> dict[str, int]:
    """Fuse attention, GELU and LayerNorm with ORT's transformer optimizer (hardware-independent, opt_level 0), by
    the fuser of `model_type` (the family's `ort_fusion`; None: no fusion, the graph is copied as exported).

    Heads and hidden size are detected per layer from the graph (num_heads=0), which is what makes fusion
    work for layers with different head counts. EmbedLayerNormalization fusion is on (Optimum turns it off) and
    the GELU approximation off: `benchmarks/int8_modes.py` measures both choices.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    if model_type is None:
        shutil.copyfile(src, dst)
        return {}
    options = FusionOptions(model_type)
    options.enable_embed_layer_norm = embed_layer_norm
    options.enable_gelu_approximation = gelu_approximation
    # A layer with pruned heads has fewer Q/K/V outputs (heads x head size) than the hidden size its inputs have; the
    # fusion detects both and fuses correctly, but warns for each such layer that the user should "provide a
    # correct input hidden size": noise in every pruned deploy's log, so that one message is dropped.
    attention_log = logging.getLogger("fusion_attention")
    attention_log.addFilter(_pruned_heads_notice)
    try:
        opt = optimize_model(
            str(src), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0, optimization_options=options
        )
    finally:
        attention_log.removeFilter(_pruned_heads_notice)
    opt.save_model_to_file(str(dst))
    return {k: v for k, v in opt.get_fused_operator_statistics().items() if v}


def quantize_int8(src: str | Path, dst: str | Path, keep_fp32: Sequence[str] = ()) -> dict[str, int]:
    """Dynamic int8 quantisation of weights (per output channel, 7-bit: `REDUCE_RANGE`; activations quantised at
    run time).

    Per-channel weight scales: on real SST-2 dev, per-tensor int8 lost 1.4 points against fp32 for the default
    MLP Fusion model and per-channel 0.6, at the same speed (signed int8 weights; unsigned ones were 1.5x slower).

    The fused graph needs symbolic shape inference first, or the quantiser cannot find the type of the
    attention output MatMul (onnxruntime: "Unable to find data type for weight_name").
    MatMuls with an empty weight (a zero-width FFN layer) stay fp32: ORT's MatMulInteger leaves its output
    uninitialised when the inner dimension is 0 (garbage that changes from run to run), while fp32 MatMul
    correctly returns zeros. `keep_fp32` names more nodes to leave in fp32 (`benchmarks/int8_modes.py` measures
    what keeping the head or the FFN outputs in fp32 gives).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Dynamic quantisation first rewrites every Gemm (a classifier's or pooler's linear) as a MatMul named
    # `<name>_MatMul` plus an Add, and matches `nodes_to_exclude` against the rewritten names: a Gemm named as in
    # the fp32 graph would be quantised all the same.
    keep = [alias for name in keep_fp32 for alias in (name, f"{name}_MatMul")]
    with _shaped(src) as (shaped, empty), _quiet():
        quantize_dynamic(
            str(shaped),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=REDUCE_RANGE,
            nodes_to_exclude=empty + keep,
        )
    return op_counts(dst)


def convert_fp16(src: str | Path, dst: str | Path) -> dict[str, int]:
    """The fused fp32 graph `src` in fp16 (weights and activations), for CUDA: inputs and outputs stay as they were
    (int64 ids in, fp32 logits or vectors out), and the ops ORT's converter keeps in fp32 by default stay fp32 (it
    casts around them). ORT's CPU provider runs it too, so its accuracy gate is measured on every machine; on the
    CPU it is no faster than fp32 (AVX-512 EPYC, 8 x 128: 30.1 against 28.7 ms, docs/results.md), so the CPU
    benchmark does not time it."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    with _quiet():
        model.convert_float_to_float16(keep_io_types=True)
    onnx.save(model.model, str(dst))
    return op_counts(dst)


@contextlib.contextmanager
def _shaped(src: str | Path) -> Iterator[tuple[Path, list[str]]]:
    """`src` after symbolic shape inference (a temporary file), and the MatMuls with an empty weight, which
    must stay fp32 (see `quantize_int8`)."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    graph = SymbolicShapeInference.infer_shapes(onnx.load(str(src)), auto_merge=True)
    empty = {t.name for t in graph.graph.initializer if 0 in t.dims}
    keep_fp32 = [n.name for n in graph.graph.node if n.op_type == "MatMul" and empty.intersection(n.input)]
    with tempfile.TemporaryDirectory() as tmp:
        shaped = Path(tmp) / "shaped.onnx"
        onnx.save(graph, str(shaped))
        yield shaped, keep_fp32


def quantize_static_int8(src: str | Path, dst: str | Path, features: list[dict[str, list[int]]]) -> dict[str, int]:
    """Static QDQ int8: MatMul/Gemm weights per channel, activations at scales calibrated (min-max) on `features`
    (tokenised examples, `Encoded.features`), fed one at a time.

    Unlike dynamic int8, the activation scales are constants, so a sentence's scores do not depend on what it is
    batched with. `MatMulConstBOnly` keeps the attention's activation-by-activation MatMuls in fp32 (ORT's
    static default would quantise them, at a cost in accuracy), as dynamic mode does.
    """
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    names = [i.name for i in onnx.load(str(src), load_external_data=False).graph.input]
    feeds = ({n: np.asarray([f[n]], dtype=np.int64) for n in names} for f in features)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = feeds

        def get_next(self):
            return next(self.it, None)

    with _shaped(src) as (shaped, keep_fp32), _quiet():
        quantize_static(
            str(shaped),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=True,
            reduce_range=REDUCE_RANGE,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=keep_fp32,
            extra_options={"MatMulConstBOnly": True},
        )
    return op_counts(dst)


def op_counts(path: str | Path) -> dict[str, int]:
    import onnx

    return dict(Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node).most_common())


def export_optimized(
    model,
    tokenizer,
    out_dir: str | Path,
    stem: str = "model",
    calibration: list[dict] | None = None,
    fusion: str | None = "bert",
    fp16: bool = False,
) -> dict:
    """Export, optimise and quantise into `out_dir`: `{stem}.onnx` (fp32, fused by ORT's `fusion` fuser: the model
    family's, `Family.ort_fusion`), `{stem}.int8.onnx` (dynamic int8, or static QDQ calibrated on the tokenised
    examples `calibration` when given) and with `fp16`, `{stem}.fp16.onnx` (`convert_fp16`).

    The exporter's `config.json` and tokenizer files land in `out_dir` too (when `tokenizer` is given).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        raw = export_onnx(model, tokenizer, tmp)
        for f in Path(tmp).iterdir():
            if f.suffix != ".onnx":
                shutil.move(str(f), out_dir / f.name)
        fused = optimize_onnx(raw, out_dir / f"{stem}.onnx", model_type=fusion)
    fp32, int8 = out_dir / f"{stem}.onnx", out_dir / f"{stem}.int8.onnx"
    static = calibration is not None
    quantized = quantize_static_int8(fp32, int8, calibration) if static else quantize_int8(fp32, int8)
    kinds = ("MatMulInteger", "QAttention", "QuantizeLinear", "DequantizeLinear")
    report = {
        "fused_ops": fused,
        "int8": "static" if static else "dynamic",
        "int8_ops": {k: v for k, v in quantized.items() if k in kinds},
    }
    if fp16:  # the Casts left: where the converter kept fp32 (inputs, outputs, ops it blocks)
        report["fp16_casts"] = convert_fp16(fp32, out_dir / f"{stem}.fp16.onnx").get("Cast", 0)
    return report
