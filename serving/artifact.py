"""The artifact contract: what a published artifact folder holds, under which names, and how a reader checks it.

The pipeline writes artifacts and the server, `pipeline evaluate` and the load test read them; all of them take
the file names, the task block's key and the checks from here. It imports nothing of the pipeline and no torch
(the slim serving image ships `serving/` alone); the pipeline imports it, the one arrow into `serving/`.

Integrity: `manifest.json` lists the sha256 of every file. A reader refuses an artifact whose files differ from
it. Authenticity: a manifest cannot tell a file that was changed *and* re-hashed into the manifest, so an
artifact may also carry a signature over all its files (`model.sig`, OpenSSF model-signing with an elliptic-curve
key, offline, no transparency log). A reader given a trusted public key refuses an artifact that is unsigned or
whose signature does not verify with that key; without one, unsigned artifacts keep working.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

MODEL_FP32 = "model.onnx"
MODEL_INT8 = "model.int8.onnx"
MODEL_FP16 = "model.fp16.onnx"  # for CUDA: fp16 weights and activations, fp32 inputs and outputs
GRAPHS = {"fp32": MODEL_FP32, "int8": MODEL_INT8, "fp16": MODEL_FP16}
LATER_GRAPHS = {"fp16"}  # graphs artifacts published before them lack; every reader takes them where present
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
PYTORCH = "pytorch"  # the compacted safetensors model, reloadable at its per-layer shapes
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
LATENCY_PLOT = "latency.png"
MODEL_CARD = "README.md"  # Hugging Face's metadata block and how the model was made
MANIFEST = "manifest.json"
SIGNATURE = "model.sig"  # written after the manifest; the only file the manifest does not list
# The task block in config.json and manifest.json (name, kind, labels, text columns, pair, metric, and max_length:
# the tokens per text the model was trained and validated at, the server's default).
TASK_KEY = "encoder_deploy_task"
# The task block's kinds: transformers' pipeline names (a block without one, from before kinds, is SEQUENCE), and
# the class-name suffix of each kind's head in transformers and Optimum (AutoModel<suffix>, ORTModel<suffix>).
SEQUENCE, TOKEN, QA = "sequence-classification", "token-classification", "question-answering"
# Sentence embeddings have no task head: the bare encoder (`BertModel`), its pooling and normalisation.
EMBEDDING = "sentence-embedding"
HEAD_SUFFIXES = {SEQUENCE: "ForSequenceClassification", TOKEN: "ForTokenClassification", QA: "ForQuestionAnswering"}


DEFAULT_MAX_LENGTH = 128  # tokens per text of an artifact whose task block does not say (made before it did)


def graphs_in(artifact: str | Path) -> dict[str, str]:
    """The artifact's graphs by precision: every one of `GRAPHS`, less those added later that it was made without."""
    return {p: f for p, f in GRAPHS.items() if p not in LATER_GRAPHS or (Path(artifact) / f).is_file()}


def task_kind(block: dict | None) -> str:
    """The kind a task block names."""
    return (block or {}).get("kind", SEQUENCE)


def trained_length(block: dict | None) -> int:
    """Tokens per text the artifact was trained and validated at, as its task block says: what it is served at."""
    return (block or {}).get("max_length") or DEFAULT_MAX_LENGTH


def pipeline_tag(kind: str) -> str:
    """The Hugging Face pipeline tag (and Optimum export task) of a kind: sequence classification's is
    `text-classification`, sentence embeddings' the hub's `sentence-similarity`."""
    return {SEQUENCE: "text-classification", EMBEDDING: "sentence-similarity"}.get(kind, kind)


def kind_of_class(name: str) -> str | None:
    """The kind of a transformers or Optimum class by its name's suffix (None: no task head of a known kind)."""
    return next((kind for kind, suffix in HEAD_SUFFIXES.items() if name.endswith(suffix)), None)


def max_positions(config: dict) -> int | None:
    """Tokens the artifact's position embeddings cover, as its task block says (`positions`, written at export from
    the model family's rule): no text may be tokenised longer. An artifact from before the block said it: its
    config's `max_position_embeddings` less 2, the most any supported family reserves (RoBERTa's pad offset)."""
    positions = (config.get(TASK_KEY) or {}).get("positions")
    if positions is not None:
        return positions
    n = config.get("max_position_embeddings")
    return None if n is None else n - 2


