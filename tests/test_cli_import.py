"""Importing tfxl has no side effects: no TensorFlow, no stderr filter, no child process; a tfxl
model name loads and registers the models on first use."""

import json
import subprocess
import sys

import pytest

# Run as a program named like a tool (`tfxl-train`): that name once made `import tfxl` fork the
# stderr filter.
PROBE = r"""
import json, os, sys, threading
stderr_before = os.fstat(2)
import tfxl, tfxl.data, tfxl.cli, tfxl.cli.scripts, tfxl.config
stderr_after = os.fstat(2)
children = [c for task in os.listdir("/proc/self/task")
            for c in open(f"/proc/self/task/{task}/children").read().split()]
seen = {"tensorflow": "tensorflow" in sys.modules, "keras": "keras" in sys.modules,
        "same_stderr": (stderr_before.st_dev, stderr_before.st_ino)
                       == (stderr_after.st_dev, stderr_after.st_ino),
        "children": children, "threads": threading.active_count(),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL")}
import keras
model_class = tfxl.TransfoXLLM  # the first use of a model name imports and registers the models
seen["registered"] = keras.saving.get_registered_object("tfxl>TransfoXLLM") is model_class
print(json.dumps(seen))
"""


@pytest.mark.large
@pytest.mark.subprocess
def test_import_tfxl_loads_no_tensorflow_and_starts_nothing(tmp_path):
    program = tmp_path / "tfxl-train"
    program.write_text(PROBE)
    env = {"PATH": "/usr/bin:/bin"}  # no TF_CPP_MIN_LOG_LEVEL: whatever tfxl sets shows
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"tensorflow": False, "keras": False, "same_stderr": True, "children": [],
                    "threads": 1, "TF_CPP_MIN_LOG_LEVEL": None, "registered": True}, seen
