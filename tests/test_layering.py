"""The rooms of tfxl and what each may import: layers know nothing of data, training or serving;
the data package knows nothing of the model; tpu/ only resolves strategies; train/ composes
model, data and strategy; export, generation, conversion and classification sit beside the model
and import it, never the trainer; the serving tools import the model and classification, never
the reverse.

Read from the source with `ast`, so an import inside a function (imported on first use) counts
as much as one at the top of a module, and nothing is imported to find out."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The repository's folders train/ and tpu/ install as tfxl.train and tfxl.tpu (setup.cfg).
FOLDERS = {"tfxl": ROOT / "tfxl", "tfxl.train": ROOT / "train", "tfxl.tpu": ROOT / "tpu"}
SUBPACKAGES = ("analysis", "backend", "checkpoints", "classification", "cli", "convert", "data",
               "hub", "layers", "models", "saved_model", "serving", "tpu", "train")

# package -> the packages it must never import.
FORBIDDEN = {
    # The model code's backend seam: below everything it serves.
    "tfxl.backend": ("tfxl.layers", "tfxl.models", "tfxl.data", "tfxl.train", "tfxl.serving",
                     "tfxl.classification", "tfxl.hub", "tfxl.checkpoints"),
    "tfxl.layers": ("tfxl.data", "tfxl.train", "tfxl.serving", "tfxl.classification",
                    "tfxl.hub", "tfxl.checkpoints"),
    "tfxl.data": ("tfxl.models", "tfxl.layers", "tfxl.train", "tfxl.serving",
                  "tfxl.classification", "tfxl.hub", "tfxl.checkpoints"),
    # The checkpoints' loading imports the model: the model importing them would be a cycle.
    "tfxl.models": ("tfxl.train", "tfxl.serving", "tfxl.classification", "tfxl.hub",
                    "tfxl.checkpoints"),
    "tfxl.checkpoints": ("tfxl.train", "tfxl.serving", "tfxl.classification", "tfxl.hub"),
    # The export framework sits below the models whose signatures it builds.
    "tfxl.saved_model": ("tfxl.models", "tfxl.layers", "tfxl.data", "tfxl.train", "tfxl.serving",
                         "tfxl.classification", "tfxl.hub"),
    "tfxl.classification": ("tfxl.serving", "tfxl.train", "tfxl.hub"),
    "tfxl.convert": ("tfxl.train", "tfxl.serving"),
    "tfxl.hub": ("tfxl.train", "tfxl.serving"),
    "tfxl.serving": ("tfxl.train",),
    # Beside the model: it reads models and data, never the trainer or the serving tools.
    "tfxl.analysis": ("tfxl.train", "tfxl.serving", "tfxl.classification", "tfxl.hub"),
    "tfxl.tpu": ("tfxl.models", "tfxl.layers", "tfxl.data", "tfxl.train", "tfxl.serving",
                 "tfxl.classification", "tfxl.hub"),
}


def module_name(path):
    for package, folder in FOLDERS.items():
        if folder in path.parents and (package != "tfxl" or ROOT / "tfxl" in path.parents):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(path)


def imported_names(source, module, is_package=False):
    """(line, name) of every tfxl module that `source` (the module `module`) imports, wherever
    the import is: `from tfxl import serving` names tfxl.serving, a relative import is resolved,
    and an attribute `tfxl.serving` of the lazily importing `tfxl` package counts too."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "tfxl" and node.attr in SUBPACKAGES):
            yield node.lineno, f"tfxl.{node.attr}"


def within(name, package):
    return name == package or name.startswith(package + ".")


def violations():
    found = []
    for folder in FOLDERS.values():
        for path in sorted(folder.rglob("*.py")):
            module = module_name(path)
            rules = [(package, banned) for package, banned in FORBIDDEN.items()
                     if within(module, package)]
            for line, name in imported_names(path.read_text(), module,
                                             path.name == "__init__.py"):
                for package, banned in rules:
                    for other in banned:
                        if within(name, other):
                            found.append(f"{path.relative_to(ROOT)}:{line}: {module} imports "
                                         f"{name} ({package} never imports {other})")
    return sorted(set(found))


def test_no_room_imports_what_it_must_not():
    found = violations()
    assert not found, "\n".join(found)


def test_every_subpackage_has_a_rule_or_is_a_composer():
    """A new package gets a line in FORBIDDEN (or joins the composers that may import all)."""
    composers = {"tfxl.train", "tfxl.cli"}
    assert {f"tfxl.{name}" for name in SUBPACKAGES} == set(FORBIDDEN) | composers
    on_disk = {module_name(path.parent) for folder in FOLDERS.values()
               for path in folder.glob("*/__init__.py")} | {"tfxl.train", "tfxl.tpu"}
    # Under their package's rule.
    inner = {"tfxl.data.tokenizers", "tfxl.layers.memory", "tfxl.train.backends",
             "tfxl.train.loop", "tfxl.train.planning", "tfxl.train.records", "tfxl.train.tasks"}
    assert on_disk - inner == {f"tfxl.{name}" for name in SUBPACKAGES}


@pytest.mark.parametrize("source, names", [
    ("def f():\n    from tfxl.serving import export_main\n",
     ["tfxl.serving", "tfxl.serving.export_main"]),
    ("from tfxl import serving\n", ["tfxl", "tfxl.serving"]),
    ("import tfxl\ntfxl.train.main\n", ["tfxl", "tfxl.train"]),
    ("from ..serving import loading\n", ["tfxl.serving", "tfxl.serving.loading"]),
    ("from . import export\n", ["tfxl.models", "tfxl.models.export"]),
])
def test_imports_are_found_wherever_they_are(source, names):
    assert sorted({name for _, name in imported_names(source, "tfxl.models.generation")}) == names
