"""Tiny models for tests: one base configuration, each test overriding what it depends on.

The base is small enough that every test runs in seconds, with an `init_std` large enough that
attention is neither uniform nor one-hot (so a wrong mask or position term shows in the outputs).
"""

from tfxl import TransfoXLConfig, TransfoXLLM

TINY = dict(vocab_size=23, n_layer=2, d_model=16, n_head=2, d_head=6, d_inner=24, dropout=0.0,
            dropatt=0.0, tgt_len=4, mem_len=4, init_std=0.2)


def tiny_config(**overrides):
    """A `TransfoXLConfig` of the tiny base with `overrides` (any config field) applied."""
    return TransfoXLConfig(**{**TINY, **overrides})


def tiny_lm(**overrides):
    """A built `TransfoXLLM` of `tiny_config(**overrides)`."""
    lm = TransfoXLLM(tiny_config(**overrides))
    lm.build((None, lm.config.tgt_len))
    return lm
