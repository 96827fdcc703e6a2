"""Tiny random BERT and RoBERTa classifiers with real (trained) tokenizers, for tests and smoke runs.

They are built in code with fixed seeds, so tests need no network and no downloaded weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.data import SAMPLE_DIR

VOCAB = 400


def _texts() -> list[str]:
    lines = (SAMPLE_DIR / "sst2_sample" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def tiny_tokenizer(kind: str = "bert"):
    """A WordPiece (bert) or byte-level BPE (roberta) tokenizer trained on the shipped sample."""
    from tokenizers import ByteLevelBPETokenizer, BertWordPieceTokenizer
    from transformers import BertTokenizerFast, RobertaTokenizerFast

    if kind == "bert":
        tok = BertWordPieceTokenizer(lowercase=True)
        tok.train_from_iterator(_texts(), vocab_size=VOCAB, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        return BertTokenizerFast(tokenizer_object=tok._tokenizer, model_max_length=128)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(_texts(), vocab_size=VOCAB, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    from tokenizers.processors import RobertaProcessing

    tok._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    return RobertaTokenizerFast(
        tokenizer_object=tok._tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=128,
    )


def tiny_model(
    kind: str = "bert", num_labels: int = 2, seed: int = 0, layers: int = 2, init_range: float = 0.2, heads: int = 2,
    masked_lm: bool = False,
):
    """A random `{Bert,Roberta}ForSequenceClassification`: hidden 32, `heads` heads (of size 32/heads), FFN 64.

    `init_range` is large so logits are O(1) and parity tolerances are meaningful. `masked_lm=True` builds
    `{Bert,Roberta}ForMaskedLM` instead: a pre-trained-style checkpoint that keeps its MLM head.
    """
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForSequenceClassification,
        RobertaConfig,
        RobertaForMaskedLM,
        RobertaForSequenceClassification,
    )

    torch.manual_seed(seed)
    common = dict(
        hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=64, vocab_size=VOCAB,
        max_position_embeddings=160, num_labels=num_labels, initializer_range=init_range,
        id2label={i: f"LABEL_{i}" for i in range(num_labels)},
    )
    if kind == "bert":
        return (BertForMaskedLM if masked_lm else BertForSequenceClassification)(BertConfig(**common)).eval()
    cfg = RobertaConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    return (RobertaForMaskedLM if masked_lm else RobertaForSequenceClassification)(cfg).eval()


def write_tiny_model_dir(path: str | Path, kind: str = "bert", classifier: bool = True, **kwargs) -> Path:
    """Save a tiny model + tokenizer folder; `classifier=False` saves the bare encoder, like a hub base model."""
    path = Path(path)
    model = tiny_model(kind, **kwargs)
    if classifier:
        model.save_pretrained(str(path))
    else:
        model.base_model.save_pretrained(str(path))
    tiny_tokenizer(kind).save_pretrained(str(path))
    return path
