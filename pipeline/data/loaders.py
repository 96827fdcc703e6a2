"""Load a task's train and dev sets from a GLUE TSV folder, a Hugging Face dataset, or the shipped sample,
and carve a fixed validation split out of train.

Every choice a run makes (recipes, checkpoints, gates) looks at the validation split; dev is the reported test and
is never used to choose. The validation split is a seeded random slice of the source's train file taken before any
`max_train` cap, so it is the same examples whatever the training budget.

The user names the source: `--data-dir DIR` (GLUE TSV) or `--hub` (the Hugging Face dataset, online or from the
local datasets cache). A named source that fails is an error naming it. With no source named, the project's own
small sample is used (sst2 only) and the run says so. The chosen source is recorded in `TaskData.source`.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import math
import os
import random
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.schema import DataLimits
from pipeline.data.tasks import TaskSpec, get_task
from pipeline.errors import PipelineError, one_line

log = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).parent / "samples"  # samples/<task>/{train,dev}.tsv
HUB_HOST = "huggingface.co"


@dataclass(frozen=True)
class Split:
    """Examples of one split: `texts[i]` holds one string (single-sentence task) or two (pair task)."""

    texts: list[tuple[str, ...]]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> Split:
        """The first `n` examples (all of them for None)."""
        return Split(self.texts[:n], self.labels[:n])


def _split_digest(h, split: Split) -> None:
    for text, label in zip(split.texts, split.labels, strict=True):
        h.update("\x1f".join(text).encode() + b"\x1e" + str(label).encode() + b"\n")
    h.update(b"\x1d")


@dataclass(frozen=True)
class TaskData:
    """train (minus the validation slice), validation (carved from train, for choosing) and dev (the test)."""

    task: TaskSpec
    train: Split
    validation: Split
    dev: Split
    source: str  # human-readable: where the examples came from
    validation_seed: int = 0

    @property
    def fingerprint(self) -> str:
        """sha256 over every example: the cache key of anything trained on this data."""
        h = hashlib.sha256(self.task.name.encode())
        for split in (self.train, self.validation, self.dev):
            _split_digest(h, split)
        return h.hexdigest()

    def describe(self) -> dict:
        """What the report records of the data: source, sizes, and which validation slice was carved."""
        h = hashlib.sha256()
        _split_digest(h, self.validation)
        return {
            "source": self.source,
            "train": len(self.train),
            "validation": len(self.validation),
            "dev": len(self.dev),
            "validation_split": {
                "carved_from": "train",
                "seed": self.validation_seed,
                "examples": len(self.validation),
                "sha256": h.hexdigest(),
            },
            "fingerprint": self.fingerprint,
        }


DEFAULT_VALIDATION = DataLimits().validation  # the recipes' default: one definition, in the schema
VALIDATION_MIN = 250  # small training sets still give this many (up to a quarter of train): gates need resolution


def carve_validation(train: Split, size: int, fraction: float, seed: int) -> tuple[Split, Split]:
    """(train without the slice, the slice): min(`size`, `fraction` of train) examples drawn with `seed`, but at
    least min(250, a quarter of train), so one example is not a whole point of a gate on small data.

    At least one example stays on each side; the two parts are disjoint by construction.
    """
    if len(train) < 2:
        raise PipelineError(f"{len(train)} training example(s): too few to carve a validation split from")
    floor = min(VALIDATION_MIN, len(train) // 4)
    n = min(max(min(size, math.floor(fraction * len(train))), floor), len(train) - 1)
    n = max(1, n)
    chosen = set(random.Random(seed).sample(range(len(train)), n))
    keep = [i for i in range(len(train)) if i not in chosen]
    picked = sorted(chosen)
    return (
        Split([train.texts[i] for i in keep], [train.labels[i] for i in keep]),
        Split([train.texts[i] for i in picked], [train.labels[i] for i in picked]),
    )


def load_task_data(
    task: str,
    data_dir: str | Path | None = None,
    max_train: int | None = None,
    max_dev: int | None = None,
    source: str | None = None,
    validation: tuple[int, float, int] = DEFAULT_VALIDATION,
) -> TaskData:
    """Load train/validation/dev for `task`; `source` ("tsv", "hub", "sample") skips the resolution (see module
    doc); `validation` is (most examples, most fraction of train, seed) of the carved validation split."""
    spec = get_task(task)
    source = source or resolve_source(spec, data_dir)
    if source == "tsv":
        if data_dir is None:
            raise PipelineError("source 'tsv' needs a data folder")
        train, dev, label = _from_tsv_dir(spec, Path(data_dir))
    elif source == "hub":
        train, dev, label = _from_hub(spec)
    else:
        train, dev, _ = _from_tsv_dir(spec, SAMPLE_DIR / spec.name)
        label = (
            f"embedded sample (pipeline/data/samples/{spec.name}, shipped with the project; "
            "pass --data-dir for real data)"
        )
    size, fraction, seed = validation
    train, val = carve_validation(train, size, fraction, seed)
    train, dev = _limit(train, max_train, shuffle=True), _limit(dev, max_dev, shuffle=False)
    return TaskData(spec, train, val, dev, label, seed)


def resolve_source(spec: TaskSpec, data_dir: str | Path | None, hub: bool = False) -> str:
    """The source the user named ("tsv" for a folder, "hub" for the Hugging Face dataset), else "sample".

    A named source that fails is an error naming it (when it is loaded); the shipped sample is used only when no
    source was named, and the run says so.
    """
    if data_dir is not None and hub:
        raise PipelineError("name one data source: --data-dir or --hub, not both")
    if data_dir is not None:
        return "tsv"
    if hub:
        return "hub"
    if spec.has_sample:
        log.warning(
            "no data source named: using the embedded %s sample (pass --data-dir or --hub for real data)", spec.name
        )
        return "sample"
    raise PipelineError(f"no data for task {spec.name!r} (no sample ships for it): pass --data-dir DIR or --hub")


def _limit(split: Split, n: int | None, shuffle: bool) -> Split:
    if n is None or n >= len(split):
        return split
    idx = list(range(len(split)))
    if shuffle:  # a seeded subset, not the first N: GLUE train files can be ordered
        random.Random(0).shuffle(idx)
    idx = sorted(idx[:n])
    return Split([split.texts[i] for i in idx], [split.labels[i] for i in idx])


def _from_tsv_dir(spec: TaskSpec, folder: Path) -> tuple[Split, Split, str]:
    if not folder.is_dir():
        raise PipelineError(f"data folder not found: {folder}")
    train = _read_tsv(spec, folder / spec.train_file)
    dev = _read_tsv(spec, folder / spec.dev_file)
    return train, dev, f"GLUE TSV folder {folder.resolve()}"


def _read_tsv(spec: TaskSpec, path: Path) -> Split:
    if not path.is_file():
        raise PipelineError(
            f"{path.parent}: missing {path.name} (task {spec.name} expects {spec.train_file} and {spec.dev_file})"
        )
    # utf-8-sig: GLUE ships MRPC with a byte-order mark, which would otherwise glue itself to the first column name
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows, None)
        if header is None:
            raise PipelineError(f"{path}: file is empty")
        wanted = (*spec.tsv_text_columns, spec.tsv_label_column)
        missing = [c for c in wanted if c not in header]
        if missing:
            raise PipelineError(f"{path}: missing column(s) {', '.join(missing)}; header is {', '.join(header)}")
        cols = [header.index(c) for c in wanted]
        values = {v: i for i, v in enumerate(spec.tsv_label_values)}
        texts, labels = [], []
        for lineno, row in enumerate(rows, start=2):
            if not row or row == [""]:
                continue
            if len(row) <= max(cols):
                raise PipelineError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
            raw = row[cols[-1]].strip()
            if raw not in values:
                raise PipelineError(
                    f"{path}:{lineno}: label {raw!r} out of range for {spec.name} "
                    f"(expected one of {', '.join(values)})"
                )
            texts.append(tuple(row[c] for c in cols[:-1]))
            labels.append(values[raw])
    if not labels:
        raise PipelineError(f"{path}: no examples")
    return Split(texts, labels)


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub resolves, without the datasets library's minute of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or os.environ.get("HF_DATASETS_OFFLINE", "0") not in (
        "0",
        "",
    ):
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.getaddrinfo(HUB_HOST, 443)
            result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def _from_hub(spec: TaskSpec) -> tuple[Split, Split, str]:
    """The dataset from the hub, or from the local datasets cache when offline; an error naming it otherwise."""
    name = "/".join(spec.hf_dataset)
    online = hub_reachable()
    if not online:
        os.environ["HF_DATASETS_OFFLINE"] = "1"  # read the cache only; read at datasets' import
    try:
        import datasets

        if not online:
            datasets.config.HF_HUB_OFFLINE = True
        ds = datasets.load_dataset(*spec.hf_dataset)
    except Exception as e:  # unreachable and not cached, or datasets' own errors
        where = "the hub" if online else "the local datasets cache (the hub is unreachable)"
        raise PipelineError(f"--hub: dataset {name} could not be loaded from {where}: {one_line(e)}") from None

    def split(part_name: str) -> Split:
        part = ds[part_name]
        texts = list(zip(*(part[c] for c in spec.hf_text_columns), strict=True))
        labels = [int(x) for x in part["label"]]
        keep = [i for i, y in enumerate(labels) if 0 <= y < spec.num_labels]  # GLUE test-style -1 labels
        return Split([texts[i] for i in keep], [labels[i] for i in keep])

    where = "hub" if online else "local cache"
    return split("train"), split(spec.hf_dev_split), f"Hugging Face dataset {name} ({where})"


@dataclass(frozen=True)
class DataRef:
    """What stages pass instead of data: enough to reload the same examples (loading is cheap and deterministic)."""

    task: str
    source: str  # "tsv", "hub" or "sample", resolved once by `resolve_source`
    data_dir: str | None = None
    max_train: int | None = None
    max_dev: int | None = None
    validation: tuple[int, float, int] = DEFAULT_VALIDATION  # (most examples, most fraction of train, seed)

    def load(self) -> TaskData:
        return load_task_data(self.task, self.data_dir, self.max_train, self.max_dev, self.source, self.validation)
