"""The attention is an extension point: a new position scheme is one subclass, used by the whole
model through `attention_cls`, on both memories, and saved in `.keras` files,
on every backend."""

import keras
import numpy as np
import pytest

from backends import to_numpy
from factories import tiny_config
from tfxl import TransfoXLLM
from tfxl.layers import RelativeMultiHeadAttention, TransformerXLBlock

pytestmark = pytest.mark.every_backend


@keras.saving.register_keras_serializable(package="tfxl_tests")
class ContentOnlyAttention(RelativeMultiHeadAttention):
    """No position term at all: scores are (q + u) . k only (a deliberately simple scheme)."""

    def project_positions(self, position_encoding):
        return position_encoding[None, :1, :1]  # nothing to precompute; a placeholder tensor

    def position_score(self, query, position_keys, key_distance=None):
        return query[..., :1] * 0.0  # broadcasts over the keys


def config():
    return tiny_config(vocab_size=30, d_head=8, d_inner=32, init_std=0.3)


def test_a_position_scheme_is_one_class_for_the_whole_model(tmp_path):
    ids = np.random.default_rng(0).integers(0, 30, (2, 4))
    plain = TransfoXLLM(config())
    custom = TransfoXLLM(config(), attention_cls=ContentOnlyAttention)
    plain.build((None, 4))
    custom.build((None, 4))
    custom.set_weights(plain.get_weights())
    assert all(isinstance(b.attention, ContentOnlyAttention) for b in custom.backbone.blocks)
    got, memory = custom(ids)
    assert np.abs(to_numpy(got) - to_numpy(plain(ids)[0])).max() > 1e-3  # the scheme is in use
    # Both memories go through the custom class and agree.
    key_value = custom.key_value_memory(memory)
    np.testing.assert_allclose(to_numpy(custom(ids, key_value)[0]),
                               to_numpy(custom(ids, memory)[0]), atol=1e-5)
    custom.save(tmp_path / "custom.keras")
    loaded = keras.saving.load_model(tmp_path / "custom.keras")
    assert isinstance(loaded.backbone.blocks[0].attention, ContentOnlyAttention)
    np.testing.assert_allclose(to_numpy(loaded(ids)[0]), to_numpy(got), atol=1e-6)


def test_block_config_names_its_attention_class():
    block = TransformerXLBlock(8, 2, 4, 16, attention_cls=ContentOnlyAttention)
    assert block.get_config()["attention_cls"] == "tfxl_tests>ContentOnlyAttention"
    clone = TransformerXLBlock.from_config(block.get_config())
    assert clone.attention_cls is ContentOnlyAttention
