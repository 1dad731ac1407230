"""Adaptive embedding and adaptive softmax: the explicit formulas, ties, the Keras contract, the
tail paths (TensorFlow's sparse one, the static-shape one of the other backends)."""

import keras
import numpy as np
import pytest
from keras import ops

import tfxl.layers.adaptive_softmax as adaptive_softmax
from tfxl import backend
from backends import BACKEND, to_numpy, value_and_gradients
from factories import tiny_lm
from layer_test_case import run_layer_test
from naive_reference import adaptive_log_probs
from tfxl.layers import AdaptiveEmbedding, AdaptiveSoftmax

pytestmark = pytest.mark.every_backend

VOCAB = 30


def explicit_clusters(softmax, embedding=None):
    """The softmax's parameters per cluster as numpy, resolving ties by hand."""
    out = []
    for i, c in enumerate(softmax.clusters):
        if softmax.tie_weight:
            weight = embedding.cluster_weight(i)
        else:
            weight = softmax.weights_per_cluster[i]
        if not c.projected:
            proj = None
        elif softmax.tie_projs[i]:
            proj = np.transpose(to_numpy(embedding.cluster_projection(i)))
        else:
            proj = softmax.projections[i]
        d = dict(weight=to_numpy(weight).astype(np.float64),
                 bias=to_numpy(softmax.bias)[c.start:c.end].astype(np.float64),
                 proj=None if proj is None else to_numpy(proj).astype(np.float64))
        if i == 0 and softmax.num_tail_clusters:
            d["cluster_weight"] = to_numpy(softmax.cluster_weight).astype(np.float64)
            d["cluster_bias"] = to_numpy(softmax.cluster_bias).astype(np.float64)
        out.append(d)
    return out


def randomise(layer):
    for v in layer.weights:
        v.assign(np.random.randn(*v.shape).astype(np.float32) * 0.5)


@pytest.mark.parametrize("cutoffs,div_val,d_embed", [
    ((), 1, 12), ((), 1, 8), ((10,), 1, 12), ((6, 15), 2, 12), ((6, 15, 22), 2, 12)])
def test_softmax_normalises_and_matches_explicit_formula(cutoffs, div_val, d_embed):
    softmax = AdaptiveSoftmax(VOCAB, d_embed, 12, cutoffs, div_val, proj_same_dim=False)
    softmax.build((None, None, 12))
    randomise(softmax)
    hidden = np.random.randn(2, 5, 12).astype(np.float32)
    log_probs = to_numpy(softmax(hidden))
    assert log_probs.shape == (2, 5, VOCAB)
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(log_probs, adaptive_log_probs(hidden, explicit_clusters(softmax)),
                               atol=1e-5)


@pytest.mark.parametrize("cutoffs,div_val", [((), 1), ((6, 15), 1), ((6, 15), 2), ((6, 15), 3)])
def test_nll_equals_gathered_log_probs(cutoffs, div_val):
    softmax = AdaptiveSoftmax(VOCAB, 12, 12, cutoffs, div_val)
    softmax.build((None, None, 12))
    randomise(softmax)
    hidden = np.random.randn(3, 7, 12).astype(np.float32)
    targets = np.random.randint(0, VOCAB, (3, 7))
    targets[0, :3] = [0, 6, 29]  # cluster edges
    nll = to_numpy(softmax(hidden, targets))
    log_probs = to_numpy(softmax(hidden))
    gathered = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, -gathered, atol=1e-5)


def nll_and_gradients(softmax, hidden, targets, path, monkeypatch):
    """The summed NLL of `targets` and its gradients (the softmax's weights, then the hidden
    states) by `path`: "full" gathers the full log-probabilities; "sparse" and "static" are the
    NLL's two tail paths (TensorFlow's, and the other backends')."""
    monkeypatch.setattr(backend.current(), "SPARSE_TAIL", path == "sparse")
    hidden = keras.Variable(hidden, name="hidden")  # its gradient is taken as the weights' are
    targets = ops.convert_to_tensor(targets)
    if path == "full":
        loss = lambda: -ops.sum(ops.take_along_axis(softmax(hidden), targets[..., None], axis=-1))
    else:
        loss = lambda: ops.sum(softmax(hidden, targets))
    return value_and_gradients(loss, [*softmax.trainable_variables, hidden])


@pytest.mark.parametrize("paths", [pytest.param(("full", "static"), marks=pytest.mark.large),
                                   ("full", "sparse")])
def test_the_tail_paths_give_the_full_softmaxs_nll_and_gradients(paths, monkeypatch):
    """Both tail paths of the NLL against the full log-probabilities: the same loss and the same
    gradients for every weight and the hidden states. The static path in chunks of 5 rows of the
    larger cluster (15 ids) and 8 of the other (9 ids), each with a padded last chunk of the 21
    rows."""
    if "sparse" in paths and BACKEND != "tensorflow":
        pytest.skip("the sparse tail path is TensorFlow's")
    monkeypatch.setattr(adaptive_softmax, "TAIL_CHUNK_ELEMENTS", 75)
    softmax = AdaptiveSoftmax(VOCAB, 12, 12, (6, 15), 2, proj_same_dim=False)
    softmax.build((None, None, 12))
    randomise(softmax)
    hidden = np.random.randn(3, 7, 12).astype(np.float32)
    targets = np.random.randint(0, VOCAB, (3, 7))
    targets[0, :3] = [5, 6, 29]  # cluster edges
    (want, want_grads), (got, got_grads) = (
        nll_and_gradients(softmax, hidden, targets, path, monkeypatch) for path in paths)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert len(got_grads) == len(want_grads) == len(softmax.trainable_variables) + 1
    for g, w, v in zip(got_grads, want_grads, [*softmax.trainable_variables, None]):
        np.testing.assert_allclose(g, w, atol=1e-5, err_msg=v.path if v is not None else "hidden")


