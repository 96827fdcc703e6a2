"""Load and save classifiers of every supported family whose layers differ in FFN width, head count, or FFN scaling.

transformers builds every layer from one `intermediate_size` and one `num_attention_heads`, so a compacted
model cannot round-trip through `from_pretrained` (it fails, or with `ignore_mismatched_sizes` silently
re-initialises the shrunk layers). We record the per-layer shapes in `config.json`
(`intermediate_sizes`, `layer_heads`, and what a family needs beyond them), rebuild those layers at their real
sizes before loading, and load the weights with `strict=True`, so any mismatch is an error, never a
re-initialisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from pipeline.errors import PipelineError, one_line
from pipeline.jsonfile import read_json_object
from pipeline.models.families import family_of
from pipeline.models.folders import check_model_dir, head_kind, safetensors_header
from pipeline.models.heads import HEAD_NAME, install_verbalizer_
from pipeline.models.layers import ScaledLinear, ffn_widths, head_counts, resize_ffn_, resize_heads_
from serving.artifact import EMBEDDING, HEAD_SUFFIXES

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from pipeline.data.tasks import TaskSpec

# The classification head's module in every family, the only part a new label count replaces (a question-answering
# head always has two outputs, start and end, so it is never replaced)
LABEL_HEAD = "classifier"


def auto_class(kind: str):
    """The transformers `AutoModelFor...` class of a task kind (sentence embeddings: `SentenceEmbedder`, which builds
    from a config the same way)."""
    if kind == EMBEDDING:
        from pipeline.models.embedding import SentenceEmbedder

        return SentenceEmbedder
    import transformers

    return getattr(transformers, f"AutoModel{HEAD_SUFFIXES[kind]}")


def model_kind(config) -> str | None:
    """The kind of the model a config describes: its head's, or sentence embeddings where it records a pooling."""
    pooling = config.get("sentence_pooling") if isinstance(config, dict) else getattr(config, "sentence_pooling", None)
    return EMBEDDING if pooling else head_kind(config)


