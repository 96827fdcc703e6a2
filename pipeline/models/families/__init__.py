"""The model families the pipeline compresses, one adapter each, looked up by `config.json`'s `model_type`.

Adding a family is one module beside these (a `Family` subclass) and a line in `FAMILIES`; the matrix test in
`tests/test_families.py` then runs every method, compaction, export and serving on a tiny random model of it.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import PipelineError
from pipeline.models.families.base import Arch, Family, Matrix
from pipeline.models.families.bert import Bert
from pipeline.models.families.deberta_v2 import DebertaV2
from pipeline.models.families.distilbert import DistilBert
from pipeline.models.families.electra import Electra
from pipeline.models.families.modernbert import ModernBert
from pipeline.models.families.mpnet import MPNet

FAMILIES: tuple[Family, ...] = (Bert(), Electra(), DistilBert(), DebertaV2(), ModernBert(), MPNet())
BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
SUPPORTED_MODEL_TYPES = tuple(BY_TYPE)

__all__ = [
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "Arch",
    "Family",
    "Matrix",
    "arch_of",
    "byte_level",
    "family_for",
    "family_of",
    "family_titles",
    "mlm_layout",
    "mlm_model_types",
    "random_model",
]


def family_for(model_type: str | None, where: str = "model") -> Family:
    """The adapter for a `model_type`, or a one-line refusal naming the supported ones."""
    try:
        return BY_TYPE[model_type]
    except KeyError:
        raise PipelineError(
            f"{where}: model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        ) from None


def family_titles() -> list[str]:
    """Every supported model type as people write it (BERT, RoBERTa, ...), in the families' order."""
    return [title for f in FAMILIES for title in f.titles]


def mlm_layout(model_type: str | None) -> str | None:
    """The masked-LM head layout of `model_type`'s checkpoints (`bert`, `roberta`; None: none the verbalizer reads)."""
    family = BY_TYPE.get(model_type)
    return family.mlm_head(model_type) if family else None


def mlm_model_types() -> tuple[str, ...]:
    """The model types whose checkpoints carry a masked-LM head the verbalizer starts from."""
    return tuple(t for f in FAMILIES for t, _ in f.mlm_heads)


def byte_level(model_type: str | None) -> bool:
    """`model_type`'s tokenizer is byte-level BPE: a word mid-text is a different token from a word at the start."""
    family = BY_TYPE.get(model_type)
    return bool(family) and model_type in family.byte_level


def family_of(model: Any) -> Family:
    """The adapter of a built model (anything with a transformers `config`)."""
    return family_for(getattr(getattr(model, "config", None), "model_type", None), type(model).__name__)


def random_model(
    model_type: str, layers: int, heads: int, hidden: int, ffn: int, *, vocab: int, seed: int = 0, **fields: Any
) -> Any:
    """A randomly initialised sequence classifier of a family at a shape, in eval mode (tests, speed probes)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = family_for(model_type).config(model_type, layers, heads, hidden, ffn, vocab_size=vocab, **fields)
    return AutoModelForSequenceClassification.from_config(config).eval()


def arch_of(config: dict[str, Any]) -> Arch:
    """A `config.json` mapping's uniform shape, in the pipeline's names."""
    return family_for(config.get("model_type"), "config.json").arch(config)
