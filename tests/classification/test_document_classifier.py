"""DocumentClassifier: reading with memory is exact, padding changes nothing, memory carries the
first segment to the logits, gradients reach exactly the last K segments, `.keras` round trip,
and starting from a language model."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from factories import tiny_config, tiny_lm
from layer_test_case import run_layer_test
from tfxl.classification import POOLINGS, DocumentClassifier, SegmentAttentionPooling
from tfxl.classification.readings import LENGTHS, TOKEN_IDS

T = 4  # tiny_config's tgt_len: the classifier's segment length


def documents(lengths, total, seed=0):
    """Right-padded random documents [B, total] (junk, not zeros, after each length)."""
    ids = np.random.default_rng(seed).integers(0, 23, (len(lengths), total)).astype("int32")
    return {TOKEN_IDS: ids, LENGTHS: np.asarray(lengths, "int32")}


def classifier(**kwargs):
    keras.utils.set_random_seed(1)
    return DocumentClassifier(tiny_config(), 3, **kwargs)


def reference_features(model, ids):
    """Pooled features of one unpadded document, its hidden states from one pass of the
    backbone over the whole document (no memory), pooled by hand."""
    hidden = model.backbone(ids[None], model.backbone.init_memory(1, 0))[0][0].numpy()
    n = len(ids)
    if model.pooling == "last":
        return hidden[n - 1]
    last_start = (-(-n // T) - 1) * T
    if model.pooling == "last_segment_mean":
        return hidden[last_start:n].mean(axis=0)
    summaries = np.stack([hidden[s:s + T].mean(axis=0) for s in range(0, n, T)])
    query = model.segment_attention.query.numpy()
    score = summaries @ query / np.sqrt(query.size)
    weights = np.exp(score - score.max())
    return (weights / weights.sum()) @ summaries


@pytest.mark.parametrize("pooling", POOLINGS)
def test_reading_with_memory_equals_one_pass_over_the_whole_document(pooling):
    # M >= L: every segment's queries see every earlier token, as in one pass. Four segments,
    # two in the stop-gradient loop and two in the gradient window.
    model = classifier(pooling=pooling, grad_segments=2, mem_len=16)
    batch = documents([16, 10, 3], 16)
    features = model.features(batch).numpy()
    for row, n in enumerate(batch[LENGTHS]):
        expected = reference_features(model, batch[TOKEN_IDS][row, :n])
        np.testing.assert_allclose(features[row], expected, atol=1e-5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_padding_and_batch_neighbours_change_no_logit(pooling):
    model = classifier(pooling=pooling, grad_segments=2)
    alone = documents([7], 8)
    padded = documents([7, 20, 2], 20, seed=1)  # more segments, other rows, other junk
    padded[TOKEN_IDS][0, :7] = alone[TOKEN_IDS][0, :7]
    np.testing.assert_allclose(model(padded).numpy()[0], model(alone).numpy()[0], atol=1e-5)
    full = documents([12], 12)
    np.testing.assert_allclose(model(full[TOKEN_IDS]).numpy(), model(full).numpy(), atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "last_segment_mean"])
def test_the_first_segment_reaches_the_logits_through_memory_only(pooling):
    # Three segments, the first read in the stop-gradient loop, the logits pooled from the last:
    # with memory, changing the first segment changes the logits; without memory (M = 0)
    # nothing carries it (so the check can fail). Attention pooling is left out: it reads the
    # first segment's own summary.
    first, other = documents([12], 12), documents([12], 12)
    other[TOKEN_IDS][0, :T] = (first[TOKEN_IDS][0, :T] + 1) % 23
    with_memory = classifier(pooling=pooling, mem_len=8)
    assert np.abs(with_memory(first).numpy() - with_memory(other).numpy()).max() > 1e-3
    without = classifier(pooling=pooling, mem_len=0)
    np.testing.assert_allclose(without(first).numpy(), without(other).numpy(), atol=1e-6)


@pytest.mark.parametrize("pooling,grad_segments", [
    ("last", 1), ("last", 2), ("last_segment_mean", 2), ("segment_attention", 2)])
def test_gradients_reach_the_last_k_segments_and_no_earlier_one(pooling, grad_segments):
    # Segment s holds tokens 1 + 4s .. 4 + 4s only: the embedding rows with a gradient tell
    # which segments the loss reached (through the memory, and for attention pooling through
    # the segment summaries too).
    model = classifier(pooling=pooling, grad_segments=grad_segments, mem_len=8)
    ids = np.arange(1, 17, dtype="int32")[None]
    table = model.backbone.embedding.table_0

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(ids, training=True))
    reached = np.abs(tf.convert_to_tensor(tape.gradient(loss, table)).numpy()).sum(axis=1) > 0
    first_reached = 1 + T * (4 - grad_segments)
    assert reached[first_reached:17].all()
    assert not reached[:first_reached].any()


def test_keras_file_round_trip(tmp_path):
    model = classifier(pooling="segment_attention", grad_segments=2, mem_len=6, segment_len=3,
                       head_dropout=0.1)
    batch = documents([9, 4], 9)
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, DocumentClassifier)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(loaded(batch).numpy(), model(batch).numpy(), atol=1e-6)


def test_from_language_model_takes_the_backbone_and_a_fresh_head(tmp_path):
    lm = tiny_lm()
    lm_path = str(tmp_path / "lm.keras")
    lm.save(lm_path)
    # A tfxl-train model_dir: config.json and a weights checkpoint.
    model_dir = tmp_path / "run"
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "config.json").write_text(lm.config.to_json())
    tf.train.Checkpoint(model=lm).write(str(model_dir / "checkpoints" / "ckpt-7"))
    for source in (lm, lm_path, str(model_dir)):
        model = DocumentClassifier.from_language_model(source, 4, pooling="last_segment_mean")
        assert model.config == lm.config and model.pooling == "last_segment_mean"
        for ours, theirs in zip(model.backbone.weights, lm.backbone.weights, strict=True):
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        assert model.head.kernel.shape == (lm.config.d_model, 4)
        assert np.abs(model.head.kernel.numpy()).max() > 0
        np.testing.assert_array_equal(model.head.bias.numpy(), 0)


def test_compiled_step_equals_eager_and_builds_no_backward_pass_for_the_loop():
    # Under tf.function with [None, None] inputs the segment count is a tensor (the loop's trip
    # count, the summaries' shape); eagerly it is a Python int. The compiled gradient holds the
    # loop's one While op with no accumulators (variant outputs) for a backward pass: the
    # activations kept are the last K segments'.
    model = DocumentClassifier(tiny_config(n_layer=1), 3, pooling="segment_attention")
    spec = {TOKEN_IDS: tf.TensorSpec([None, None], tf.int32),
            LENGTHS: tf.TensorSpec([None], tf.int32)}

    @tf.function(input_signature=[spec])
    def step(inputs):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = tf.reduce_sum(logits)
        return logits, tape.gradient(loss, model.trainable_weights)

    batch = documents([14, 3, 9], 16)
    logits, gradients = step(batch)
    np.testing.assert_allclose(logits.numpy(), model(batch).numpy(), atol=1e-5)
    assert all(g is not None for g in gradients)
    graph = step.get_concrete_function().graph
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 1
    assert not [out for out in loops[0].outputs if out.dtype == tf.variant]


def test_segment_attention_pooling_passes_the_layer_checks_and_ignores_empty_segments():
    summaries = np.random.default_rng(0).normal(size=(2, 3, 16)).astype("float32")
    valid = np.array([[True, True, False], [False, False, False]])
    _, pooled = run_layer_test(SegmentAttentionPooling, dict(init_std=0.5), (summaries, valid),
                               expected_output_shape=(2, 16))
    changed = summaries.copy()
    changed[0, 2] = 100.0  # an empty segment's summary gets no weight
    layer = SegmentAttentionPooling(init_std=0.5)
    layer(summaries, valid)
    np.testing.assert_allclose(layer(changed, valid), layer(summaries, valid), atol=1e-6)
    np.testing.assert_array_equal(pooled[1], 0.0)  # no valid segment: zeros


def test_segment_attention_over_one_segment_is_its_summary_without_a_warning():
    # A truncated reading has one segment: the pooled state is its summary (zeros when empty),
    # and no "softmax over an axis of size 1" warning reaches the user on each trace.
    summaries = np.random.default_rng(0).normal(size=(2, 1, 16)).astype("float32")
    valid = np.array([[True], [False]])
    layer = SegmentAttentionPooling(init_std=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pooled = keras.ops.convert_to_numpy(layer(summaries, valid))
    np.testing.assert_allclose(pooled[0], summaries[0, 0], atol=1e-6)
    np.testing.assert_array_equal(pooled[1], 0.0)


def test_segment_attention_on_one_segment_trains_every_weight_without_a_none_gradient():
    # Documents that fit one segment (or --max_tokens = T): the query has nothing to weigh, so
    # its gradient is zero, not None (tape.gradient's None stopped the trainer; Keras `fit`
    # warned "Gradients do not exist"); every other weight learns.
    model = classifier(pooling="segment_attention")
    inputs = documents([4, 2, 3], T)
    labels = np.array([0, 1, 2])
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    gradients = dict(zip((w.path for w in model.trainable_weights),
                         tape.gradient(loss, model.trainable_weights)))
    assert all(g is not None for g in gradients.values()), [
        path for path, g in gradients.items() if g is None]
    np.testing.assert_array_equal(gradients[model.segment_attention.query.path], 0.0)
    assert all(np.any(tf.convert_to_tensor(g).numpy() != 0) for path, g in gradients.items()
               if "segment_attention" not in path and "r_r_bias" not in path
               and "r_w_bias" not in path)


@pytest.mark.large
def test_keras_fit_on_one_segment_documents_warns_of_no_missing_gradient():
    model = classifier(pooling="segment_attention")
    inputs, labels = documents([4, 2, 3], T), np.array([0, 1, 2])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = model.fit(dataset, epochs=1, verbose=0).history["loss"]  # no shuffle warning
    assert np.isfinite(losses).all()


def test_fit_passes_keras_no_shuffle_for_a_dataset_and_keras_default_for_arrays(monkeypatch):
    """Keras ignores `shuffle` for a tf.data.Dataset and warns when it is True, its default:
    DocumentClassifier.fit leaves a dataset's order to the dataset, arrays to Keras' default,
    and passes an explicit value on."""
    passed = []
    monkeypatch.setattr(keras.Model, "fit",
                        lambda self, x=None, y=None, **kwargs: passed.append(kwargs["shuffle"]))
    model = classifier()
    inputs, labels = documents([4, 2, 3], T), np.array([0, 1, 2])
    model.fit(tf.data.Dataset.from_tensors((inputs, labels)))
    model.fit(inputs, labels)
    model.fit(tf.data.Dataset.from_tensors((inputs, labels)), shuffle=True)
    assert passed == [False, True, True]


def test_the_reading_is_saved(tmp_path):
    model = classifier(reading="truncation", max_tokens=6)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert (loaded.reading, loaded.max_tokens, loaded.tokens_read) == ("truncation", 6, 6)
    assert classifier(reading="truncation").tokens_read == T  # the first segment
    with pytest.raises(ValueError, match="reading must be one of"):
        classifier(reading="bag_of_words")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        classifier(max_tokens=0)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_max_tokens_reads_the_first_tokens_as_a_cut_document_reads(pooling):
    inputs = documents([11, 5, 2], 12)
    cut = {TOKEN_IDS: inputs[TOKEN_IDS][:, :6], LENGTHS: np.minimum(inputs[LENGTHS], 6)}
    model = classifier(pooling=pooling, max_tokens=6)
    whole = classifier(pooling=pooling)
    whole.set_weights(model.get_weights())
    np.testing.assert_allclose(model(inputs), whole(cut), atol=1e-5)
    model.set_reading(whole=True)
    np.testing.assert_allclose(model(inputs), whole(inputs), atol=1e-5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_no_memory_averages_the_probabilities_of_each_segment_read_alone(pooling):
    inputs = documents([11, 4, 1], 12)
    model = classifier(pooling=pooling, reading="no_memory", grad_segments=2)
    alone = classifier(pooling=pooling, mem_len=0)  # one segment on no memory: read alone
    alone.set_weights(model.get_weights())
    want = []
    for ids, n in zip(inputs[TOKEN_IDS], inputs[LENGTHS]):
        starts = range(0, n, T)
        probs = [keras.ops.convert_to_numpy(keras.ops.softmax(alone(
            {TOKEN_IDS: ids[None, s:s + T], LENGTHS: np.array([min(T, n - s)])})))[0]
            for s in starts]
        want.append(np.mean(probs, axis=0))
    got = keras.ops.convert_to_numpy(keras.ops.softmax(model(inputs)))
    np.testing.assert_allclose(got, np.array(want), atol=1e-5)
