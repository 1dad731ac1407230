"""The tools ask for oneDNN's kernels (faster on the AVX2-only host they were measured on) unless
the environment says otherwise; importing tfxl never does."""

import json
import os
import subprocess
import sys

import pytest

from tfxl.cli.cpu import ONEDNN, prefer_onednn

# A process started as a tool starts: import tfxl, then the tools' first call.
PROBE = r"""
import json, os, sys
import tfxl, tfxl.cli.scripts
after_import = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
from tfxl.cli.quiet import quiet_tensorflow
quiet_tensorflow(["tfxl-train", *sys.argv[1:]])
print(json.dumps({"after_import": after_import,
                  "in_force": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                  "tensorflow": "tensorflow" in sys.modules}))
"""


def test_prefer_onednn_sets_1_only_where_nothing_is_set():
    assert prefer_onednn(environ := {}) == "1" and environ == {ONEDNN: "1"}
    for chosen in ("0", "1"):
        assert prefer_onednn(environ := {ONEDNN: chosen}) == chosen
        assert environ == {ONEDNN: chosen}


@pytest.mark.subprocess
@pytest.mark.parametrize("exported, argv, expected", [
    (None, [], "1"), (None, ["--verbosity=1"], "1"), ("0", [], "0")])
def test_a_tool_process_prefers_onednn_unless_exported(exported, argv, expected):
    env = {k: v for k, v in os.environ.items() if k != ONEDNN}
    if exported is not None:
        env[ONEDNN] = exported
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"after_import": exported, "in_force": expected, "tensorflow": False}
