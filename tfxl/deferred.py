"""`deferred_import("tensorflow")`: a stand-in for a heavy library that imports it when one of
its names is first used, so that a module can say `tf = deferred_import("tensorflow")` at its
top and still be imported without it.

Why: the tools' --help defines the tools' flags, which live in modules (the trainer's lease, run
record, train log, warm start, the data options) whose other functions use TensorFlow and Keras;
loading those takes seconds that --help should not wait for (tests/test_cli_help.py). The library
is imported by the first attribute read (`tf.io`, `tf.errors` in an `except` clause when an error
is being handled). Only for third-party libraries: a tfxl module is imported plainly, so the
layering test sees it.
"""

import importlib
import types


class DeferredModule(types.ModuleType):
    """The module `name`, imported at the first read of one of its attributes.

    Every read goes to the module itself (not to a copy of its names): TensorFlow's top level
    is a wrapper whose names are resolved on access, and a name patched there (a test's
    `monkeypatch.setattr(tf.io.gfile, ...)`) must be the one read here.
    """

    def __getattr__(self, attribute):
        if attribute.startswith("__"):  # copy, pickle and introspection probe these
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)


def deferred_import(name):
    """A stand-in for the module `name` (e.g. "tensorflow"), imported on its first use."""
    return DeferredModule(name)
