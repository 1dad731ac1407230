"""Every `Examples:` section of tfxl's public classes and functions runs as written.

keras-hub's manner: a public class's docstring carries a runnable example in a ```python fence
under `Examples:`. This walks every tfxl module (tfxl.train and tfxl.tpu included), finds each
public class, method and function whose docstring has one, and runs each block in a fresh
namespace in an empty directory, so an example added later is run too."""

import importlib
import inspect
import pkgutil
import re

import pytest

import tfxl

FENCE = re.compile(r"```python\n(.*?)```", re.S)


def module_names():
    names = set()
    for package in ("tfxl", "tfxl.train", "tfxl.tpu"):
        module = importlib.import_module(package)
        names.add(package)
        names |= {info.name for info in pkgutil.walk_packages(module.__path__, package + ".")}
    return sorted(names)


def examples_of(obj):
    """The ```python blocks of `obj`'s docstring that follow its `Examples:` line."""
    doc = inspect.getdoc(obj) or ""
    if "Examples:" not in doc:
        return []
    return FENCE.findall(doc.split("Examples:", 1)[1])


def documented_examples():
    """(qualified name, code) for every example of a public class, method or function, each
    once, where it is defined."""
    found, seen = [], set()
    for name in module_names():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            members = [(attr, obj)]
            if inspect.isclass(obj):
                members += [(f"{attr}.{m}", v) for m, v in vars(obj).items()
                            if not m.startswith("_") and inspect.isfunction(v)]
            for qualified, member in members:
                if id(member) in seen or not (inspect.isclass(member)
                                              or inspect.isfunction(member)):
                    continue
                seen.add(id(member))
                for index, code in enumerate(examples_of(member)):
                    found.append((f"{name}.{qualified}[{index}]", code))
    return found


EXAMPLES = documented_examples()


def test_examples_are_found_in_the_public_classes():
    names = {name.rsplit("[", 1)[0] for name, _ in EXAMPLES}
    assert {"tfxl.models.language_model.TransfoXLLM", "tfxl.models.stateful.StatefulTransfoXLLM",
            "tfxl.classification.classifier.DocumentClassifier",
            "tfxl.hub.causal_lm.TransfoXLCausalLM", "tfxl.data.pipeline.input_fn"} <= names


def test_examples_of_finds_only_the_fenced_python_after_examples():
    def documented():
        """Text.

        ```python
        not_an_example = 1
        ```

        Examples:

        ```python
        x = 1
        ```
        """
    assert examples_of(documented) == ["x = 1\n"]
    assert examples_of(tfxl.get_preset) == []


@pytest.mark.large
@pytest.mark.parametrize("code", [code for _, code in EXAMPLES],
                         ids=[name for name, _ in EXAMPLES])
def test_every_docstring_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})