def load_base_model(path: str | Path, task: TaskSpec, seed: int = 0) -> PreTrainedModel:
    """A pretrained encoder with the head of `task`'s kind (sequence or token classification, question
    answering), ready for fine-tuning; whatever is new in it (the head) drawn from `seed` alone (`_seeded_`).

    Only the head may be new: a classifier saved at per-layer shapes (a compacted one, e.g. an artifact's
    `pytorch/`) loads through `load_model`, keeping every layer as it is, and keeps its head when the label count
    matches (else gets a fresh one); any other folder loads through transformers, and a mismatch anywhere but the
    head is an error, never a silent re-initialisation.
    """
    config = check_model_dir(path)
    if task.kind == EMBEDDING:
        return _base_embedder(path, config)
    labels = {"num_labels": task.num_labels}
    if task.labels:  # question answering's two outputs (start, end) have no label names
        labels.update(id2label=dict(enumerate(task.labels)), label2id={name: i for i, name in enumerate(task.labels)})
    auto = auto_class(task.kind)
    per_layer = "intermediate_sizes" in config or "layer_heads" in config  # saved by `save_model`
    if per_layer and head_kind(config) == task.kind and Path(path, "model.safetensors").is_file():
        model = load_model(path)
        if model.config.num_labels != task.num_labels:
            if getattr(model.config, "classifier_head", None) == HEAD_NAME:
                raise PipelineError(
                    f"{path}: its verbalizer head has {model.config.num_labels} label words; task "
                    f"{task.name} has {task.num_labels} labels"
                )
            fresh = auto.from_config(read_config(path, **labels))
            model.set_submodule(LABEL_HEAD, fresh.get_submodule(LABEL_HEAD))
            _seeded_(model, {name for name, _ in model.named_parameters() if name.startswith(f"{LABEL_HEAD}.")}, seed)
        for key, value in labels.items():
            setattr(model.config, key, value)
        return model
    try:
        model, info = auto.from_pretrained(
            str(path), ignore_mismatched_sizes=True, output_loading_info=True, use_safetensors=True, **labels
        )
    except Exception as e:
        raise PipelineError(f"cannot load model from {path}: {one_line(e)}") from None
    # plain keys here; (key, shapes) tuples in some transformers versions
    keys = [k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", [])]
    mismatched = sorted(key for key in keys if not key.startswith(f"{LABEL_HEAD}."))  # 5.x reports them unordered
    if mismatched:
        raise PipelineError(f"cannot load {path}: shapes differ from its config in {', '.join(mismatched[:4])}")
    return _seeded_(model, set(info.get("missing_keys", [])) | set(keys), seed)


def _seeded_(model: PreTrainedModel, new: set[str], seed: int) -> PreTrainedModel:
    """`model` with the parameters named in `new` (those the checkpoint did not hold) drawn again from a generator
    seeded with `seed`, as BERT initialises them (linear: normal with the config's `initializer_range`, bias 0;
    LayerNorm: 1 and 0). transformers draws a new head from the process's global generator, and how many numbers
    its loading takes first differs between releases (4.57 and 5.x give the same seed different heads, and so
    different teachers); drawn here, a seed makes the same head on every release and in any process state."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, module in sorted(model.named_modules(), key=lambda item: item[0]):
            own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
            if not own or not set(own) <= new:
                continue
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                if module.bias is not None:  # ModernBERT's have none
                    module.bias.zero_()
    return model


def _base_embedder(path: str | Path, config: dict):
    """A sentence-embedding model from a folder: one saved at per-layer shapes (a compacted student) as it is, else
    the folder's encoder (sentence-transformers' layout or a plain one; a task head in it is left out) with the
    folder's pooling."""
    from transformers import AutoModel

    from pipeline.models.embedding import SentenceEmbedder, encoder_options, folder_pooling

    if model_kind(config) == EMBEDDING and ("intermediate_sizes" in config or "layer_heads" in config):
        return load_model(path)
    pooling = folder_pooling(path)
    options = encoder_options(read_config(path))
    try:
        encoder, info = AutoModel.from_pretrained(str(path), output_loading_info=True, use_safetensors=True,
                                                  **options)  # fmt: skip
    except Exception as e:
        raise PipelineError(f"cannot load model from {path}: {one_line(e)}") from None
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]
    if missing:
        raise PipelineError(
            f"cannot load {path} as an encoder: {len(missing)} weights missing ({', '.join(missing[:3])})"
        )
    return SentenceEmbedder(encoder, pooling)


