"""SMP's verbalizer task head: label-word logits from the frozen pre-trained MLM head, as a plain classifier.

The authors' code scores a class by the MLM head at the first token (BERT [CLS], RoBERTa <s>): dense → act →
LayerNorm, then the decoder restricted to the label words, `h · E[ids]ᵀ + b_dec[ids]`. We materialise that as
a standard `{Bert,Roberta}ForSequenceClassification` (the modules are in `pipeline.models.heads`), so
training, ONNX export and our loader see an ordinary sequence classifier. The saved config records
`classifier_head = "verbalizer"`, which tells `pipeline.models.io.load_model` to install those modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.data.tasks import TaskSpec
from pipeline.errors import PipelineError, one_line
from pipeline.models.families import byte_level, mlm_layout
from pipeline.models.folders import WEIGHTS, check_model_dir, load_tokenizer, safetensors_header
from pipeline.models.heads import HEAD_NAME, head_modules, install_verbalizer_

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# One weight per family that exists only when the checkpoint carries the pre-trained MLM head.
MLM_HEAD_KEYS = ("cls.predictions.transform.dense.weight", "lm_head.dense.weight")

# One word per label, in each task's label order (SMP / LM-BFF words). RTE and QNLI list "entailment" first,
# so Yes comes first there; MNLI uses the LM-BFF meaning, not the authors' scrambled pairing (smp.md §1.4).
LABEL_WORDS: dict[str, list[str]] = {
    "sst2": ["terrible", "great"],  # negative, positive
    "mrpc": ["No", "Yes"],  # not_equivalent, equivalent
    "rte": ["Yes", "No"],  # entailment, not_entailment
    "qnli": ["Yes", "No"],  # entailment, not_entailment
    "mnli": ["Yes", "Maybe", "No"],  # entailment, neutral, contradiction
}


def label_word_ids(tokenizer: PreTrainedTokenizerBase, words: list[str], model_type: str) -> list[int]:
    """The vocabulary id of each label word; every word must be exactly one known token.

    Byte-level BPE marks a word's leading space in the token (`Ġgreat`), and inputs are scored as mid-text
    words, so those tokenizers see `" great"`.

    Raises:
        PipelineError: a word is split, unknown, or two words share a token.
    """
    prefix = " " if byte_level(model_type) else ""
    ids = []
    for word in words:
        pieces = tokenizer.tokenize(prefix + word)
        token_id = tokenizer.convert_tokens_to_ids(pieces[0]) if len(pieces) == 1 else None
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise PipelineError(f"label word {word!r} is not one token in this vocabulary (pieces: {pieces})")
        ids.append(token_id)
    if len(set(ids)) != len(ids):
        raise PipelineError(f"label words {words} do not map to distinct tokens ({ids})")
    return ids


def _weight_keys(model_dir: Path) -> set[str]:
    """Parameter names in a folder's weights, from the safetensors header alone (the only weights read)."""
    st = model_dir / WEIGHTS
    return set(safetensors_header(st)) if st.is_file() else set()


def has_mlm_head(model_dir: str | Path) -> bool:
    """Whether the folder's weights include the pre-trained MLM head (a bare encoder or a classifier does not)."""
    try:
        return not _weight_keys(Path(model_dir)).isdisjoint(MLM_HEAD_KEYS)
    except (OSError, ValueError, KeyError) as e:
        raise PipelineError(f"cannot read the weights in {model_dir}: {one_line(e)}") from None


def build_verbalizer_classifier(
    model_dir: str | Path, task: TaskSpec, words: list[str] | None = None
) -> PreTrainedModel:
    """A sequence classifier whose logits are the MLM-head logits of `task`'s label words at the first token.

    The encoder, MLM transform, label-word embedding rows and decoder bias are copied from the folder's
    `*ForMaskedLM` weights; `words` (one per label, in label order) defaults to `LABEL_WORDS[task.name]`.

    Raises:
        PipelineError: no MLM head in the folder (transformers would initialise one at random), unsupported
            model type, or unusable label words.
    """
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification

    model_dir = Path(model_dir)
    config = check_model_dir(model_dir)
    if not has_mlm_head(model_dir):
        raise PipelineError(f"{model_dir} has no pre-trained MLM head, which the verbalizer head reuses")
    words = list(words if words is not None else LABEL_WORDS.get(task.name, []))
    if len(words) != task.num_labels:
        raise PipelineError(f"task {task.name} needs {task.num_labels} label words ({task.labels}), got {words}")
    ids = label_word_ids(load_tokenizer(model_dir), words, config["model_type"])
    try:
        mlm = AutoModelForMaskedLM.from_pretrained(str(model_dir), use_safetensors=True).eval()
    except Exception as e:
        raise PipelineError(f"cannot load the masked-LM model from {model_dir}: {one_line(e)}") from None

    config = AutoConfig.from_pretrained(
        str(model_dir),
        num_labels=task.num_labels,
        id2label=dict(enumerate(task.labels)),
        label2id={name: i for i, name in enumerate(task.labels)},
    )
    config.classifier_head, config.label_words = HEAD_NAME, words  # from_pretrained drops unknown kwargs
    model = AutoModelForSequenceClassification.from_config(config).to(mlm.dtype)
    install_verbalizer_(model)
    missing, unexpected = model.base_model.load_state_dict(mlm.base_model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("pooler.") for k in missing):  # only BERT's pooler slot is ours to fill
        raise PipelineError(f"{model_dir}: encoder weights do not match (missing {missing}, unexpected {unexpected})")

    if mlm_layout(config.model_type) == "bert":
        src = mlm.cls.predictions.transform
        src_dense, src_norm = src.dense, src.LayerNorm
    else:
        src_dense, src_norm = mlm.lm_head.dense, mlm.lm_head.layer_norm
    decoder = mlm.get_output_embeddings()  # tied to the word embeddings unless the checkpoint unties them
    transform, out = head_modules(model)
    with torch.no_grad():
        transform.dense.load_state_dict(src_dense.state_dict())
        transform.LayerNorm.load_state_dict(src_norm.state_dict())
        out.weight.copy_(decoder.weight[ids])
        out.bias.copy_(decoder.bias[ids] if decoder.bias is not None else torch.zeros(len(ids)))
    return model.eval()
