"""keras-hub's TextClassifier for tfxl: from a language model's preset with a new head (the
LM's weights, tokenizer and reading: the logits of `DocumentClassifier.from_language_model`),
fine-tuning reaching the backbone, the preprocessor's framing, and a `save_to_preset` /
`from_preset` round trip giving the same predictions."""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from factories import tiny_lm
from tfxl.classification import DocumentClassifier
from tfxl.classification.readings import LENGTHS, TOKEN_IDS
from tfxl.data.tokenizers import BytesTokenizer
from tfxl.hub import TransfoXLTextClassifier, causal_lm_from_model

TEXTS = ["four segments", "x", "abc"]  # 14, 2 and 4 tokens with <eod>: T = 4
SETTINGS = dict(pooling="segment_attention", grad_segments=2, mem_len=3)


@pytest.fixture(scope="module")
def lm_preset(tmp_path_factory):
    """(a tiny language model over bytes, its keras-hub preset)."""
    lm = tiny_lm(vocab_size=BytesTokenizer().vocab_size)
    preset = tmp_path_factory.mktemp("hub_classifier") / "lm"
    causal_lm_from_model(lm, BytesTokenizer()).save_to_preset(str(preset))
    return lm, str(preset)


@pytest.fixture(scope="module")
def classifier(lm_preset):
    keras.utils.set_random_seed(2)
    # Through keras-hub's base class: it finds TransfoXLTextClassifier from the LM's backbone.
    return keras_hub.models.TextClassifier.from_preset(lm_preset[1], num_classes=3, **SETTINGS)


def framed(texts):
    """<eod> then each text's bytes, right-padded with <pad>: (token_ids, lengths)."""
    tokenizer = BytesTokenizer()
    rows = [[tokenizer.eod_id, *tokenizer.encode(text)] for text in texts]
    width = max(map(len, rows))
    return (np.array([row + [tokenizer.pad_id] * (width - len(row)) for row in rows], np.int32),
            np.array([len(row) for row in rows], np.int32))


def test_from_a_language_model_preset_with_a_new_head(lm_preset, classifier):
    lm, _ = lm_preset
    assert isinstance(classifier, TransfoXLTextClassifier)
    for got, want in zip(classifier.backbone.language_model.get_weights(), lm.get_weights()):
        np.testing.assert_array_equal(got, want)
    x = classifier.preprocessor(TEXTS)
    token_ids, lengths = framed(TEXTS)
    np.testing.assert_array_equal(x["token_ids"], token_ids)
    np.testing.assert_array_equal(np.sum(x["padding_mask"], axis=1), lengths)
    # The same logits as tfxl's own classifier from the same language model and head.
    reference = DocumentClassifier.from_language_model(lm, 3, **SETTINGS)
    for name in ("head", "segment_attention"):
        getattr(reference, name).set_weights(getattr(classifier.classifier, name).get_weights())
    want = reference({TOKEN_IDS: token_ids, LENGTHS: lengths}).numpy()
    np.testing.assert_allclose(classifier.predict(TEXTS, verbose=0), want, atol=1e-5)


def test_fine_tuning_reaches_the_language_models_backbone(classifier):
    x = classifier.preprocessor(TEXTS)
    softmax = classifier.backbone.language_model.softmax
    assert not any(w is v for w in softmax.weights for v in classifier.trainable_weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(
            np.array([0, 1, 2]), classifier(x, training=True), from_logits=True)
    embedding = classifier.backbone.language_model.backbone.embedding.trainable_weights
    gradients = tape.gradient(loss, embedding + classifier.classifier.head.trainable_weights)
    assert all(g is not None and np.any(tf.convert_to_tensor(g).numpy()) for g in gradients)


def test_save_to_preset_and_from_preset_give_the_same_predictions(classifier, tmp_path):
    classifier.save_to_preset(str(tmp_path / "classifier"))
    loaded = TransfoXLTextClassifier.from_preset(str(tmp_path / "classifier"))
    assert (loaded.num_classes, loaded.classifier.pooling, loaded.classifier.grad_segments,
            loaded.classifier.mem_len) == (3, "segment_attention", 2, 3)
    assert type(loaded.preprocessor) is type(classifier.preprocessor)
    np.testing.assert_allclose(loaded(loaded.preprocessor(TEXTS)).numpy(),
                               classifier(classifier.preprocessor(TEXTS)).numpy(), atol=1e-6)


def test_the_preprocessor_keeps_the_first_sequence_length_tokens(classifier):
    preprocessor = type(classifier.preprocessor)(classifier.preprocessor.tokenizer,
                                                 sequence_length=3)
    x, y = preprocessor(TEXTS, [0, 1, 2])
    token_ids, lengths = framed(TEXTS)
    np.testing.assert_array_equal(x["token_ids"], token_ids[:, :3])
    np.testing.assert_array_equal(np.sum(x["padding_mask"], axis=1), np.minimum(lengths, 3))
    np.testing.assert_array_equal(y, [0, 1, 2])
    one = preprocessor("x")  # one text, unbatched
    np.testing.assert_array_equal(one["token_ids"], token_ids[1, :3])
