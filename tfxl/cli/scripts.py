"""The console scripts (setup.cfg's entry points): each quiets TensorFlow, then imports its tool.

Nothing here (nor in the tfxl and tfxl.cli packages it imports) loads TensorFlow: the native-log
filter must be in place before TensorFlow prints its start-up lines (tfxl/cli/quiet.py).
"""

import importlib

from tfxl.cli.quiet import quiet_tensorflow

# Tool name -> its module (what `python -m` runs, and what defines its `run`).
TOOLS = {"tfxl-prepare": "tfxl.data.prepare",
         "tfxl-prepare-classification": "tfxl.data.prepare_classification",
         "tfxl-train": "tfxl.train.main",
         "tfxl-classify-train": "tfxl.train.classify_main",
         "tfxl-eval": "tfxl.train.evaluate",
         "tfxl-classify-eval": "tfxl.classification.evaluate_main",
         "tfxl-export": "tfxl.serving.export_main",
         "tfxl-generate": "tfxl.serving.generate_main", "tfxl-convert": "tfxl.convert.main",
         "tfxl-context": "tfxl.analysis.context_main",
         "python -m tfxl.train.demo": "tfxl.train.demo"}


def _entry_point(tool):
    def run():
        quiet_tensorflow()
        importlib.import_module(TOOLS[tool]).run()
    run.__name__ = run.__qualname__ = tool.replace("tfxl-", "").replace("-", "_")
    run.__doc__ = f"`{tool}`: quiets TensorFlow, then runs {TOOLS[tool]}.run."
    return run


prepare = _entry_point("tfxl-prepare")
prepare_classification = _entry_point("tfxl-prepare-classification")
train = _entry_point("tfxl-train")
classify_train = _entry_point("tfxl-classify-train")
evaluate = _entry_point("tfxl-eval")
classify_evaluate = _entry_point("tfxl-classify-eval")
export = _entry_point("tfxl-export")
generate = _entry_point("tfxl-generate")
convert = _entry_point("tfxl-convert")
context = _entry_point("tfxl-context")
