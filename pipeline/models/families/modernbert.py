"""ModernBERT: pre-norm blocks, one fused `Wqkv` ([3, heads, head size] rows), rotary positions, local (sliding
window) or global attention per layer, a gated FFN (`Wi` holds the up-projection and the gate, so a neuron is two
rows of `Wi` and one column of `Wo`), and usually no biases. The first block has no attention norm; which blocks
are global and which have that norm is saved per layer, so a student cut from any layers rebuilds as it was."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.models.families.base import Family, Matrix

if TYPE_CHECKING:
    import torch
    from torch import nn

GLOBAL, NORM = "layer_global_attention", "layer_attention_norm"


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
        return counts.num_heads

    def set_heads_(self, block: nn.Module, n: int) -> None:
        block.attn.num_heads = n
        block.attn.all_head_size = block.attn.num_heads * block.attn.head_dim

    def qkv(self, block: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = block.attn.Wqkv(block.attn_norm(hidden)).chunk(3, dim=-1)  # pre-norm: the block normalises first
        return q, k, v

    def layer_record(self, model: nn.Module) -> dict[str, list]:
        from torch import nn

        blocks = self.layers(model)
        return {
            GLOBAL: [getattr(b.attn, "local_attention", (-1, -1)) == (-1, -1) for b in blocks],
            NORM: [not isinstance(b.attn_norm, nn.Identity) for b in blocks],
        }

    def rebuild_(self, model: nn.Module) -> None:
        from torch import nn
        from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

        config = model.config
        record = {key: getattr(config, key, None) for key in (GLOBAL, NORM)}
        for i, block in enumerate(self.layers(model)):
            if record[GLOBAL] is not None and record[GLOBAL][i] != (block.attn.local_attention == (-1, -1)):
                # layer_id 0 builds a global layer (rotary base and window included), 1 a local one
                block.attn = ModernBertAttention(config, layer_id=0 if record[GLOBAL][i] else 1)
            if record[NORM] is not None and record[NORM][i] == isinstance(block.attn_norm, nn.Identity):
                block.attn_norm = (
                    nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
                    if record[NORM][i]
                    else nn.Identity()
                )

    def check(self, config: dict[str, Any]) -> str | None:
        if config.get("global_attn_every_n_layers", 1) < 2 and False in (config.get(GLOBAL) or []):
            return "its config records local layers but global_attn_every_n_layers < 2 cannot build one"
        return None
