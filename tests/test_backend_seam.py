"""One seam per Keras backend: which backend runs is asked in train/backends/ (the training run's
seam) and tfxl/backend/ (the model code's: one module per backend, `current()` picks), nowhere
else in tfxl/, train/ or tpu/; a strategy is told a JAX distribution by type only there and
where the class is defined (tpu/jax_mesh.py).

Read from the source with `ast` (nothing is imported): a call of `keras.backend.backend()` or
`keras.config.backend()`, and an `isinstance(..., JaxDistribution)`, wherever they are."""

import ast
import pathlib

import pytest

from tfxl.train import backends

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("tfxl", "train", "tpu")
# Asking which backend runs by name: model code asks `tfxl.backend.current()` for the answer
# itself (a kernel, a check, a flag), never the name.
MODEL_QUESTIONS = ("is_tensorflow", "is_torch", "backend_name")
ALLOWED = {"backend": ("train/backends/", "tfxl/backend/"),
           "isinstance": ("train/backends/", "tpu/jax_mesh.py"),
           "model question": ("train/backends/", "tfxl/backend/")}


def dotted(node):
    """"keras.backend.backend" for that expression, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def names_of(node):
    """The names an isinstance's class argument names (a tuple's each)."""
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return [(dotted(item) or "").rpartition(".")[2] for item in items]


def backend_questions(source):
    """(line, "backend" or "isinstance") of each place `source` asks which backend runs or
    whether a strategy is a JaxDistribution."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = dotted(node.func) or ""
        if called in ("keras.backend.backend", "keras.config.backend", "backend.backend",
                      "config.backend"):
            yield node.lineno, "backend"
        elif (called == "isinstance" and len(node.args) == 2
              and "JaxDistribution" in names_of(node.args[1])):
            yield node.lineno, "isinstance"
        elif called.rpartition(".")[2] in MODEL_QUESTIONS:
            yield node.lineno, "model question"


def outside_the_seam():
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for line, kind in backend_questions(path.read_text()):
                if not relative.startswith(ALLOWED[kind]):
                    found.append(f"{relative}:{line}: {kind}")
    return found


def test_the_backend_is_asked_only_at_the_seams():
    assert outside_the_seam() == []


@pytest.mark.parametrize("source, expected", [
    ("import keras\nif keras.backend.backend() == 'jax':\n    pass\n", [(2, "backend")]),
    ("import keras\nx = keras.config.backend()\n", [(2, "backend")]),
    ("from keras import backend\nx = backend.backend()\n", [(2, "backend")]),
    ("isinstance(s, JaxDistribution)\nisinstance(s, (int, jax_mesh.JaxDistribution))\n",
     [(1, "isinstance"), (2, "isinstance")]),
    ("from tfxl.backend import is_tensorflow\nisinstance(s, int)\nis_tensorflow()\n",
     [(3, "model question")]),
])
def test_the_scan_finds_each_way_of_asking(source, expected):
    assert list(backend_questions(source)) == expected


def test_the_seam_answers_the_runs_questions_for_its_strategy():
    import tensorflow as tf
    from tfxl.train.backends.tensorflow import TensorFlowBackend
    backend = backends.for_strategy(tf.distribute.get_strategy())
    assert isinstance(backend, TensorFlowBackend)
    assert (backend.is_chief, backend.worker_index, backend.strategy_kind, backend.replicas,
            backend.model_axis, backend.device_kind) == (True, 0, "default", 1, 1, "CPU")
    assert backend.worker_tasks() == (["worker 0"], 0) and backend.stop_agreement() is None


def module_names(path):
    """(`__all__`, the names the module defines or imports at its top), read with `ast`."""
    tree = ast.parse(path.read_text())
    exported, defined = [], set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
                    if target.id == "__all__":
                        exported = ast.literal_eval(node.value)
        elif isinstance(node, ast.ImportFrom):
            defined.update(alias.asname or alias.name for alias in node.names)
    return exported, defined


def test_every_model_backend_module_answers_every_question():
    from tfxl.backend import MODULES
    answers = {name: module_names(ROOT / (module.replace(".", "/") + ".py"))
               for name, module in MODULES.items()}
    questions = set(answers["tensorflow"][0])
    assert {"is_concrete", "VARIABLES_ARE_TRACKABLE", "compiled_generate"} <= questions
    for name, (exported, defined) in answers.items():
        assert set(exported) == questions, name
        assert questions <= defined, (name, questions - defined)


def test_no_name_of_the_seam_is_also_a_backend_module():
    """Importing `tfxl.backend.tensorflow` sets the package's attribute `tensorflow`: a function
    of that name would be replaced by the module once `current()` has run."""
    import tfxl.backend
    from tfxl.backend import MODULES
    tfxl.backend.current()
    assert callable(tfxl.backend.require_tensorflow)
    _, defined = module_names(ROOT / "tfxl/backend/__init__.py")
    assert not defined & set(MODULES), defined & set(MODULES)
