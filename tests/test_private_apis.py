"""tfxl's private TensorFlow and keras-hub APIs are all in tfxl/private_apis.py, and each of them
is still where tfxl reads it: a release that moves one fails here, naming it, not deep inside
a checkpoint rewrite or a tokenizer."""

import ast
import importlib
import pathlib
import re

import pytest

from tfxl import private_apis

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRIVATE_MODULE = re.compile(r"(^|\.)(src|python)(\.|$)")  # keras_hub.src.*, tensorflow.python.*
# Underscored but public: namedtuple's methods.
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}


@pytest.mark.parametrize("name", sorted(private_apis.PRIVATE_APIS))
def test_each_private_api_is_where_tfxl_reads_it(name):
    module_name, attribute, reason = private_apis.PRIVATE_APIS[name]
    if module_name.startswith("keras_hub"):
        pytest.importorskip("keras_hub")
    where = f"{module_name}.{attribute}" if attribute else module_name
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        pytest.fail(f"tfxl.private_apis.{name}: {module_name} no longer imports ({err}); "
                    f"it was used because {reason}")
    assert attribute is None or hasattr(module, attribute), (
        f"tfxl.private_apis.{name}: {where} is gone; it was used because {reason}")
    assert getattr(private_apis, name) is (getattr(module, attribute) if attribute else module)


def test_what_tfxl_calls_of_them_is_there():
    """The attributes tfxl calls on the two private modules."""
    for module, names in ((private_apis.checkpoint_management,
                           ("CheckpointState", "update_checkpoint_state_internal")),
                          (private_apis.device_lib, ("list_local_devices",))):
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name} is gone"


def test_keras_names_every_seed_generator_state_variable_alike():
    """tfxl/checkpoints/training.py finds a model's dropout seeds by this public name (no private
    Layer._seed_generators)."""
    import keras
    assert keras.random.SeedGenerator(0).state.name == "seed_generator_state", (
        "keras.random.SeedGenerator's state variable is no longer named 'seed_generator_state': "
        "tfxl/checkpoints/training.py's seed_generator_states would save no dropout seeds")


def test_no_other_module_imports_a_private_api():
    """No `tensorflow.python`, `keras.src` or `keras_hub.src` import, and no underscored
    attribute of another object (`model._flatten_layers()`), outside tfxl/private_apis.py."""
    found = []
    for top in ("tfxl", "train", "tpu"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "tfxl" / "private_apis.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and not node.attr.startswith("__") and node.attr not in PUBLIC_UNDERSCORED
                      and not (isinstance(node.value, ast.Name)
                               and node.value.id in ("self", "cls", "sys", "os"))):
                    names = [f"<object>.{node.attr}"]
                for name in names:
                    top_level = name.split(".")[0]
                    if (top_level in ("tensorflow", "keras", "keras_hub")
                            and PRIVATE_MODULE.search(name)) or name.startswith("<object>."):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, ("private APIs outside tfxl/private_apis.py:\n" + "\n".join(found))
