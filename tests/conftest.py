"""Shared fixtures: tiny model folders built once per session, and isolation from the real machine state."""

import os

import pytest

# Tests never reach a hub: fail fast instead of retrying for half a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers share the machine's cores: torch's OpenMP threads in each would spin against the other's on the
    # tiny models' many small ops (a 0.3 s test took 14 s). One intra-op thread per worker; subprocesses keep
    # their own settings.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Run every test in its own folder with its own cache, so nothing is written into the checkout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def client():
    """An HTTP client for the servers the tests start on loopback."""
    import httpx

    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def artifact(tmp_path_factory):
    """The tiny published SST-2 artifact the serving tests share (built once per session and worker)."""
    from tests.helpers import tiny_artifact

    return tiny_artifact(tmp_path_factory.getbasetemp() / "serving")


@pytest.fixture(scope="session")
def session(artifact):
    """The artifact's ONNX Runtime session."""
    from serving.session import ArtifactSession

    return ArtifactSession(artifact)


@pytest.fixture(scope="session")
def base_dirs(tmp_path_factory):
    """Bare tiny encoders (like hub base models) for BERT and RoBERTa."""
    from tests.helpers import write_tiny_model_dir

    root = tmp_path_factory.mktemp("base")
    return {kind: write_tiny_model_dir(root / kind, kind, classifier=False) for kind in ("bert", "roberta")}


@pytest.fixture(scope="session")
def classifier_dirs(tmp_path_factory):
    """Tiny random sequence classifiers (usable as --teacher) for BERT and RoBERTa."""
    from tests.helpers import write_tiny_model_dir

    root = tmp_path_factory.mktemp("clf")
    return {kind: write_tiny_model_dir(root / kind, kind, classifier=True) for kind in ("bert", "roberta")}


def pytest_sessionfinish(session, exitstatus):
    """Stop this process's shared Prefect server (tests.helpers.shared_prefect_api), if a test started it."""
    from tests.helpers import stop_shared_prefect_server

    stop_shared_prefect_server()


def pytest_collection_modifyitems(config, items):
    """Modules with end-to-end tests first, so that under `-n 2` the minute-long deploys start at once and the many
    short tests fill the workers' tails, instead of one worker finishing a deploy alone at the end (a stable sort by
    module: its tests stay together, for its module-scoped fixtures, and in the same order on every worker). `gpu`
    tests need CUDA; skip them (visibly) where there is none."""
    import torch

    deploys = {item.module.__name__ for item in items if "e2e" in item.keywords}
    items.sort(key=lambda item: item.module.__name__ not in deploys)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
