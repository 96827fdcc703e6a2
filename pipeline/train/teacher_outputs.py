"""The frozen teacher's outputs, computed once per distinct input and read back after: offline output KD.

Output KD needs only the teacher's logits, and a frozen teacher gives the same logits for the same tokens, so
every phase that distils from it (distill's task phase, SMP's mask training and recovery, GMP, MLP Fusion's task
training) can share one teacher forward per training example instead of paying one per step. The phases of a
run draw their batches from the same seeded order, so most of their rows repeat: a 12 x 768 teacher's forward
was most of each step of a 3-layer student. Rows are kept per distinct input (its real tokens and token types,
hashed), so batch composition and padding do not matter; they are stored per teacher in the stage cache
(`teacher_outputs/<teacher digest>.npz`, plain arrays, never pickled) for the runs after.

A row read back was computed in another batch, whose padding can move a logit in its last float32 bits (about
1e-7): a run that reuses rows is as exact as two runs on other hardware, not bit for bit the same. The teacher
always runs in float32 here (autocast off), so the rows do not depend on a phase's precision.
Anything that needs the teacher's insides (hidden states, attention) calls the teacher itself.

The rows may come from another model than the teacher (`source`: a stronger classifier of the same task,
`--kd-teacher`): output KD then distils its logits, wherever a phase asks the teacher's, while hidden states and
attention stay the teacher's (layer KD and relations need its widths and depth).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline import distributed
from pipeline.kinds import KINDS

log = logging.getLogger(__name__)

ROWS = {k.rows: k for k in KINDS}  # what a stored row holds, by the name the store keeps (its kind's `rows`)


def row_key(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None) -> bytes:
    """A digest of one example's real tokens (and token types): what the teacher's output depends on."""
    real = attention_mask.bool()
    h = hashlib.blake2b(input_ids[real].to(torch.int64).numpy().tobytes(), digest_size=16)
    if token_type_ids is not None:
        h.update(b"|" + token_type_ids[real].to(torch.int64).numpy().tobytes())
    return h.digest()


class TeacherOutputs(nn.Module):
    """A frozen teacher that answers output-only calls from its rows and computes only the rows it lacks.

    Called like the teacher. With `output_hidden_states` (or any input but the token ids, attention mask and
    token types) it is the teacher itself, with the logits of `source` (when given) in place of its own.
    """

    def __init__(self, teacher: nn.Module, store: Path | None = None, source: nn.Module | None = None) -> None:
        super().__init__()
        self.teacher = teacher
        self.source = teacher if source is None else source  # what computes the rows
        self.store = store
        self.rows: dict[bytes, np.ndarray] = {}
        self.kind: str | None = None
        self.hits = self.misses = 0
        self._loaded = 0
        if store is not None:
            self._load(store)

    def forward(self, output_hidden_states: bool = False, **inputs: torch.Tensor):
        plain = not set(inputs) - {"input_ids", "attention_mask", "token_type_ids"}
        if output_hidden_states or not plain:
            out = self.teacher(**inputs, output_hidden_states=output_hidden_states)
            if plain and self.source is not self.teacher:  # sentence labels only (the request checks)
                out.logits = self._rows(inputs).logits
            return out
        return self._rows(inputs)

    def _rows(self, inputs: dict[str, torch.Tensor]):
        """The batch's output from its rows, computing those not seen yet."""
        ids, mask, types = inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids")
        cpu = [t.detach().cpu() if t is not None else None for t in (ids, mask, types)]
        keys = [row_key(cpu[0][i], cpu[1][i], None if cpu[2] is None else cpu[2][i]) for i in range(len(ids))]
        missing = [i for i, k in enumerate(keys) if k not in self.rows]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            self._compute(inputs, missing, keys)
        return self._assemble(keys, mask)

    def _compute(self, inputs: dict[str, torch.Tensor], rows: list[int], keys: list[bytes]) -> None:
        """The teacher on the rows it has not seen, cut to their longest real length, in float32."""
        index = torch.tensor(rows, device=inputs["input_ids"].device)
        mask = inputs["attention_mask"].index_select(0, index)
        width = int(mask.sum(dim=1).max())
        sub = {k: v.index_select(0, index)[:, :width] for k, v in inputs.items() if v is not None}
        with torch.no_grad(), torch.autocast(sub["input_ids"].device.type, enabled=False):
            out = self.source(**sub)
        kind = next(k for k in KINDS if k.holds(out))
        self.kind = self.kind or kind.rows
        for i, row in zip(rows, kind.output_rows(out, mask.sum(dim=1).tolist()), strict=True):
            self.rows[keys[i]] = row

    def _assemble(self, keys: list[bytes], mask: torch.Tensor):
        """The batch's output from its rows, padded to the batch's width (pads read 0; the losses drop them)."""
        return ROWS[self.kind].assemble([self.rows[k] for k in keys], mask.shape[1], mask.device)

    def _load(self, path: Path) -> None:
        self.kind, self.rows = read_rows(path)
        self._loaded = len(self.rows)

    def save(self) -> None:
        """Write the rows when there are new ones, merged with what another run stored meanwhile, by an atomic
        rename: a reader sees the old file or the new one."""
        if self.store is None or len(self.rows) == self._loaded or self.kind is None or not distributed.is_main():
            return  # under torchrun, rank 0 stores its rows (the others' are computed again when next needed)
        kind, stored = read_rows(self.store)
        rows = {**stored, **self.rows} if kind == self.kind else self.rows
        keys = list(rows)
        values = [rows[k] for k in keys]
        shapes = np.full((len(values), 2), -1, dtype=np.int64)
        for i, v in enumerate(values):
            shapes[i, : v.ndim] = v.shape
        sizes = np.array([v.size for v in values], dtype=np.int64)
        self.store.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.store.parent, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), -1),
                    values=np.concatenate([v.ravel() for v in values]).astype(np.float32),
                    offsets=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
                    shapes=shapes,
                    kind=np.array(self.kind),
                )
            os.replace(tmp, self.store)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info(
            "teacher outputs: %d rows in %s (this stage: %d read back, %d computed)",
            len(keys),
            self.store,
            self.hits,
            self.misses,
        )
        self._loaded = len(self.rows)


def read_rows(path: Path) -> tuple[str | None, dict[bytes, np.ndarray]]:
    """The kind and rows of a store; none when it is missing or unreadable (a damaged store is rebuilt, not
    trusted)."""
    if not path.is_file():
        return None, {}
    try:
        with np.load(path, allow_pickle=False) as f:
            keys, flat, offsets, shapes, kind = f["keys"], f["values"], f["offsets"], f["shapes"], str(f["kind"])
        if kind not in ROWS or not len(keys) == len(offsets) == len(shapes):
            raise ValueError("inconsistent arrays")
        rows = {}
        for k, start, shape in zip(keys, offsets, shapes, strict=True):
            dims = tuple(int(d) for d in shape if d >= 0)
            size = int(np.prod(dims))
            if start < 0 or start + size > len(flat):
                raise ValueError("a row runs past the values")
            rows[k.tobytes()] = flat[start : start + size].reshape(dims)
    except (OSError, ValueError, KeyError) as err:
        log.warning("teacher outputs: ignoring unreadable %s (%s)", path, err)
        return None, {}
    return kind, rows
