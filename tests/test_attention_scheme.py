"""The attention is an extension point: a new position scheme is one subclass, used by the whole
model through `attention_cls`, on every memory type (equal to the numpy oracle of the scheme),
and saved in `.keras` files, on every backend."""

import keras
import numpy as np
import pytest

from backends import to_numpy
from factories import tiny_config
from naive_reference import NaiveTransfoXL
from tfxl import TransfoXLLM
from tfxl.layers import RelativeMultiHeadAttention, TransformerXLBlock
from tfxl.layers.memory import PositionCache, RecentWindowMemory

pytestmark = pytest.mark.every_backend


@keras.saving.register_keras_serializable(package="tfxl_tests")
class ContentOnlyAttention(RelativeMultiHeadAttention):
    """No position term at all: scores are (q + u) . k only (a deliberately simple scheme)."""

    def project_positions(self, position_encoding):
        return position_encoding[None, :1, :1]  # nothing to precompute; a placeholder tensor

    def position_score(self, query, position_keys):
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


B, M, TOKENS = 2, 5, 12
MEMORIES = {  # memory type -> (T, the first memory, the oracle's M)
    "layer inputs": (4, lambda lm: lm.init_memory(B, mem_len=M), M),
    "key/value": (4, lambda lm: lm.init_key_value_memory(B, mem_len=M), M),
    "ring": (3, lambda lm: lm.init_key_value_ring(B, 3, M), M),  # S 9: one spare slot
    "window": (1, lambda lm: RecentWindowMemory.from_memory(
        lm.init_key_value_memory(B, mem_len=M), 3), M),  # merged every 3 tokens
    # Slots by absolute position: the token at t sees all t before it.
    "positions": (1, lambda lm: PositionCache.empty(
        B, lm.config.n_layer, TOKENS, lm.config.n_head, lm.config.d_head), TOKENS - 1),
}


@pytest.mark.parametrize("kind", MEMORIES)
def test_a_position_scheme_runs_on_every_memory_type_as_its_oracle(kind):
    """Content-only attention is the paper's with W_k,R = 0: the numpy oracle with a zero position
    kernel, segment after segment."""
    segment_len, first_memory, oracle_mem_len = MEMORIES[kind]
    lm = TransfoXLLM(config(), attention_cls=ContentOnlyAttention)
    lm.build((None, segment_len))
    naive = NaiveTransfoXL(lm.backbone)
    naive.blocks = [(dict(w, wr=np.zeros_like(w["wr"])), ff) for w, ff in naive.blocks]
    ids = np.random.default_rng(1).integers(0, 30, (B, TOKENS))
    memory = first_memory(lm)
    memory_type = type(memory)
    for start in range(0, TOKENS, segment_len):
        if isinstance(memory, RecentWindowMemory):
            memory = memory.merged_if_full()
        x = ids[:, start:start + segment_len]
        hidden, memory = lm.backbone(x, memory)
        assert type(memory) is memory_type
        np.testing.assert_allclose(to_numpy(hidden), naive.step(x, oracle_mem_len), atol=2e-5,
                                   err_msg=f"{kind}, tokens {start}..")


def test_block_config_names_its_attention_class():
    block = TransformerXLBlock(8, 2, 4, 16, attention_cls=ContentOnlyAttention)
    assert block.get_config()["attention_cls"] == "tfxl_tests>ContentOnlyAttention"
    clone = TransformerXLBlock.from_config(block.get_config())
    assert clone.attention_cls is ContentOnlyAttention
