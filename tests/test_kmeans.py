"""Tests for pipeline.compress.methods.mlp_fusion.kmeans (torch k-means used by MLP Fusion)."""

import numpy as np
import pytest
import torch

import pipeline.compress.methods.mlp_fusion.kmeans as km
from pipeline.compress.methods.mlp_fusion.kmeans import KMeansResult, kmeans, kmeans_batched


def _blobs(n_per=20, k=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 20
    truth = torch.arange(k).repeat_interleave(n_per)
    x = centres[truth] + 0.1 * torch.randn(k * n_per, d, generator=g)
    perm = torch.randperm(k * n_per, generator=g)
    return x[perm], truth[perm]


def _same_partition(a, b):
    """True when the labelings a and b define the same partition (ids may differ)."""
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def _check_valid(r: KMeansResult, x, k):
    assert r.labels.dtype == torch.int64 and r.labels.shape == (x.shape[0],)
    assert r.centers.dtype == torch.float32 and r.centers.shape == (k, x.shape[1])
    assert r.counts.dtype == torch.int64 and (r.counts > 0).all()
    assert torch.equal(r.counts, torch.bincount(r.labels, minlength=k))
    assert int(r.labels.min()) >= 0 and int(r.labels.max()) < k


@pytest.fixture
def direct_path(monkeypatch):
    """Forces the plain-matmul code path instead of the Gram-matrix one."""
    monkeypatch.setattr(km, "_GRAM_MAX_BYTES", 0)


def test_k_equals_n_is_identity():
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    r = kmeans(x, 30)
    _check_valid(r, x, 30)
    assert sorted(r.labels.tolist()) == list(range(30))
    assert r.inertia == 0.0
    assert torch.equal(r.centers[r.labels], x)


@pytest.mark.parametrize("path", ["gram", "direct"])
def test_blobs_recovered(path, request):
    if path == "direct":
        request.getfixturevalue("direct_path")
    x, truth = _blobs()
    r = kmeans(x, 5, seed=3)
    _check_valid(r, x, 5)
    assert _same_partition(r.labels, truth)
    expected = sum(float(((x[truth == c] - x[truth == c].mean(0)) ** 2).sum()) for c in range(5))
    assert r.inertia == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("path", ["gram", "direct"])
def test_duplicates_leave_no_empty_cluster(path, request):
    if path == "direct":
        request.getfixturevalue("direct_path")
    x = torch.ones(50, 3)
    r = kmeans(x, 10)
    _check_valid(r, x, 10)
    assert r.inertia == 0.0
    # Mostly duplicates plus a few distinct points: still every cluster non-empty.
    y = torch.cat([torch.zeros(40, 3), torch.randn(5, 3, generator=torch.Generator().manual_seed(0))])
    r = kmeans(y, 12, n_init=2)
    _check_valid(r, y, 12)


def test_deterministic_for_fixed_seed():
    x = torch.randn(200, 6, generator=torch.Generator().manual_seed(2))
    a, b = kmeans(x, 16, seed=7), kmeans(x, 16, seed=7)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.centers, b.centers)
    assert a.inertia == b.inertia and a.n_iter == b.n_iter
    torch.manual_seed(123)  # the global RNG must not matter
    c = kmeans(x, 16, seed=7)
    assert torch.equal(a.labels, c.labels)


def test_inertia_and_centres_match_numpy():
    x = torch.randn(300, 10, generator=torch.Generator().manual_seed(4))
    r = kmeans(x, 20)
    xn, lab = x.double().numpy(), r.labels.numpy()
    centres = np.stack([xn[lab == j].mean(0) for j in range(20)])
    np.testing.assert_allclose(r.centers.numpy(), centres, rtol=1e-5, atol=1e-6)
    inertia = float(((xn - r.centers.double().numpy()[lab]) ** 2).sum())
    assert r.inertia == pytest.approx(inertia, rel=1e-10)


def test_batched_equals_per_layer():
    xs = torch.randn(3, 120, 7, generator=torch.Generator().manual_seed(5))
    batched = kmeans_batched(xs, 12, n_init=2, seed=11)
    assert len(batched) == 3
    for x, rb in zip(xs, batched, strict=True):
        rs = kmeans(x, 12, n_init=2, seed=11)
        assert torch.equal(rb.labels, rs.labels)
        assert torch.allclose(rb.centers, rs.centers)
        assert rb.inertia == pytest.approx(rs.inertia, rel=1e-12) and rb.n_iter == rs.n_iter


@pytest.mark.parametrize(
    "x, k",
    [
        (torch.randn(10, 3), 0),
        (torch.randn(10, 3), 11),
        (torch.randn(10, 3), 2.0),
        (torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), 1),
        (torch.tensor([[0.0, float("inf")], [1.0, 2.0]]), 1),
        (torch.randn(10), 2),
        (torch.randn(2, 10, 3), 2),
        (torch.randint(0, 5, (10, 3)), 2),
    ],
)
def test_bad_inputs_raise(x, k):
    with pytest.raises(ValueError):
        kmeans(x, k)


def test_batched_bad_inputs_raise():
    with pytest.raises(ValueError):
        kmeans_batched(torch.randn(10, 3), 2)
    with pytest.raises(ValueError):
        kmeans_batched(torch.randn(2, 10, 3), 11)
    with pytest.raises(ValueError):
        kmeans(torch.randn(10, 3), 2, n_init=0)


def test_close_to_sklearn():
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    x = torch.randn(512, 65, generator=torch.Generator().manual_seed(0))
    ours = kmeans(x, 64, n_init=3, seed=0)
    sk = sklearn_cluster.KMeans(n_clusters=64, n_init=3, algorithm="lloyd", random_state=0).fit(x.numpy())
    _check_valid(ours, x, 64)
    assert ours.inertia <= 1.02 * float(sk.inertia_)
