"""tfxl's private TensorFlow and keras-hub APIs are all in tfxl/private_apis.py, and each of them
is still where tfxl reads it: a release that moves one fails here, naming it, not deep inside
a checkpoint rewrite or a tokenizer. The private names tfxl's classes override (a method or
attribute of a Keras base class defined again) are listed there too, and each is still a name of
the class it overrides."""

import ast
import functools
import importlib
import inspect
import pathlib
import re
import textwrap

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


@pytest.mark.parametrize("name", sorted(private_apis.PRIVATE_OVERRIDES))
def test_each_listed_override_is_still_a_method_of_its_class(name):
    module_name, class_name, reason = private_apis.PRIVATE_OVERRIDES[name]
    cls = getattr(importlib.import_module(module_name), class_name, None)
    assert cls is not None and hasattr(cls, name), (
        f"tfxl.private_apis.PRIVATE_OVERRIDES[{name!r}]: {module_name}.{class_name}.{name} is "
        f"gone, so tfxl's override no longer replaces anything; it was overridden because "
        f"{reason}")


THIRD_PARTY = ("keras", "tensorflow", "keras_hub")


def module_of(path):
    """The module a source file is imported as (train/ installs as tfxl.train, tpu/ as
    tfxl.tpu)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(["tfxl"] + parts if parts[0] in ("train", "tpu") else parts)


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def tfxl_classes():
    """{(module, class name): (file, line, full names of its bases, {private name: line})}: every
    class of tfxl, train and tpu with the underscored (not dunder) names it defines: methods,
    class attributes, `self._x = ...` in its methods and `Class._x = ...` in its module."""
    classes = {}
    for top in ("tfxl", "train", "tpu"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree, module = ast.parse(path.read_text()), module_of(path)
            imported = {}
            for node in tree.body:
                if isinstance(node, ast.Import):
                    imported.update({alias.asname or alias.name.split(".")[0]:
                                     alias.name if alias.asname else alias.name.split(".")[0]
                                     for alias in node.names})
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.update({alias.asname or alias.name: f"{node.module}.{alias.name}"
                                     for alias in node.names})
            here = {}
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = []
                for base in filter(None, map(dotted, node.bases)):
                    head, _, rest = base.partition(".")
                    bases.append(imported.get(head, f"{module}.{head}") + (f".{rest}" * bool(rest)))
                names = {}
                for item in node.body:
                    targets = ([item.name] if isinstance(item, (ast.FunctionDef,
                                                                 ast.AsyncFunctionDef))
                               else [t.id for t in getattr(item, "targets", [getattr(
                                   item, "target", None)]) if isinstance(t, ast.Name)])
                    names.update({target: item.lineno for target in targets})
                for sub in ast.walk(node):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        names.setdefault(sub.attr, sub.lineno)
                here[node.name] = classes[(module, node.name)] = (path, node.lineno, bases, names)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                        and isinstance(node.value, ast.Name) and node.value.id in here):
                    here[node.value.id][3].setdefault(node.attr, node.lineno)
    return {key: (path, line, bases, {name: at for name, at in names.items()
                                       if name.startswith("_") and not name.startswith("__")})
            for key, (path, line, bases, names) in classes.items()}


def third_party_class(name):
    """The TensorFlow, Keras or keras-hub class of a full dotted name, or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            value = getattr(value, part, None)
        return value if inspect.isclass(value) else None
    return None


@functools.lru_cache(maxsize=None)
def third_party_names(cls):
    """The names a third-party class and its third-party bases define: their attributes and
    what their methods assign to `self`."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] not in THIRD_PARTY:
            continue
        names |= set(vars(klass))
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        names |= {node.attr for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"}
    return frozenset(names)


def test_every_override_of_a_private_name_is_listed():
    """A tfxl class (or a mixin of one) that defines an underscored name its TensorFlow, Keras
    or keras-hub base already has (`_all_reduce_sum_gradients`) depends on that private name as
    much as a read of it does: each is listed in tfxl.private_apis.PRIVATE_OVERRIDES."""
    classes = tfxl_classes()
    by_name = {}
    for (module, name), found in classes.items():
        by_name.setdefault(name, []).append(found)

    def ancestry(found, seen=()):
        """(the tfxl classes of `found`'s ancestry, itself included; its third-party bases)."""
        ours, theirs = [found], []
        for base in found[2]:
            if base.split(".")[0] in THIRD_PARTY:
                theirs += [c for c in [third_party_class(base)] if c is not None]
                continue
            module, _, name = base.rpartition(".")
            parent = classes.get((module, name)) or (
                by_name[name][0] if base.startswith("tfxl") and len(by_name.get(name, ())) == 1
                else None)
            if parent is not None and parent not in seen:
                more_ours, more_theirs = ancestry(parent, seen + (found,))
                ours, theirs = ours + more_ours, theirs + more_theirs
        return ours, theirs

    unlisted = set()
    for found in classes.values():
        ours, theirs = ancestry(found)
        names = frozenset().union(*map(third_party_names, theirs))
        for path, _, _, defined in ours:
            unlisted |= {f"{path.relative_to(ROOT)}:{line}: {name}"
                         for name, line in defined.items()
                         if name in names and name not in private_apis.PRIVATE_OVERRIDES}
    assert not unlisted, ("private TensorFlow/Keras/keras-hub names overridden but not listed in "
                          "tfxl.private_apis.PRIVATE_OVERRIDES:\n" + "\n".join(sorted(unlisted)))