def test_no_cutoffs_is_a_dense_softmax():
    softmax = AdaptiveSoftmax(VOCAB, 12, 12)
    softmax.build((None, None, 12))
    randomise(softmax)
    hidden = np.random.randn(2, 3, 12).astype(np.float32)
    logits = (hidden @ to_numpy(softmax.weights_per_cluster[0]).T
              + to_numpy(softmax.bias)).astype(np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(to_numpy(softmax(hidden)), log_softmax, atol=1e-5)


@pytest.mark.large
@pytest.mark.parametrize("div_val,tie_projs", [(1, (False, False, False)), (2, (False, True, True)),
                                               (2, (True, True, True))])
def test_tied_weights_and_projections_in_the_language_model(div_val, tie_projs):
    lm = tiny_lm(vocab_size=VOCAB, n_layer=1, d_model=12, d_head=4, d_inner=16, d_embed=16,
                 cutoffs=(6, 15), div_val=div_val, tie_weight=True, tie_projs=tie_projs,
                 tgt_len=5, mem_len=0, init_std=0.02)
    ids = np.random.randint(0, VOCAB, (2, 5))
    nll, _ = lm(ids, targets=ids)
    softmax, embedding = lm.softmax, lm.backbone.embedding
    # Tied: the softmax owns no output table, and a projection only where it is not tied.
    assert not [v for v in softmax.weights if v.name.startswith("weight_")]
    n_own_proj = sum(v.name.startswith("projection_") for v in softmax.weights)
    assert n_own_proj == sum(c.projected and not t for c, t in zip(softmax.clusters, tie_projs))
    hidden, _ = lm.backbone(ids)
    want = adaptive_log_probs(to_numpy(hidden).astype(np.float64),
                              explicit_clusters(softmax, embedding))
    np.testing.assert_allclose(to_numpy(nll),
                               -np.take_along_axis(want, ids[..., None], -1)[..., 0], atol=1e-5)
    # Tying means one variable: a gradient step on the loss moves the embedding table.
    _, grads = value_and_gradients(lambda: ops.mean(lm(ids, targets=ids)[0]),
                                   lm.trainable_variables)
    moved = [v.path for v, g in zip(lm.trainable_variables, grads)
             if g is not None and np.abs(g).max() > 0]
    assert any("embedding/table_" in n for n in moved)


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_embedding_matches_per_cluster_lookup(div_val):
    emb = AdaptiveEmbedding(VOCAB, 12, 8, (6, 15), div_val, proj_same_dim=True)
    emb.build()
    ids = np.arange(VOCAB).reshape(3, 10)
    got = to_numpy(emb(ids))
    for t in range(VOCAB):
        i = sum(t >= c for c in (6, 15))
        c = emb.clusters[i]
        row = to_numpy(emb.cluster_weight(i))[t - c.start]
        proj = emb.cluster_projection(i)
        if proj is not None:
            row = row @ to_numpy(proj)
        np.testing.assert_allclose(got.reshape(-1, 8)[t], row * np.sqrt(8), atol=1e-6)


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_embedding_keras_contract(div_val):
    ids = np.random.randint(0, VOCAB, (2, 5))
    run_layer_test(AdaptiveEmbedding, dict(vocab_size=VOCAB, d_embed=12, d_model=8,
                                           cutoffs=(6, 15), div_val=div_val, init_std=0.3,
                                           proj_init_std=0.3),
                   (ids,), expected_output_shape=(2, 5, 8))


@pytest.mark.parametrize("with_targets", [False, True])
@pytest.mark.parametrize("tie_projs", [None, (False, True, True)])
def test_adaptive_softmax_keras_contract(with_targets, tie_projs):
    hidden = np.random.randn(2, 5, 8).astype(np.float32)
    targets = np.random.randint(0, VOCAB, (2, 5)) if with_targets else None
    kwargs = dict(vocab_size=VOCAB, d_embed=12, d_model=8, cutoffs=(6, 15), div_val=2,
                  tie_projs=tie_projs, init_std=0.3, proj_init_std=0.3)
    tied_projections = None
    if tie_projs:  # an embedding's [d_i, D] projections, as the language model passes them
        embedding = AdaptiveEmbedding(**{k: kwargs[k] for k in ("vocab_size", "d_embed",
                                                                 "d_model", "cutoffs", "div_val")})
        embedding.build()
        tied_projections = [np.random.randn(*p.shape).astype(np.float32) * 0.3
                            for p in embedding.projections]
    run_layer_test(AdaptiveSoftmax, kwargs, (hidden, targets, None, tied_projections),
                   expected_output_shape=(2, 5) if with_targets else (2, 5, VOCAB))
