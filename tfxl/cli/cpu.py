"""CPU kernels the tools ask TensorFlow for: oneDNN on, unless the user chose.

TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512; on an AVX2-only CPU
(the AMD EPYC these tools were measured on) it leaves them off, and they are faster there too
(BENCHMARKS.md, "oneDNN on CPU"). So every tool sets TF_ENABLE_ONEDNN_OPTS=1 before
TensorFlow loads, unless TF_ENABLE_ONEDNN_OPTS is already in the environment: exporting 0 turns
it off (oneDNN's kernels round differently: the test suite pins 0 for that reason). On an
AVX-512 host it changes nothing: TensorFlow's own default there is on. Importing tfxl never sets
it; only a tool does, first thing (tfxl/cli/quiet.py's `quiet_tensorflow`). Imports no TensorFlow.
"""

import os

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"


def prefer_onednn(environ=None):
    """Sets TF_ENABLE_ONEDNN_OPTS=1 in `environ` (default os.environ) unless it is set; returns
    the value in force. Only before TensorFlow is imported does it take effect."""
    environ = os.environ if environ is None else environ
    return environ.setdefault(ONEDNN, "1")
