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
    """Accuracy, and for binary tasks F1 of class 1, both in percent."""
    preds = np.asarray(logits).argmax(-1)
    labels = np.asarray(labels)
    result = {"accuracy": float((preds == labels).mean() * 100)}
    if logits.shape[-1] == 2:
        tp = int(((preds == 1) & (labels == 1)).sum())
        fp = int(((preds == 1) & (labels == 0)).sum())
        fn = int(((preds == 0) & (labels == 1)).sum())
        result["f1"] = float(200 * tp / (2 * tp + fp + fn)) if tp else 0.0
    return result
