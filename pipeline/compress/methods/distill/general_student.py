"""A general student's starting point: a smaller encoder of the teacher's family at a chosen shape (layers, hidden
size, heads, FFN width), either cut from the pre-trained teacher or initialised at random.

Cut from the teacher: its layers are picked as distillation picks them (`uniform`: every k-th, ending with the
top one), each layer keeps its most important heads and FFN neurons (`compaction.narrow_`, by weight norms), and
the hidden size, which every matrix shares, keeps the dimensions that carry the most weight: a dimension's score
sums, over every tensor that has it, the tensor's mean square at that dimension over its mean square overall (so a
small LayerNorm counts as much as a large matrix). Heads are kept whole, so a narrower hidden size keeps
hidden / head size heads. A student of the teacher's own shape is the teacher, unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from pipeline.compress.compaction import cut_from
from pipeline.compress.methods.distill.config import StudentConfig, pick_layers
from pipeline.errors import PipelineError
from pipeline.models.families import family_for
from pipeline.models.layers import encoder_layers

PER_LAYER_RECORDS = ("intermediate_sizes", "layer_heads")


def student_config(teacher_config: Any, layers: int, hidden: int, heads: int, ffn: int) -> Any:
    """The teacher's config at the student's uniform shape (vocabulary, positions, activation: the teacher's)."""
    family = family_for(teacher_config.model_type)
    config = copy.deepcopy(teacher_config)
    for key in PER_LAYER_RECORDS:
        if hasattr(config, key):
            delattr(config, key)
    setattr(config, family.layers_field, layers)
    config.hidden_size, config.num_attention_heads = hidden, heads
    setattr(config, family.ffn_field, ffn)
    return config


def build_general_student(
    teacher: nn.Module, shape: dict[str, int], init: str, seed: int, keep: list[int] | None = None
) -> tuple[nn.Module, dict]:
    """An encoder at `shape` {layers, hidden, heads, ffn}, and how it was made: a base encoder from a base
    teacher, or a model with the teacher's task head (narrowed like every other tensor) from a fine-tuned one.
    `keep`: the teacher layers it starts from (default: the uniform pick).

    Weights of the student that the cut teacher lacks (a pooler the teacher did not load) keep their random
    initialisation; weights of the cut teacher that the student's structure lacks (ModernBERT's first layer has no
    attention norm, so the picked layer's goes) are dropped. Both are listed in the report.
    """
    from transformers import AutoModel

    config = student_config(teacher.config, shape["layers"], shape["hidden"], shape["heads"], shape["ffn"])
    torch.manual_seed(seed)
    embedder = hasattr(teacher, "pooling")  # pipeline.models.embedding.SentenceEmbedder
    if embedder:
        config.sentence_projection = teacher.width if shape["hidden"] != teacher.width else None
        student = type(teacher).from_config(config)
    else:
        with_head = teacher.base_model is not teacher  # a base model is its own base_model
        student = type(teacher)(config) if with_head else AutoModel.from_config(config)
    if init == "random":
        return student, {"init": "random", "seed": seed}
    keep = keep or pick_layers(len(encoder_layers(teacher)), StudentConfig(layers=shape["layers"]))
    cut, _ = cut_from(teacher, keep, shape["heads"], shape["ffn"])
    mine, theirs = student.state_dict(), cut.state_dict()
    shared = {k: v for k, v in theirs.items() if k in mine}
    state, hidden_kept = sliced_to(shared, {k: mine[k] for k in shared}, teacher.config.hidden_size)
    if embedder and student.projection is not None and "projection.weight" not in theirs:
        state.update(_placing(hidden_kept, student.projection))
    student.load_state_dict({**mine, **state}, strict=True)
    info = {"init": "teacher", "teacher_layers": keep, "hidden_kept": hidden_kept}
    info["random"] = sorted(set(mine) - set(theirs) - set(state))
    info["dropped"] = sorted(set(theirs) - set(mine))
    return student, info


def _placing(kept: list[int], projection: nn.Linear) -> dict[str, torch.Tensor]:
    """A narrowed embedder's projection to its teacher's width, started as the map that puts each kept hidden
    dimension back where it was in the teacher (zero elsewhere, no bias): at step 0 the student's vectors are the
    teacher's kept dimensions, in the teacher's space."""
    weight = torch.zeros_like(projection.weight)
    weight[torch.tensor(kept), torch.arange(len(kept))] = 1.0
    return {"projection.weight": weight, "projection.bias": torch.zeros_like(projection.bias)}


def sliced_to(
    source: dict[str, torch.Tensor], target: dict[str, torch.Tensor], width: int
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """`source` (the cut teacher) with its hidden dimensions narrowed to the target's shapes, the most important
    kept (in their order); returns it and the kept dimensions. Any other difference is an error."""
    narrow = {
        k: [d for d, (a, b) in enumerate(zip(v.shape, target[k].shape, strict=True)) if a != b]
        for k, v in source.items()
    }
    hidden = next((target[k].shape[dims[0]] for k, dims in narrow.items() if dims), width)
    for k, dims in narrow.items():
        for d in dims:
            if (source[k].shape[d], target[k].shape[d]) != (width, hidden):
                raise PipelineError(
                    f"cannot initialise the student from the teacher: {k} is {tuple(source[k].shape)} in the cut "
                    f"teacher and {tuple(target[k].shape)} in the student (only the hidden size may differ: "
                    "keep the teacher's head size, or use init random)"
                )
    score = torch.zeros(width, dtype=torch.float64)
    for k, dims in narrow.items():
        w = source[k].detach().double().pow(2)
        total = w.mean().clamp_min(1e-30)
        for d in dims:
            score += w.transpose(0, d).reshape(width, -1).mean(1) / total
    kept = score.argsort(descending=True)[:hidden].sort().values
    out = {}
    for k, v in source.items():
        for d in narrow[k]:
            v = v.index_select(d, kept)
        out[k] = v.clone()
    return out, kept.tolist()
