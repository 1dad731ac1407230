"""Tokenizer round trips: eager, in tf.data/tf.function, reload from spec, SavedModel.

Every tokenizer is built as tfxl-prepare builds it (`learn` from a training text); the
sentencepiece one is a real model trained by the `sentencepiece` package.
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf

from data_helpers import sample_text
from tfxl.data import tokenizers as tk
from tfxl.data.errors import DataError

TEXT = sample_text(40, seed=1) + "last line without newline"

def make(kind):
    options = tk.VocabularyOptions(wordpiece_vocab_size=120, sentencepiece_vocab_size=40)
    return tk.TOKENIZERS[kind].learn(lambda: iter([TEXT]), options)


def expected_text(kind, text):
    """What decode(encode(text)) must give: exact except documented normalisation."""
    if kind in ("words", "wordpiece", "sentencepiece"):
        # Words of each line separated by single spaces; newlines kept.
        return "\n".join(" ".join(line.split()) for line in text.split("\n"))
    return text


KINDS = ["bytes", "chars", "words", "wordpiece", "sentencepiece"]


@pytest.fixture(scope="module")
def tokenizers():
    return {kind: make(kind) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_eager_and_graph(tokenizers, kind):
    tok = tokenizers[kind]
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int32 and ids.size > 0
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == expected_text(kind, TEXT)
    # The graph path is the same function as the eager one.
    ragged = tok.tf_encode(tf.constant([TEXT, "", "cat\n"]))
    assert ragged.dtype == tf.int32
    np.testing.assert_array_equal(ragged[0].numpy(), ids)
    assert ragged[1].shape[0] == 0
    dense = ragged.to_tensor(default_value=tok.pad_id)
    decoded = tok.tf_decode(dense).numpy()
    assert decoded[0].decode() == expected_text(kind, TEXT)
    assert decoded[2].decode() == "cat\n"
    # Inside tf.data and tf.function.
    ds = tf.data.Dataset.from_tensor_slices([TEXT]).batch(1).map(tok.tf_encode)
    np.testing.assert_array_equal(next(iter(ds))[0].numpy(), ids)
    decode_fn = tf.function(tok.tf_decode)
    assert decode_fn(tf.constant(ids[None])).numpy()[0].decode() == expected_text(kind, TEXT)


def test_words_vocab_is_frequency_ordered_with_min_freq_and_max_size():
    counts = collections.Counter({b"common": 9, b"mid": 5, b"rare": 1, b"b": 5})
    tok = tk.WordsTokenizer.build(counts, min_freq=2)
    assert tok.vocab == ["<pad>", "<eod>", "<unk>", "<eos>", "common", "b", "mid"]
    small = tk.WordsTokenizer.build(counts, max_size=5)
    assert small.vocab[4:] == ["common"] and small.vocab_size == 5
    np.testing.assert_array_equal(tok.encode("common rare\nmid"), [4, tok.unk_id, tok.eos_id, 6])
    assert tok.decode(tok.encode("common rare\nmid")) == "common <unk>\nmid"


def test_character_level_flags(tokenizers):
    assert {k: t.is_character_level for k, t in tokenizers.items()} == {
        "bytes": True, "chars": True, "words": False, "wordpiece": False,
        "sentencepiece": False}


def test_bytes_layout_binary_and_invalid_utf8():
    tok = tk.BytesTokenizer()
    assert (tok.vocab_size, tok.pad_id, tok.eod_id) == (258, 256, 257)
    binary = bytes(range(256))
    np.testing.assert_array_equal(tok.encode(binary), np.arange(256))
    np.testing.assert_array_equal(tok.tf_encode(tf.constant([binary]))[0].numpy(), np.arange(256))
    # Specials vanish; invalid UTF-8 becomes U+FFFD in both paths.
    ids = [104, 0xFF, 105, 256, 257]
    assert tok.decode(ids) == "h\ufffdi"
    assert tok.tf_decode(tf.constant([ids])).numpy()[0].decode() == "h\ufffdi"


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_vocabulary_id_is_an_error(tokenizers, kind):
    tok = tokenizers[kind]
    with pytest.raises(DataError, match=f"token id {tok.vocab_size} outside the vocabulary"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside the vocabulary"):
        tok.tf_decode(tf.constant([[1, tok.vocab_size]]))


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_reload_from_spec(tokenizers, kind, tmp_path):
    tok = tokenizers[kind]
    spec = tok.save(str(tmp_path))
    assert spec == tok.spec() and spec["type"] == kind
    reloaded = tk.tokenizer_from_spec(spec, str(tmp_path))
    assert reloaded.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(reloaded.encode(TEXT), tok.encode(TEXT))
    if kind != "bytes":
        # A vocabulary file that does not match the manifest hash is refused.
        name = spec.get("vocab_file") or spec.get("model_file")
        with open(tmp_path / name, "ab") as f:
            f.write(b"x\n")
        with pytest.raises(DataError, match=name):
            tk.tokenizer_from_spec(spec, str(tmp_path))


def test_vocab_files_are_plain_text(tokenizers, tmp_path):
    tokenizers["chars"].save(str(tmp_path))
    lines = (tmp_path / "vocab.chars.txt").read_text("utf-8").splitlines()
    assert lines[:3] == ['"<pad>"', '"<eod>"', '"<unk>"'] and '"\\n"' in lines
    tokenizers["words"].save(str(tmp_path))
    words = (tmp_path / "vocab.words.txt").read_text("utf-8").splitlines()
    assert words[:4] == ["<pad>", "<eod>", "<unk>", "<eos>"] and words[4] == "the"


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_inside_saved_model(tokenizers, kind, tmp_path):
    tok = tokenizers[kind]
    module = tf.Module()
    module.tokenizer = tok
    module.encode = tf.function(lambda s: tok.tf_encode(s).to_tensor(tok.pad_id),
                                input_signature=[tf.TensorSpec([None], tf.string)])
    module.decode = tf.function(tok.tf_decode,
                                input_signature=[tf.TensorSpec([None, None], tf.int32)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    ids = loaded.encode(tf.constant([TEXT])).numpy()[0]
    np.testing.assert_array_equal(ids[:len(tok.encode(TEXT))], tok.encode(TEXT))
    assert loaded.decode(tf.constant(ids[None])).numpy()[0].decode() == expected_text(kind, TEXT)


def test_unknown_spec_and_bad_sentencepiece_model(tmp_path):
    with pytest.raises(DataError, match="unknown tokenizer type 'nope'"):
        tk.tokenizer_from_spec({"type": "nope"}, str(tmp_path))
    with pytest.raises(DataError, match="not a valid sentencepiece model"):
        tk.SentencePieceTokenizer(b"definitely not a protobuf")


def test_learned_sentencepiece_model_is_a_real_unigram_model():
    import sentencepiece

    tok = make("sentencepiece")
    processor = sentencepiece.SentencePieceProcessor(model_proto=tok.model)
    assert processor.get_piece_size() == 40 == tok.vocab_size - 3
    line = TEXT.splitlines()[3]
    # tensorflow-text and the trainer's own processor agree on every line's pieces.
    np.testing.assert_array_equal(tok.encode(line), processor.encode(line))


def test_sentencepiece_learning_errors_are_one_clear_line(monkeypatch):
    with pytest.raises(DataError, match=r"--sentencepiece_vocab_size=5000: cannot learn a "
                                        r"sentencepiece model: Vocabulary size too high"):
        tk.learn_sentencepiece_model(TEXT.splitlines(), 5000)
    with pytest.raises(DataError, match="no text"):
        tk.learn_sentencepiece_model(["", "  "], 60)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # the package is not installed
    with pytest.raises(DataError) as missing:
        tk.learn_sentencepiece_model(TEXT.splitlines(), 60)
    assert str(missing.value) == ("--sentencepiece_vocab_size needs the sentencepiece package: "
                                  "pip install '.[sentencepiece]' in a clone of tfxl")


def test_registry_names_every_tokenizer_by_its_kind():
    assert list(tk.TOKENIZERS) == KINDS
    assert all(cls.kind == kind for kind, cls in tk.TOKENIZERS.items())
    assert [k for k, cls in tk.TOKENIZERS.items() if not cls.reads_text] == ["bytes"]
    assert [k for k, cls in tk.TOKENIZERS.items() if cls.frequency_ordered] == ["words"]
