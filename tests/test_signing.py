"""Integrity everywhere, authenticity when asked: every reader checks an artifact against its manifest, and a
signed artifact (OpenSSF model-signing, an elliptic-curve key) is refused by a reader holding the trusted public
key when any file changed, the manifest was re-hashed to match, the signature is missing or the key is wrong."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from serving.artifact import MANIFEST, SIGNATURE, ArtifactError, sign, verify
from tests.helpers import assert_one_line_error, cli_deploy, quick_deploy, tiny_artifact, write_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    return {"mine": write_keys(root, "mine"), "other": write_keys(root, "other")}


@pytest.fixture
def signed(keys, tmp_path_factory, tmp_path):
    """A fresh copy of a tiny published artifact, signed with `mine`."""
    artifact = shutil.copytree(tiny_artifact(tmp_path_factory.getbasetemp() / "signing"), tmp_path / "artifact")
    sign(artifact, keys["mine"][0])
    return artifact


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def rehash_manifest(artifact: Path) -> None:
    """What an attacker who changed files would do next: write their new sha256 into the manifest."""
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"] = {n: hashlib.sha256((artifact / n).read_bytes()).hexdigest() for n in manifest["files"]}
    (artifact / MANIFEST).write_text(json.dumps(manifest))


def test_a_signed_artifact_verifies_with_its_key(signed, keys):
    verify(signed, trust_key=keys["mine"][1])
    assert (signed / SIGNATURE).is_file()


def test_one_byte_changed_in_any_file_is_refused(signed, keys):
    files = sorted(json.loads((signed / MANIFEST).read_text())["files"])
    assert "model.onnx" in files and "tokenizer.json" in files
    for name in [*files, MANIFEST]:
        copy = shutil.copytree(signed, signed.parent / f"t-{name.replace('/', '_')}")
        flip_a_byte(copy / name)
        with pytest.raises(ArtifactError) as err:
            verify(copy, trust_key=keys["mine"][1])
        assert "\n" not in str(err.value)
        if name != MANIFEST:  # the manifest check alone already refuses it
            with pytest.raises(ArtifactError, match=r"files differ from manifest\.json"):
                verify(copy)


def test_a_rehashed_manifest_passes_the_checksums_but_not_the_signature(signed, keys):
    flip_a_byte(signed / "model.onnx")
    rehash_manifest(signed)
    verify(signed)  # the checksums alone cannot tell
    with pytest.raises(ArtifactError, match=r"signature does not verify .*changed: manifest\.json, model\.onnx"):
        verify(signed, trust_key=keys["mine"][1])


def test_a_missing_signature_or_the_wrong_key_is_refused(signed, keys):
    with pytest.raises(ArtifactError, match="Key mismatch"):
        verify(signed, trust_key=keys["other"][1])
    (signed / SIGNATURE).unlink()
    with pytest.raises(ArtifactError, match="is not signed"):
        verify(signed, trust_key=keys["mine"][1])
    verify(signed)  # without a trusted key, unsigned artifacts keep working


def test_evaluate_refuses_a_tampered_artifact(signed, keys):
    flip_a_byte(signed / "model.int8.onnx")
    result = CliRunner().invoke(app, ["evaluate", str(signed)])
    assert_one_line_error(result, "refusing to evaluate: ")
    assert "files differ from manifest.json: model.int8.onnx" in result.stderr
    rehash_manifest(signed)
    result = CliRunner().invoke(app, ["evaluate", str(signed), "--trust-key", str(keys["mine"][1])])
    assert_one_line_error(result, "signature does not verify")


@pytest.mark.parametrize("which", ["public", "missing"])
def test_a_signing_key_that_cannot_sign_is_refused_before_any_work(which, keys):
    key = keys["mine"][1] if which == "public" else Path("nowhere.pem")
    result = cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--sign-key", str(key))
    assert_one_line_error(result, "signing key")
    assert not Path("artifacts").exists()


@pytest.mark.e2e
def test_a_signed_deploy_evaluates_with_the_trusted_key(classifier_dirs, keys, tmp_path):
    budget = ("--steps", "2", "--set", "config.tune_steps=1")  # the signature is the point, not the fusion
    _, artifact = quick_deploy(
        "mlp_fusion", classifier_dirs["bert"], tmp_path, *budget, "--sign-key", str(keys["mine"][0])
    )
    assert (artifact / SIGNATURE).is_file()
    trusted = ["--trust-key", str(keys["mine"][1]), "--max-examples", "8"]
    ok = subprocess.run([sys.executable, "-m", "pipeline.cli", "evaluate", str(artifact), *trusted],
                        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["examples"] == 8
    wrong = ["--trust-key", str(keys["other"][1])]
    refused = subprocess.run([sys.executable, "-m", "pipeline.cli", "evaluate", str(artifact), *wrong],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.strip().startswith("error: refusing to evaluate")


def test_the_server_refuses_what_does_not_verify_with_its_trusted_key(signed, keys):
    from serving.config import ServerConfig
    from serving.server import StartupError, load_model

    assert load_model(ServerConfig(artifact=signed, trust_key=keys["mine"][1])).labels
    with pytest.raises(StartupError, match=r"refusing to serve: .*Key mismatch"):
        load_model(ServerConfig(artifact=signed, trust_key=keys["other"][1]))
    flip_a_byte(signed / "tokenizer.json")
    rehash_manifest(signed)
    with pytest.raises(StartupError, match=r"refusing to serve: .*changed: manifest\.json, tokenizer\.json"):
        load_model(ServerConfig(artifact=signed, trust_key=keys["mine"][1]))


def test_python_m_serving_refuses_an_unsigned_artifact_with_a_trusted_key(keys, tmp_path_factory):
    unsigned = tiny_artifact(tmp_path_factory.getbasetemp() / "signing")
    result = subprocess.run([sys.executable, "-m", "serving", str(unsigned), "--port", "0", "--trust-key",
                             str(keys["mine"][1])], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    expected = f"error: refusing to serve: {unsigned} is not signed (no model.sig), and a trusted key was given"
    assert result.stderr.strip().splitlines() == [expected]


@pytest.mark.parametrize("added", ["notes.txt", ".gitignore", ".gitattributes", ".git/config", ".github/x.yml"])
def test_any_added_file_is_refused_git_files_too(signed, keys, added):
    """The signing library skips git's files unless told not to: an added .gitignore or .git/ verified."""
    path = signed / added
    path.parent.mkdir(exist_ok=True)
    path.write_text("added\n")
    with pytest.raises(ArtifactError, match="signature does not verify"):
        verify(signed, trust_key=keys["mine"][1])


def _rsa_pair(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = folder / "rsa.pem", folder / "rsa.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def test_an_rsa_key_is_refused_naming_the_supported_types(signed, tmp_path):
    from serving.artifact import check_signing_key

    private, public = _rsa_pair(tmp_path)
    refused = r"is not an elliptic-curve key \(RSA\); supported: elliptic-curve keys \(PEM"
    with pytest.raises(ArtifactError, match=refused) as err:
        verify(signed, trust_key=public)
    assert "\n" not in str(err.value) and "curve'" not in str(err.value)
    with pytest.raises(ArtifactError, match=r"is not an elliptic-curve key \(RSA\)"):
        check_signing_key(private)
    result = CliRunner().invoke(app, ["evaluate", str(signed), "--trust-key", str(public)])
    assert_one_line_error(result, "is not an elliptic-curve key (RSA); supported: elliptic-curve keys")