def read_config(path: str | Path, **fields):
    """transformers' config of a model folder. transformers 5 validates each field's type as the config is built;
    a config.json its model type cannot build is a one-line refusal, not a traceback."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), **fields)
    except Exception as e:
        model_type = read_json_object(Path(path) / "config.json").get("model_type")
        why = " ".join(str(e).split())[:300]  # 5.x's validation says which field on the message's second line
        raise PipelineError(f"{path}: config.json is not a valid {model_type} config: {why}") from None


def check_weights_agree(path: str | Path) -> None:
    """The folder's weights have the shapes its config builds (a model on the meta device: nothing allocated, no
    weight read); a task head of another label count is allowed. Folders saved at per-layer shapes are checked
    when they load (strictly).

    Raises:
        PipelineError: a weight's shape differs from the config's, in one line naming the first few.
    """
    import torch
    from transformers import AutoModel

    config = read_config(path)
    if getattr(config, "layer_heads", None) is not None or getattr(config, "intermediate_sizes", None) is not None:
        return
    kind = head_kind(config)
    with torch.device("meta"):
        model = (auto_class(kind) if kind else AutoModel).from_config(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    prefix = model.base_model_prefix + "."
    header = safetensors_header(Path(path) / "model.safetensors")
    wrong = []
    for key, tensor in header.items():
        name = key if key in expected else prefix + key if prefix + key in expected else key.removeprefix(prefix)
        if name in expected and tuple(tensor["shape"]) != expected[name] and not name.startswith(f"{LABEL_HEAD}."):
            wrong.append(f"{key} {tuple(tensor['shape'])} vs {expected[name]}")
    if wrong:
        raise PipelineError(f"{path}: the weights disagree with config.json: {'; '.join(wrong[:3])}")
    # Every weight of the encoder must be there, under its own name or the base model's prefix: weights of another
    # family (BERT's under a config saying deberta-v2) match no name, and transformers would load them as a
    # randomly initialised model or fail inside the teacher stage. A pooler and task heads may be new.
    base = model.base_model.state_dict()
    missing = [n for n in base if n not in header and prefix + n not in header and not n.startswith("pooler.")]
    if missing:
        unknown = sorted((k for k in header if k.removeprefix(prefix) not in base), key=lambda k: "weight" not in k)
        raise PipelineError(
            f"{path}: the weights are not those of a {config.model_type} model (config.json's model_type): "
            f"{len(missing)} of its {len(base)} weights are missing (e.g. {', '.join(missing[:2])}); the file holds "
            f"{len(unknown)} it does not know (e.g. {', '.join(unknown[:2]) or 'none'})"
        )


def load_model(path: str | Path) -> PreTrainedModel:
    """Load a model with a task head (sequence or token classification, question answering) saved by
    `save_model` (or any standard one), at its real per-layer shapes.

    Raises:
        PipelineError: the folder holds no task head, or any weight is missing, unexpected or mis-shaped.
    """
    path = Path(path)
    check_model_dir(path, need_tokenizer=False)
    config = read_config(path)
    kind = model_kind(config)
    if kind is None:
        raise PipelineError(f"{path} holds no sequence classifier, token classifier or question-answering head, nor "
                            f"a sentence embedder (architectures: {config.architectures})")  # fmt: skip
    from safetensors.torch import load_file

    model = auto_class(kind).from_config(config)
    if getattr(config, "classifier_head", None) == HEAD_NAME:  # SMP's label-word head
        install_verbalizer_(model)
    state = load_file(str(path / "model.safetensors"))
    family = family_of(model)
    family.rebuild_(model)
    writer = family.ffn_writer.path
    for i, block in enumerate(family.layers(model)):
        prefix = f"{model.base_model_prefix}.{family.layers_path}.{i}"
        out = state.get(f"{prefix}.{family.head_writer.path}.weight")
        # no output projection weight: a layer saved with 0 heads (strict loading still fails on any other key)
        heads = 0 if out is None else out.shape[1] // family.head_size(block)
        if heads != family.heads(block):
            resize_heads_(family, block, heads)
        fc2 = state.get(f"{prefix}.{writer}.weight")
        if fc2 is not None and fc2.shape[1] != block.get_submodule(writer).in_features:
            resize_ffn_(family, block, fc2.shape[1])
        scale = state.get(f"{prefix}.{writer}.scale")
        if scale is not None:  # MLP Fusion's cluster sizes, not yet folded (a compressed, uncompacted model)
            block.set_submodule(writer, ScaledLinear(block.get_submodule(writer), scale))
        family.prepare_load_(block, prefix, state)
    _check_declared_shapes(model, config, path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise PipelineError(f"cannot load {path}: {one_line(e)}") from None
    return model.eval()


def _check_declared_shapes(model: nn.Module, config, path: Path) -> None:
    for key, actual in (("intermediate_sizes", ffn_widths(model)), ("layer_heads", head_counts(model))):
        declared = getattr(config, key, None)
        if declared is not None and list(declared) != actual:
            raise PipelineError(f"{path}: config {key}={declared} disagrees with the weights ({actual})")


def save_weights(model: PreTrainedModel, path: str | Path) -> None:
    """`model.save_pretrained` in safetensors, without the progress bar transformers 5 draws for every save (one
    shard a model here: noise between the stages' log lines)."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(path), safe_serialization=True)
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path) -> Path:
    """Save weights (safetensors), tokenizer and a config that records every layer's FFN width and heads."""
    path = Path(path)
    config = model.config
    config.intermediate_sizes = ffn_widths(model)
    config.layer_heads = head_counts(model)
    family = family_of(model)
    for key, values in family.layer_record(model).items():
        setattr(config, key, values)
    setattr(config, family.ffn_field, max(config.intermediate_sizes))  # keep the scalar honest for tools that read it
    save_weights(model, path)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path