class ArtifactError(Exception):
    """The artifact folder is incomplete, differs from its manifest, or fails its signature check."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(artifact: Path) -> dict:
    try:
        manifest = json.loads((Path(artifact) / MANIFEST).read_text())
        dict(manifest["files"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{artifact}: unreadable {MANIFEST} ({type(e).__name__}: {e})") from None
    return manifest


def check_integrity(artifact: str | Path, required: tuple[str, ...] = ()) -> None:
    """Refuse an artifact whose files differ from the sha256 recorded in its manifest, or whose manifest does not
    list every file in `required` (the files about to be loaded)."""
    artifact = Path(artifact)
    files = dict(read_manifest(artifact)["files"])
    unlisted = [n for n in required if n not in files]
    if unlisted:
        raise ArtifactError(f"{artifact}: {MANIFEST} does not list {', '.join(unlisted)}")
    bad = [n for n, d in files.items() if not (artifact / n).is_file() or sha256(artifact / n) != d]
    if bad:
        raise ArtifactError(f"{artifact}: files differ from {MANIFEST}: {', '.join(sorted(bad))}")


def _hashing():
    from model_signing import hashing

    # Nothing but the signature itself is left out: the library would skip git's files (.git/, .gitignore,
    # .gitattributes, .github/) by default, and an artifact with such a file added would still verify.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False)


KEY_TYPES = "elliptic-curve keys (PEM: P-256, P-384 or P-521)"


def _read_key(path: str | Path, private: bool) -> None:
    """Refuse a key file that cannot be read, or whose key is not an elliptic-curve one, naming what it is."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

    what = "signing key" if private else "trusted key"
    try:
        data = Path(path).read_bytes()
        key = load_pem_private_key(data, password=None) if private else load_pem_public_key(data)
    except (OSError, ValueError, TypeError) as e:
        raise ArtifactError(f"{what} {path}: {_first_line(e)}; supported: {KEY_TYPES}") from None
    wanted = ec.EllipticCurvePrivateKey if private else ec.EllipticCurvePublicKey
    if not isinstance(key, wanted):
        kind = type(key).__name__.removeprefix("_").removesuffix("PrivateKey").removesuffix("PublicKey")
        raise ArtifactError(f"{what} {path} is not an elliptic-curve key ({kind}); supported: {KEY_TYPES}")


def sign(artifact: str | Path, private_key: str | Path) -> Path:
    """Sign every file of `artifact` (the manifest included) with an elliptic-curve private key (PEM); returns the
    signature file."""
    from model_signing import signing

    artifact = Path(artifact)
    try:
        config = signing.Config().use_elliptic_key_signer(private_key=Path(private_key))
    except (OSError, ValueError, TypeError) as e:
        raise ArtifactError(f"cannot sign with {private_key}: {_first_line(e)}") from None
    config.set_hashing_config(_hashing()).sign(artifact, artifact / SIGNATURE)
    return artifact / SIGNATURE


def check_signing_key(private_key: str | Path) -> None:
    """Refuse, before any work, a signing key that is missing or not an unencrypted elliptic-curve private key."""
    _read_key(private_key, private=True)


def verify_signature(artifact: str | Path, public_key: str | Path) -> None:
    """Refuse `artifact` unless its signature verifies with `public_key` (PEM) over exactly its files."""
    from model_signing import verifying

    artifact = Path(artifact)
    if not (artifact / SIGNATURE).is_file():
        raise ArtifactError(f"{artifact} is not signed (no {SIGNATURE}), and a trusted key was given")
    _read_key(public_key, private=False)
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key))
    except (OSError, ValueError, TypeError) as e:
        raise ArtifactError(f"trusted key {public_key}: {_first_line(e)}") from None
    try:
        config.set_hashing_config(_hashing()).verify(artifact, artifact / SIGNATURE)
    except Exception as e:  # the library's own errors: ValueError on a mismatch, others on a malformed bundle
        raise ArtifactError(f"{artifact}: signature does not verify with {public_key}: {_mismatch(e)}") from None


def verify(artifact: str | Path, required: tuple[str, ...] = (), trust_key: str | Path | None = None) -> None:
    """Every reader's check: the files match the manifest, and, given a trusted key, the signature verifies."""
    check_integrity(artifact, required)
    if trust_key is not None:
        verify_signature(artifact, trust_key)


def _mismatch(e: BaseException) -> str:
    """The library's mismatch report (digests of every file) cut down to which files differ, and how."""
    text = str(e)
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)", text)  # inside a list's repr, quotes are escaped
    extra = re.findall(r"Extra files found in model '[^']*': ([^\]\"]+)", text)
    missing = re.findall(r"Missing files in model '[^']*': ([^\]\"]+)", text)
    parts = [f"{what}: {', '.join(names)}" for what, names in (("changed", changed), ("not signed", extra),
             ("missing", missing)) if names]  # fmt: skip
    return "; ".join(parts) if parts else _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
