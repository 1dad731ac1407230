"""The feed-forward sub-layer and the Transformer-XL block: their Keras contract. Their numerics
are the naive oracle's, checked through the backbone (test_model.py)."""

import numpy as np
import pytest

from layer_test_case import run_layer_test
from test_attention import ATTENTION_OUTPUT_SHAPE, B, D, H, N, T, attention_inputs
from tfxl.layers import PositionwiseFeedForward, TransformerXLBlock

pytestmark = pytest.mark.every_backend


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_feed_forward_keras_contract(pre_lnorm):
    hidden = np.random.randn(B, T, D).astype(np.float32)
    run_layer_test(PositionwiseFeedForward,
                   dict(d_model=D, d_inner=16, dropout=0.1, pre_lnorm=pre_lnorm, init_std=0.3),
                   (hidden,), expected_output_shape=(B, T, D))


@pytest.mark.parametrize("memory_kind", ["layer_input", "key_value"])
def test_block_keras_contract(memory_kind):
    run_layer_test(TransformerXLBlock,
                   dict(d_model=D, n_head=N, d_head=H, d_inner=16, dropout=0.1, dropatt=0.1,
                        pre_lnorm=True, init_std=0.3),
                   attention_inputs(memory_kind), expected_output_shape=ATTENTION_OUTPUT_SHAPE)
