"""ModernBERT: pre-norm blocks, one fused `Wqkv` ([3, heads, head size] rows), rotary positions, local (sliding
window) or global attention per layer, a gated FFN (`Wi` holds the up-projection and the gate, so a neuron is two
rows of `Wi` and one column of `Wo`), and usually no biases. The first block has no attention norm; which blocks
are global and which have that norm is saved per layer, so a student cut from any layers rebuilds as it was.

transformers 4.x builds a layer's attention from `layer_id` (global every n-th) and keeps `num_heads` and
`local_attention` on it; 5.x reads each layer's type from `config.layer_types` (a block's `attention_type`, the
attention's `sliding_window`) and counts heads from the fused matrix. Both are absorbed here: heads are counted
from `Wqkv`, `layer_types` follows the blocks, and a folder 4.x saved (the record only) is retyped on load."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.models.families.base import Family, Matrix

if TYPE_CHECKING:
    import torch
    from torch import nn

GLOBAL, NORM = "layer_global_attention", "layer_attention_norm"
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers 5's layer types


def _types(is_global: list[bool]) -> list[str]:
    return [FULL if g else SLIDING for g in is_global]


def _is_global(block: nn.Module) -> bool:
    if hasattr(block, "attention_type"):  # transformers 5
        return block.attention_type == FULL
    return getattr(block.attn, "local_attention", (-1, -1)) == (-1, -1)  # a headless layer has no window


class ModernBert(Family):
    name = "modernbert"
    model_types = ("modernbert",)
    titles = ("ModernBERT",)
    ort_fuses = ("SkipLayerNormalization",)  # rotary and fused QKV match no attention pattern; the FFN is gated
    layers_path = "layers"
    attention = "attn"
    counts = "attn"
    head_readers = (Matrix("attn.Wqkv", "qkv", segments=3),)
    head_writer = Matrix("attn.Wo", "attn_out")
    value = (head_readers[0], 2)
    ffn_readers = (Matrix("mlp.Wi", "ffn_in", segments=2),)
    ffn_writer = Matrix("mlp.Wo", "ffn_out")
    activation = "mlp.act"
    activation_field = "hidden_activation"
    gated = True
    token_types = False

    def config(self, model_type: str, layers: int, heads: int, hidden: int, ffn: int, **fields: Any) -> Any:
        ids = dict(pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)  # WordPiece's
        return super().config(model_type, layers, heads, hidden, ffn, **{**ids, **fields})

    def head_size(self, block: nn.Module) -> int:
        return block.attn.head_dim

    def _count(self, counts: nn.Module) -> int:
        return counts.Wqkv.out_features // (3 * counts.head_dim)  # 5.x keeps no head count; 4.x's agrees

    def set_heads_(self, block: nn.Module, n: int) -> None:
        if hasattr(block.attn, "num_heads"):  # 4.x sizes its reshapes from these; 5.x reshapes to -1 heads
            block.attn.num_heads = n
            block.attn.all_head_size = n * block.attn.head_dim

    def set_layers_(self, model: nn.Module, blocks: list[nn.Module]) -> None:
        super().set_layers_(model, blocks)
        if getattr(model.config, "layer_types", None) is not None:  # 5.x: one type per layer, as the blocks are
            model.config.layer_types = _types([_is_global(b) for b in blocks])

    def qkv(self, block: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = block.attn.Wqkv(block.attn_norm(hidden)).chunk(3, dim=-1)  # pre-norm: the block normalises first
        return q, k, v

    def layer_record(self, model: nn.Module) -> dict[str, list]:
        from torch import nn

        blocks = self.layers(model)
        return {  # 5.x's config.layer_types says the same, kept in step by set_layers_ and _retype_
            GLOBAL: [_is_global(b) for b in blocks],
            NORM: [not isinstance(b.attn_norm, nn.Identity) for b in blocks],
        }

    def rebuild_(self, model: nn.Module) -> None:
        from torch import nn

        config = model.config
        record = {key: getattr(config, key, None) for key in (GLOBAL, NORM)}
        v5 = getattr(config, "layer_types", None) is not None
        if v5 and record[GLOBAL] is not None:
            self._retype_(model, record[GLOBAL])
        for i, block in enumerate(self.layers(model)):
            if not v5 and record[GLOBAL] is not None and record[GLOBAL][i] != _is_global(block):
                from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

                # layer_id 0 builds a global layer (rotary base and window included), 1 a local one
                block.attn = ModernBertAttention(config, layer_id=0 if record[GLOBAL][i] else 1)
            if record[NORM] is not None and record[NORM][i] == isinstance(block.attn_norm, nn.Identity):
                block.attn_norm = (
                    nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
                    if record[NORM][i]
                    else nn.Identity()
                )

    def _retype_(self, model: nn.Module, is_global: list[bool]) -> None:
        """5.x: each layer's type as recorded (a config saved by 4.x has no `layer_types`, so the model was built
        with every n-th layer global); the attention's window and the rotary tables follow the type."""
        from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding

        config = model.config
        types = _types(is_global)
        rebuilt = set(types) != set(config.layer_types)
        config.layer_types = types
        for block, kind in zip(self.layers(model), types, strict=True):
            block.attention_type = kind
            block.attn.sliding_window = None if kind == FULL else config.sliding_window + 1
        if rebuilt:  # the rotary module holds one table per layer type it was built with
            base = model.base_model
            base.rotary_emb = ModernBertRotaryEmbedding(config).to(base.embeddings.tok_embeddings.weight.device)

    def check(self, config: dict[str, Any]) -> str | None:
        if config.get("global_attn_every_n_layers", 1) < 2 and False in (config.get(GLOBAL) or []):
            return "its config records local layers but global_attn_every_n_layers < 2 cannot build one"
        return None
