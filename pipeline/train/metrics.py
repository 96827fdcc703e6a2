"""Task metrics and batched torch inference."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.data.encoding import Encoded, iter_batches


@torch.no_grad()
def predict_logits(model: torch.nn.Module, enc: Encoded, batch_size: int = 64) -> np.ndarray:
    """Logits for every example, in order, on the model's current device."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for batch in iter_batches(enc, batch_size):
        batch.pop("labels")
        out.append(model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu())
    return torch.cat(out).numpy()


def scores(logits: np.ndarray, labels: list[int] | np.ndarray) -> dict[str, float]:
    """Accuracy, F1 of class 1 (two classes) and macro-F1 (the unweighted mean of every class's F1), in percent."""
    preds = np.asarray(logits).argmax(-1)
    labels = np.asarray(labels)
    result = {"accuracy": float((preds == labels).mean() * 100)}
    f1 = [_f1(preds, labels, c) for c in range(logits.shape[-1])]
    if logits.shape[-1] == 2:
        result["f1"] = f1[1]
    result["macro_f1"] = float(np.mean(f1))
    return result


def _f1(preds: np.ndarray, labels: np.ndarray, c: int) -> float:
    tp = int(((preds == c) & (labels == c)).sum())
    fp = int(((preds == c) & (labels != c)).sum())
    fn = int(((preds != c) & (labels == c)).sum())
    return float(200 * tp / (2 * tp + fp + fn)) if tp else 0.0
