"""A KD teacher: another fine-tuned classifier of the task, whose logits output KD distils (`--kd-teacher`).

The teacher a deploy compresses is its starting point, its speed baseline and the source of layer KD and
relations; its accuracy bounds what a distilled student reaches. A stronger model of the same task (a larger
encoder fine-tuned on the same training split) can give better soft labels: only its logits are used, so its
family, depth and width are free. With another vocabulary it reads each example as text: the student's
tokens decoded back to their segments and tokenised again with its own tokenizer (uncased WordPiece decodes to
the lower-cased text with spaces around punctuation, which its own tokenizer splits alike).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.modeling_outputs import SequenceClassifierOutput

from pipeline.models.folders import load_tokenizer
from pipeline.models.io import load_model

MAX_LENGTH = 512  # its own tokenizer may split a truncated example into a few more tokens than the student's


class Retokenized(nn.Module):
    """A classifier called with another tokenizer's ids: it decodes them to text and tokenises again."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, reads: PreTrainedTokenizerBase) -> None:
        super().__init__()
        self.model, self.tokenizer, self.reads = model, tokenizer, reads

    def segments(self, ids: list[int]) -> list[str]:
        """The texts of one example's real tokens, split at the separator tokens (one, or two for a pair)."""
        special = set(self.reads.all_special_ids) - {self.reads.sep_token_id}
        parts: list[list[int]] = [[]]
        for i in ids:
            if i == self.reads.sep_token_id:
                parts.append([])
            elif i not in special:
                parts[-1].append(i)
        texts = [self.reads.decode(p).strip() for p in parts if p]
        return [texts[0], " ".join(texts[1:])] if len(texts) > 2 else texts or [""]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SequenceClassifierOutput:
        rows = [self.segments(ids[mask.bool()].tolist()) for ids, mask in zip(input_ids, attention_mask, strict=True)]
        first = [r[0] for r in rows]
        second = [r[1] if len(r) > 1 else None for r in rows]
        pairs = any(s is not None for s in second)
        limit = min(MAX_LENGTH, self.tokenizer.model_max_length)
        enc = self.tokenizer(
            first, [s or "" for s in second] if pairs else None, padding=True, truncation=True, max_length=limit,
            return_tensors="pt",
        )  # fmt: skip
        device = next(self.model.parameters()).device
        return SequenceClassifierOutput(logits=self.model(**enc.to(device)).logits)


def same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether ids mean the same tokens to both (then the model reads the student's ids as they are)."""
    return a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids


def load_kd_teacher(folder: str, reads: PreTrainedTokenizerBase) -> nn.Module:
    """The frozen classifier in `folder`, callable with ids of the tokenizer `reads`."""
    model = load_model(folder).eval().requires_grad_(False)
    tokenizer = load_tokenizer(folder)
    return model if same_vocabulary(tokenizer, reads) else Retokenized(model, tokenizer, reads)
