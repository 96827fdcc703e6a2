"""Load a task's train and dev sets from a GLUE TSV folder, the user's own files (`--task-file`: TSV, CSV or JSONL),
a local Hugging Face dataset folder, the Hugging Face hub, or the shipped sample, and carve a fixed validation
split out of train.

Every choice a run makes (recipes, checkpoints, gates) looks at the validation split; dev is the reported test and
is never used to choose. The validation split is a seeded random slice of the source's train file taken before any
`max_train` cap, so it is the same examples whatever the training budget.

The user names the source: `--data-dir DIR` (a GLUE TSV folder, or a local Hugging Face dataset: a `save_to_disk`
folder or parquet/JSONL/CSV files named by split), `--hub` (the Hugging Face dataset, online or from the local
datasets cache) or `--task-file` (a user's task names its own files). A named source that fails is an error naming
it. With no source named, the project's own small sample is used (sst2 only) and the run says so. The chosen
source is recorded in `TaskData.source`.
"""

from __future__ import annotations

import dataclasses
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
from pipeline.data.phrases import LEAK_WARNING, share_inside, whole_sentences
from pipeline.data.tasks import TaskSpec, get_task
from pipeline.errors import PipelineError, one_line
from pipeline.kinds import kind_of
from pipeline.kinds.base import whole_groups
from pipeline.kinds.sequence import Split
from pipeline.kinds.squad import QASplit
from pipeline.kinds.tagged import TaggedSplit
from serving.artifact import EMBEDDING

log = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).parent / "samples"  # samples/<task>/{train,dev}.tsv
HUB_HOST = "huggingface.co"


AnySplit = Split | TaggedSplit | QASplit  # one split of a sequence, token or question-answering task


def single_texts(split: AnySplit) -> list[str] | None:
    """The texts of a split of one text and a label each (not pairs, tags or questions); None for any other."""
    if isinstance(split, Split) and split.texts and len(split.texts[0]) == 1:
        return [t[0] for t in split.texts]
    return None


@dataclass(frozen=True)
class TaskData:
    """train (minus the validation slice), validation (carved from train, for choosing) and dev (the test)."""

    task: TaskSpec
    train: AnySplit
    validation: AnySplit
    dev: AnySplit
    source: str  # human-readable: where the examples came from
    validation_seed: int = 0
    validation_unit: str = "example"  # as carved: `example`, `sentence` or `document` (`auto` resolved)
    dropped_from_train: int = 0  # training texts inside a validation sentence (`validation_unit` sentence)
    random_slice_inside: float | None = None  # single-text tasks: the share of a random slice's texts inside train
    auto_chose: str | None = None  # why `auto` carved other than by example, as the report says it
    corpus: dict | None = None  # unlabelled sentences added to train (`--corpus`): folder, lines, sha256

    @property
    def fingerprint(self) -> str:
        """sha256 over every example: the cache key of anything trained on this data."""
        h = hashlib.sha256(self.task.identity.encode())
        for split in (self.train, self.validation, self.dev):
            split.digest(h)
        return h.hexdigest()

    def describe(self) -> dict:
        """What the report records of the data: source, sizes, and which validation slice was carved."""
        h = hashlib.sha256()
        self.validation.digest(h)
        unit = {} if self.validation_unit == "example" else {"unit": self.validation_unit}
        if self.dropped_from_train or self.validation_unit != "example":
            unit["dropped_from_train"] = self.dropped_from_train
        if self.validation_unit == "document":
            unit["documents"] = len(set(self.validation.documents))
        if self.auto_chose is not None:
            unit["chosen"] = f"auto: {self.auto_chose}"
        if self.random_slice_inside is not None:  # the measured leak: of this split, or behind `auto`'s switch
            key = "inside_train" if self.validation_unit == "example" else "random_slice_inside"
            unit[key] = round(self.random_slice_inside, 4)
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
                **unit,
            },
            **({"corpus": self.corpus} if self.corpus else {}),
            "fingerprint": self.fingerprint,
        }


DEFAULT_VALIDATION = DataLimits().validation  # the recipes' default: one definition, in the schema
VALIDATION_MIN = 250  # small training sets still give this many (up to a quarter of train): gates need resolution


