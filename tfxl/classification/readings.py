"""The names of a document classifier's options and inputs: how it reads a document, what it
pools, and the keys of its input.

No Keras here: the command-line tools take their flags' choices from this module, and their
--help should not wait for Keras or TensorFlow to load (tests/test_cli_help.py). `classifier`,
`pooling` and `signatures` re-use these names.
"""

# The input's keys (the same names as `tfxl.data.classification`'s reader yields; the data
# package knows nothing of the model, so a test keeps the two equal).
TOKEN_IDS = "token_ids"
LENGTHS = "lengths"

# How a classifier reads a document (`reading=`; the names of tfxl-classify-train's and
# tfxl-classify-eval's --reading, the README and BENCHMARKS.md):
MEMORY = "memory"          # segment by segment on the memory (the first max_tokens, or whole)
NO_MEMORY = "no_memory"    # each segment alone, the segments' probabilities averaged
TRUNCATION = "truncation"  # the first max_tokens tokens only (default one segment, T)
READINGS = (MEMORY, NO_MEMORY, TRUNCATION)
# The most tokens of one document a reading may name (--max_tokens): positions and lengths are
# int32 in the graph, and this, rounded up to any segment length up to it, stays below 2**31.
MAX_DOCUMENT_TOKENS = 2**30

# What a classifier pools from what the backbone has read (`pooling=`, --pooling).
LAST = "last"
LAST_SEGMENT_MEAN = "last_segment_mean"
SEGMENT_ATTENTION = "segment_attention"
POOLINGS = (LAST, LAST_SEGMENT_MEAN, SEGMENT_ATTENTION)
