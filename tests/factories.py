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


def adaptive_config(**overrides):
    """`tiny_config` with the optional parts on: adaptive input and softmax with projected tail
    clusters (div_val 2), one r bias pair per layer, a memory shorter than the segment."""
    return tiny_config(**{**dict(vocab_size=40, d_head=8, d_inner=32, d_embed=16,
                                 cutoffs=(10, 25), div_val=2, untie_r=True, tgt_len=6, mem_len=5,
                                 init_std=0.1), **overrides})


def random_bytes_data(root, tgt_len, num_streams, train_bytes=20000):
    """A tfxl-prepare data dir under `root` of random bytes from "abcdefgh" (train, valid, test):
    the trainer tests' data, where only its shape matters. Returns its path."""
    import numpy as np
    from tfxl.data.prepare import PrepareConfig, prepare
    rng = np.random.default_rng(0)
    for split, size in (("train", train_bytes), ("valid", 2000), ("test", 2000)):
        (root / f"{split}.txt").write_bytes(rng.choice(np.frombuffer(b"abcdefgh", np.uint8),
                                                       size).tobytes())
    out = root / "data"
    prepare(PrepareConfig(output_dir=str(out), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=tgt_len, num_streams=num_streams),
            log=lambda *a: None)
    return str(out)


# A tfxl-train that, inside the save of one checkpoint, marks a file and waits to be killed:
# `python -c HANG_IN_SAVE module function checkpoint marker <tfxl-train flags>` (kill -9 tests).
HANG_IN_SAVE = """
import importlib, sys, time
module_name, function_name, checkpoint, marker = sys.argv[1:5]
module = importlib.import_module(module_name)
original = getattr(module, function_name)

def hang(*args, **kwargs):  # inside the save of `checkpoint`: say so, then wait for the kill
    if checkpoint in repr(args) + repr(kwargs):
        open(marker, "w").close()
        time.sleep(600)
    return original(*args, **kwargs)

setattr(module, function_name, hang)
sys.argv = ["tfxl-train"] + sys.argv[5:]
from tfxl.train.main import run
run()
"""


def console_script(name):
    """The path of an installed console script (tfxl-train, ...) of this environment."""
    import os
    import sys
    return os.path.join(os.path.dirname(sys.executable), name)