def carve_validation(
    train: AnySplit, size: int, fraction: float, seed: int, unit: str = "example"
) -> tuple[AnySplit, AnySplit, int]:
    """(train without the slice, the slice, training examples dropped): min(`size`, `fraction` of train)
    examples drawn with `seed`, but at least min(250, a quarter of train), so one example is not a whole point of
    a gate on small data.

    At least one example stays on each side; the two parts are disjoint by construction. Questions are carved
    with their whole context (all the questions of a drawn context, until there are n): a validation question
    whose paragraph was trained on would flatter every choice made on it. With `unit` "sentence", texts that
    occur inside no other training text, and the training texts inside them are dropped (`pipeline.data.phrases`);
    with "document", whole documents of a split that marks them (CoNLL's `-DOCSTART-`: a document's sentences
    name the same people and places, so a random slice's mentions were trained on); with `example`, training
    examples that share a text with the slice, where the kind's texts recur (scored pairs: a sentence in several
    pairs).
    """
    if len(train) < 2:
        raise PipelineError(f"{len(train)} training example(s): too few to carve a validation split from")
    floor = min(VALIDATION_MIN, len(train) // 4)
    n = min(max(min(size, math.floor(fraction * len(train))), floor), len(train) - 1)
    n = max(1, n)
    dropped: set[int] = set()
    if unit == "sentence":
        texts = single_texts(train)
        if texts is None:
            raise PipelineError("data.validation_unit=sentence is for tasks of one text and a label (phrases of "
                                "sentences, as SST-2's train set holds); use `example`")  # fmt: skip
        chosen, dropped = whole_sentences(texts, n, seed)
    elif unit == "document":
        documents = marked_documents(train)
        if documents is None:
            raise PipelineError("data.validation_unit=document is for token tasks whose files mark documents "
                                "(CoNLL's -DOCSTART- lines); use `example`")  # fmt: skip
        chosen = whole_groups(documents, n, seed, most=2 * n)  # documents vary in size; a big one is passed over
    else:
        kind = kind_of(train.kind)
        chosen = kind.validation_draw(train, n, seed)
        dropped = kind.sharing_texts(train, chosen)
    kept = [i for i in range(len(train)) if i not in chosen and i not in dropped]
    return train.subset(kept), train.subset(sorted(chosen)), len(dropped)


def load_task_data(
    task: TaskSpec | str,
    data_dir: str | Path | None = None,
    max_train: int | None = None,
    max_dev: int | None = None,
    source: str | None = None,
    validation: tuple[int, float, int, str] = DEFAULT_VALIDATION,
) -> TaskData:
    """Load train/validation/dev for `task` (a spec, or a built-in task's name); `source` ("tsv", "hf-folder",
    "files", "hub", "sample") skips the resolution (see module doc); `validation` is (most examples, most fraction
    of train, seed, unit) of the carved validation split (`DataLimits.validation`)."""
    spec = get_task(task) if isinstance(task, str) else task
    source = source or resolve_source(spec, data_dir)
    if source in ("tsv", "hf-folder") and data_dir is None:
        raise PipelineError(f"source {source!r} needs a data folder")
    if source == "files":
        train, dev = read_split(spec, Path(spec.train_file)), read_split(spec, Path(spec.dev_file))
        label = f"task files {spec.train_file} and {spec.dev_file}"
    elif source == "tsv":
        train, dev, label = _from_tsv_dir(spec, Path(data_dir))
    elif source == "hf-folder":
        train, dev, label = _from_hf_folder(spec, Path(data_dir))
    elif source == "hub":
        train, dev, label = _from_hub(spec)
    else:
        train, dev, _ = _from_tsv_dir(spec, SAMPLE_DIR / spec.name)
        label = (
            f"embedded sample (pipeline/data/samples/{spec.name}, shipped with the project; "
            "pass --data-dir for real data)"
        )
    size, fraction, seed, asked = validation
    unit, reason = asked, None
    if asked == "auto":  # whole documents where the file marks them, else a random slice (unless it leaks)
        marked = marked_documents(train)
        unit = "document" if marked else "example"
        reason = f"the training file marks {len(set(marked))} documents" if marked else None
    kept, val, dropped = carve_validation(train, size, fraction, seed, unit)
    inside = _share_inside(kept, val) if unit == "example" else None  # on the whole file: max_train cannot move it
    if asked == "auto" and inside is not None and inside > LEAK_WARNING:  # the slice leaks: whole sentences instead
        unit, reason = "sentence", f"{inside:.2f} of a random slice sat inside training texts"
        kept, val, dropped = carve_validation(train, size, fraction, seed, unit)
    train, dev = _limit(kept, max_train, shuffle=True), _limit(dev, max_dev, shuffle=False)
    return TaskData(spec, train, val, dev, label, seed, unit, dropped, inside, reason)


def marked_documents(split: AnySplit) -> list[str] | None:
    """Each example's document, where the split's file marks at least two (CoNLL's `-DOCSTART-`), else None."""
    if isinstance(split, TaggedSplit) and len(set(split.documents)) > 1:
        return [str(d) for d in split.documents]
    return None


def _share_inside(train: AnySplit, validation: AnySplit) -> float | None:
    """The share of a random slice's texts that occur inside training texts (phrases of the same sentences, as
    SST-2's train set holds): `auto`'s test, and the data report's figure. Only single-text tasks can leak so."""
    if single_texts(train) is None:
        return None
    return share_inside(single_texts(validation), single_texts(train))


def resolve_source(spec: TaskSpec, data_dir: str | Path | None, hub: bool = False) -> str:
    """The source the user named ("tsv" or "hf-folder" for a folder, "hub" for the Hugging Face dataset, "files"
    for a user's task), else "sample".

    A named source that fails is an error naming it (when it is loaded); the shipped sample is used only when no
    source was named, and the run says so.
    """
    if data_dir is not None and hub:
        raise PipelineError("name one data source: --data-dir or --hub, not both")
    if spec.custom:
        if data_dir is not None or hub:
            flag = "--hub" if hub else "--data-dir"
            raise PipelineError(f"task {spec.name} names its own train and dev files (--task-file): drop {flag}")
        return "files"
    if data_dir is not None:
        folder = Path(data_dir)
        if not (folder / spec.train_file).is_file() and _hf_layout(folder, spec) is not None:
            return "hf-folder"
        return "tsv"
    if hub:
        return "hub"
    if spec.has_sample:
        log.warning(
            "no data source named: using the embedded %s sample (pass --data-dir or --hub for real data)", spec.name
        )
        return "sample"
    raise PipelineError(f"no data for task {spec.name!r} (no sample ships for it): pass --data-dir DIR or --hub")


def with_corpus(data: TaskData, folder: str, max_lines: int | None) -> TaskData:
    """`data` whose training split is its own texts followed by the first `max_lines` lines of the corpus `folder`,
    unlabelled (a sentence-embedding student learns the teacher's vectors, not scores); validation and dev as
    they were."""
    from pipeline.data.corpus import read_corpus
    from pipeline.kinds.sentences import SentenceSplit

    if data.task.kind != EMBEDDING:
        raise PipelineError(
            f"--corpus gives unlabelled sentences to sentence-embedding tasks; task {data.task.name} is "
            f"{data.task.kind}"
        )
    corpus = read_corpus(folder, max_lines)
    about = {"folder": folder, "lines": len(corpus), "files": len(corpus.files), "sha256": corpus.fingerprint}
    return dataclasses.replace(data, train=SentenceSplit(data.train.texts + corpus.texts), corpus=about)


def _limit(split: AnySplit, n: int | None, shuffle: bool) -> AnySplit:
    if n is None or n >= len(split):
        return split
    idx = list(range(len(split)))
    if shuffle:  # a seeded subset, not the first N: GLUE train files can be ordered
        random.Random(0).shuffle(idx)
    return split.subset(sorted(idx[:n]))


def _from_tsv_dir(spec: TaskSpec, folder: Path) -> tuple[Split, Split, str]:
    if not folder.is_dir():
        raise PipelineError(f"data folder not found: {folder}")
    for name in (spec.train_file, spec.dev_file):
        if not (folder / name).is_file():
            raise PipelineError(
                f"{folder}: missing {name} (task {spec.name} expects {spec.train_file} and {spec.dev_file}, or a "
                "Hugging Face dataset folder)"
            )
    train, dev = read_split(spec, folder / spec.train_file), read_split(spec, folder / spec.dev_file)
    return train, dev, f"{kind_of(spec.kind).folder_name} folder {folder.resolve()}"


# --- data files: TSV (GLUE: tabs, no quoting), CSV (quoted), JSONL (one object per line) -------------------------


def read_split(spec: TaskSpec, path: Path) -> AnySplit:
    """The examples of one data file, its format from its extension, as the task's kind reads them. Every bad row
    is an error naming the file, the line and the value: a missing column, a text that is not a string, a label
    outside the task's set."""
    if not path.is_file():
        raise PipelineError(f"data file not found: {path}")
    return kind_of(spec.kind).read(spec, path)


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


def _offline_datasets(online: bool):
    """The datasets module, reading only local files and caches unless `online`."""
    if not online:
        os.environ["HF_DATASETS_OFFLINE"] = "1"  # read at datasets' import
    import datasets

    if not online:
        datasets.config.HF_HUB_OFFLINE = True
    return datasets


def _from_hub(spec: TaskSpec) -> tuple[AnySplit, AnySplit, str]:
    """The dataset from the hub, or from the local datasets cache when offline; an error naming it otherwise."""
    if spec.hf_dataset is None:
        raise PipelineError(f"task {spec.name} has no Hugging Face dataset; pass --data-dir DIR")
    name = "/".join(spec.hf_dataset)
    online = hub_reachable()
    try:
        ds = _offline_datasets(online).load_dataset(*spec.hf_dataset)
    except Exception as e:  # unreachable and not cached, or datasets' own errors
        where = "the hub" if online else "the local datasets cache (the hub is unreachable)"
        raise PipelineError(f"--hub: dataset {name} could not be loaded from {where}: {one_line(e)}") from None
    where = "hub" if online else "local cache"
    return (
        _hf_split(spec, ds, "train", name),
        _hf_split(spec, ds, spec.hf_dev_split, name),
        f"Hugging Face dataset {name} ({where})",
    )


HF_FILE_TYPES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def _hf_layout(folder: Path, spec: TaskSpec) -> tuple[str, dict[str, list[str]]] | None:
    """How a local Hugging Face dataset folder is laid out: ("disk", {}) for `save_to_disk` output, (builder,
    {split: files}) for data files named by split (`train.parquet`, `validation-00000-of-00001.parquet`, also
    under `data/`), None when the folder is neither."""
    if (folder / "dataset_dict.json").is_file():
        return "disk", {}
    for ext, builder in HF_FILE_TYPES.items():
        files: dict[str, list[str]] = {}
        for split in ("train", *dict.fromkeys((spec.hf_dev_split, "validation", "dev"))):
            found = sorted({*folder.glob(f"{split}{ext}"), *folder.glob(f"{split}-*{ext}"),
                            *folder.glob(f"data/{split}{ext}"), *folder.glob(f"data/{split}-*{ext}")})  # fmt: skip
            if found:
                files[split] = [str(p) for p in found]
        if "train" in files and len(files) > 1:
            return builder, files
    return None


def _from_hf_folder(spec: TaskSpec, folder: Path) -> tuple[AnySplit, AnySplit, str]:
    """A local Hugging Face dataset (offline): `save_to_disk` output or parquet/JSONL/CSV files named by split."""
    if not folder.is_dir():
        raise PipelineError(f"data folder not found: {folder}")
    layout = _hf_layout(folder, spec)
    if layout is None:
        raise PipelineError(f"{folder}: neither GLUE TSV files nor a Hugging Face dataset folder")
    builder, files = layout
    datasets = _offline_datasets(online=False)
    try:
        if builder == "disk":
            ds = datasets.load_from_disk(str(folder))
        else:
            ds = datasets.load_dataset(builder, data_files=files)
    except Exception as e:
        raise PipelineError(f"{folder}: the Hugging Face dataset could not be loaded: {one_line(e)}") from None
    if not isinstance(ds, datasets.DatasetDict):
        raise PipelineError(f"{folder}: a single split; save a DatasetDict with train and validation splits")
    dev = next((n for n in (spec.hf_dev_split, "validation", "dev") if n in ds), None)
    if "train" not in ds or dev is None:
        raise PipelineError(f"{folder}: needs a train and a validation (or dev) split; it has {', '.join(ds)}")
    kind = "save_to_disk folder" if builder == "disk" else f"{builder} files"
    where = str(folder.resolve())
    return (
        _hf_split(spec, ds, "train", where),
        _hf_split(spec, ds, dev, where),
        f"Hugging Face dataset {where} ({kind}, offline)",
    )


def _hf_split(spec: TaskSpec, ds, part_name: str, where: str) -> AnySplit:
    """One split of a Hugging Face dataset: integer labels are class ids (GLUE's test-style -1 rows are
    dropped), string labels are the task's label values. NER splits hold words and tags (ids in the task's tag
    order, which is the dataset's, or names); QA splits SQuAD's rows (id, question, context, answers)."""
    if part_name not in ds:
        raise PipelineError(f"{where}: no split {part_name!r}; it has {', '.join(ds)}")
    part = ds[part_name]
    kind = kind_of(spec.kind)
    missing = [c for c in kind.hf_columns(spec) if c not in part.column_names]
    if missing:
        raise PipelineError(
            f"{where}: split {part_name} has no column(s) {', '.join(missing)}; it has {', '.join(part.column_names)}"
        )
    return kind.hf_split(spec, part, where, part_name)


@dataclass(frozen=True)
class DataRef:
    """What stages pass instead of data: enough to reload the same examples (loading is cheap and deterministic)."""

    task: TaskSpec
    source: str  # "tsv", "hf-folder", "files", "hub" or "sample", resolved once by `resolve_source`
    data_dir: str | None = None
    max_train: int | None = None
    max_dev: int | None = None
    validation: tuple[int, float, int, str] = DEFAULT_VALIDATION  # (most examples, most fraction, seed, unit)
    corpus: str | None = None  # a folder of unlabelled sentences for a sentence-embedding task's training split
    corpus_lines: int | None = None  # the first this many of them

    def load(self) -> TaskData:
        data = load_task_data(self.task, self.data_dir, self.max_train, self.max_dev, self.source, self.validation)
        return data if self.corpus is None else with_corpus(data, self.corpus, self.corpus_lines)
