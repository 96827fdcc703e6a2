"""A sentence-embedding model: a bare encoder of any supported family, an optional projection of every token to the
teacher's width, the model's pooling (mean over real tokens, or the first token) and normalisation.

The encoder sits under its family's `base_model_prefix` (`bert.`, `mpnet.`, ...) as in transformers' task models,
so every method, compaction and the per-layer loader see the layers where they look for them (`base_model`). The
projection (`projection.weight`, `.bias`) exists only for a student narrower than its teacher: it maps each token
into the teacher's space, so a student's query finds a teacher's documents. The config records the pooling
(`sentence_pooling`) and the projection's width (`sentence_projection`); its architecture stays the bare
encoder's (`BertModel`), which is what sentence-transformers and Text Embeddings Inference read as an embedder.

A base model folder in sentence-transformers' layout names its pooling in `1_Pooling/config.json`; mean pooling
where it says nothing (how sentence-transformers wraps a plain encoder).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from pipeline.errors import PipelineError
from pipeline.kinds.embedding_output import EmbeddingOutput

POOLINGS = ("mean", "cls")
POOLING_CONFIG = Path("1_Pooling") / "config.json"
POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}  # sentence-transformers' names
# what sentence-transformers may also ask, and this model cannot give
UNSUPPORTED_POOLING = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def pool(tokens: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Mean over the real tokens (pads excluded), or the first token."""
    if pooling == "cls":
        return tokens[:, 0]
    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    """Each row over its L2 norm (at least 1e-12), as `F.normalize`, in ops ORT's symbolic shape inference (the
    int8 step's first) can type: `F.normalize` exports an Expand and `norm` a ReduceL2 (axes as an input) it cannot."""
    return vectors / vectors.square().sum(dim=-1, keepdim=True).sqrt().clamp(min=1e-12)


class SentenceEmbedder(nn.Module):
    """An encoder (a transformers base model), an optional per-token projection, pooling and normalisation."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean", projection: nn.Linear | None = None) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise PipelineError(f"pooling {pooling!r}: one of {', '.join(POOLINGS)}")
        self.base_model_prefix = encoder.base_model_prefix
        setattr(self, self.base_model_prefix, encoder)
        self.projection = projection
        self.pooling = pooling
        encoder.config.sentence_pooling = pooling
        encoder.config.sentence_projection = None if projection is None else projection.out_features

    @classmethod
    def from_config(cls, config, pooling: str | None = None) -> SentenceEmbedder:
        """A freshly initialised model of `config` (its own pooling and projection unless `pooling` is given)."""
        from transformers import AutoModel

        encoder = AutoModel.from_config(config, **encoder_options(config))
        width = getattr(config, "sentence_projection", None)
        projection = nn.Linear(config.hidden_size, width) if width else None
        return cls(encoder, pooling or getattr(config, "sentence_pooling", None) or "mean", projection)

    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix)

    @property
    def config(self):
        return self.base_model.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def width(self) -> int:
        """The embedding's dimension: the projection's, else the encoder's hidden size."""
        return self.config.hidden_size if self.projection is None else self.projection.out_features

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids=None,
                output_hidden_states: bool | None = None, output_attentions: bool | None = None,
                **kwargs) -> EmbeddingOutput:  # fmt: skip
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.base_model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              **kwargs)  # fmt: skip
        tokens = out.last_hidden_state if self.projection is None else self.projection(out.last_hidden_state)
        return EmbeddingOutput(normalize(pool(tokens, attention_mask, self.pooling)), tokens, out.hidden_states,
                               out.attentions)  # fmt: skip

    def save_pretrained(self, path: str | Path, safe_serialization: bool = True, **kwargs) -> None:
        """config.json (the bare encoder's architecture, pooling and projection recorded) and model.safetensors."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.config.architectures = [type(self.base_model).__name__]
        self.config.save_pretrained(str(path))
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def encoder_options(config) -> dict:
    """`add_pooling_layer=False` for families whose base model builds an unused pooler unless told not to
    (BERT-like), so every weight of the embedder is one it uses; nothing for the others."""
    import inspect

    from transformers import AutoModel

    model_class = AutoModel._model_mapping[type(config)]
    takes = "add_pooling_layer" in inspect.signature(model_class.__init__).parameters
    return {"add_pooling_layer": False} if takes else {}


def folder_pooling(path: str | Path) -> str:
    """The pooling a model folder names: its config's (`sentence_pooling`), else sentence-transformers'
    `1_Pooling/config.json`, else mean. A pooling this model cannot give is a one-line error."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("sentence_pooling"):
        return config["sentence_pooling"]
    file = path / POOLING_CONFIG
    if not file.is_file():
        return "mean"
    try:
        modes = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise PipelineError(f"{file}: not JSON ({e})") from None
    if not isinstance(modes, dict):
        raise PipelineError(f"{file}: expected an object of pooling modes")
    chosen = [name for name, key in POOLING_KEYS.items() if modes.get(key)]
    other = [key for key in UNSUPPORTED_POOLING if modes.get(key)]
    if other or len(chosen) > 1:
        asked = ", ".join(other + [POOLING_KEYS[c] for c in chosen])
        raise PipelineError(f"{file}: pooling {asked}; this pipeline pools by one of mean tokens or the CLS token")
    return chosen[0] if chosen else "mean"
