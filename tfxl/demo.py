"""`make demo`: score a text from the Python standard library with the `tiny` model, segment by
segment with memory, and show that the result equals one causal pass over the whole text.

(Untrained weights: the demo checks the recurrence machinery and its speed, not the loss value.)
"""

import pathlib
import sysconfig
import time

import numpy as np
import tensorflow as tf

from tfxl import TransfoXLLM, get_preset


def main():
    source = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    data = np.frombuffer(source.read_bytes(), np.uint8).astype(np.int32)
    config = get_preset("tiny", vocab_size=256, dropout=0.0)
    tgt_len, n_segments = config.tgt_len, 16
    total = tgt_len * n_segments
    inputs, targets = data[None, :total], data[None, 1:total + 1]
    model = TransfoXLLM(config)

    @tf.function(jit_compile=True)
    def step(ids, tgts, memory):
        return model(ids, memory, targets=tgts)

    # Memory as long as the whole text: segment-by-segment scoring must equal one full pass.
    memory = model.init_memory(1, mem_len=total)
    step(inputs[:, :tgt_len], targets[:, :tgt_len], memory)  # compile once
    start = time.perf_counter()
    pieces = []
    for s in range(n_segments):
        cut = slice(s * tgt_len, (s + 1) * tgt_len)
        nll, memory = step(inputs[:, cut], targets[:, cut], memory)
        pieces.append(nll.numpy())
    seconds = time.perf_counter() - start
    segmented = np.concatenate(pieces, axis=1)
    full, _ = model(inputs, model.init_memory(1, mem_len=0), targets=targets)
    gap = float(np.abs(segmented - full.numpy()).max())
    print(f"scored {total} bytes of {source.name} in {n_segments} segments of {tgt_len} "
          f"with memory: {total / seconds:,.0f} tokens/s")
    print(f"mean NLL segmented {segmented.mean():.6f} nats vs one pass {full.numpy().mean():.6f}; "
          f"max |difference| {gap:.2e}")
    if gap > 1e-4:
        raise SystemExit("segment-by-segment scoring disagrees with the one-pass computation")


if __name__ == "__main__":
    main()
