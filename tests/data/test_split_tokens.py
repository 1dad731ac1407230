"""A split's tokens as one array (tfxl.data.split_tokens)."""

import numpy as np
import pytest

from factories import random_bytes_data
from tfxl.data.errors import DataError
from tfxl.data.split_tokens import split_tokens
from tfxl.data.tokenizers import load_tokenizer


def test_the_streams_read_in_order_are_the_split(tmp_path):
    data_dir = random_bytes_data(tmp_path, tgt_len=8, num_streams=3)
    tokens = split_tokens(data_dir, "valid")
    assert tokens.dtype == np.int32
    text = load_tokenizer(data_dir).decode(tokens)
    assert text == (tmp_path / "valid.txt").read_text()


def test_a_missing_or_too_large_split_is_refused_before_reading(tmp_path):
    data_dir = random_bytes_data(tmp_path, tgt_len=8, num_streams=3)
    with pytest.raises(DataError, match="split 'dev' is not in the manifest"):
        split_tokens(data_dir, "dev")
    with pytest.raises(DataError, match="split 'valid' holds 2000 tokens, more than the 1999"):
        split_tokens(data_dir, "valid", max_tokens=1999)
