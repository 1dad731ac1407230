"""No import circle: the modules of tfxl/, train/ (tfxl.train) and tpu/ (tfxl.tpu), each an edge to
every tfxl module it imports, form a graph without a cycle.

Read from the source with `ast`, nothing imported. What counts as an import:

* every `import` and `from ... import` statement, at the top of a module or inside a function:
  an import deferred into a function (to load TensorFlow or an extra on first use) still says
  "this module needs that one", and one deferred only to dodge a circle is the circle itself;
* `from PACKAGE import NAME` is an edge to PACKAGE.NAME where that is a module, else to PACKAGE,
  and to the module PACKAGE's `_LAZY` table names for NAME (its `__getattr__` imports that one
  when the name is read);
* importing a module runs the `__init__` of every package above it: an edge to each of those
  packages too, except the importer's own (they are running, or have run, when it is imported).

Not seen: `importlib.import_module` with a computed name (the console scripts' table, the
lazy packages' `__getattr__` beyond `_LAZY`) and attribute reads of the lazy `tfxl` package
(`tfxl.TransfoXLLM`); tests/test_layering.py checks those for the rooms' rules.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The repository's folders train/ and tpu/ install as tfxl.train and tfxl.tpu (setup.cfg).
FOLDERS = {"tfxl": ROOT / "tfxl", "tfxl.train": ROOT / "train", "tfxl.tpu": ROOT / "tpu"}

def module_sources():
    """{module name: (source, is_package)} of every module of the three folders."""
    modules = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules[".".join([package, *parts])] = (path.read_text(), is_package)
    return modules


def lazy_table(tree, package):
    """A package's `_LAZY` (name -> the module whose attribute it is), its values resolved."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_LAZY"):
            # Literals and comprehensions of literals only: evaluated without any builtins.
            table = eval(compile(ast.Expression(node.value), "<_LAZY>", "eval"),
                         {"__builtins__": {}})
            return {name: value if "." in value else f"{package}.{value}"
                    for name, value in table.items()}
    return {}


def imports_of(tree, module, is_package):
    """The (line, dotted name, names imported from it) of every import statement in `tree`."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base, tuple(alias.name for alias in node.names)


def import_graph(modules):
    """{module: {imported module: line of its first import}} of `modules` (as
    `module_sources` returns them), tfxl's own modules only."""
    trees = {name: ast.parse(source, name) for name, (source, _) in modules.items()}
    lazy = {name: lazy_table(trees[name], name) for name, (_, is_package) in modules.items()
            if is_package}
    graph = {}
    for module, (_, is_package) in modules.items():
        edges = graph.setdefault(module, {})
        # Its own packages: already running (or run) when it is imported.
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}

        def add(target, line):
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()  # `import tfxl.x.y` where y is not a module
            for i in range(1, len(parts) + 1):  # every package above it runs first
                name = ".".join(parts[:i])
                if name != module and name not in own:
                    edges.setdefault(name, line)

        for line, base, names in imports_of(trees[module], module, is_package):
            if not (base == "tfxl" or base.startswith("tfxl.")):
                continue
            add(base, line)
            for name in names:
                if f"{base}.{name}" in modules:
                    add(f"{base}.{name}", line)
                elif name in lazy.get(base, {}):
                    add(lazy[base][name], line)
    return graph


def strongly_connected(graph):
    """The strongly connected components of more than one module (or a module importing
    itself), each sorted: Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def one_cycle(graph, component):
    """A shortest cycle through the component's first module, as `a:line -> b:line -> ... -> a`
    (each line the importing one)."""
    members, start = set(component), component[0]
    paths, frontier = {start: [start]}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = paths[node] + [start]
                    return " -> ".join(f"{a} (line {graph[a][b]})"
                                       for a, b in zip(path, path[1:])) + f" -> {start}"
                if child in members and child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(component)


def describe(graph, components):
    return "\n".join(f"{', '.join(c)}:\n  {one_cycle(graph, c)}" for c in components)


def test_the_import_graph_has_no_cycle():
    graph = import_graph(module_sources())
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + describe(graph, cycles)


@pytest.mark.parametrize("sources, cycles", [
    # at the top of each module
    ({"tfxl/": "", "tfxl.a": "from tfxl.b import x\n", "tfxl.b": "import tfxl.a\n"},
     [["tfxl.a", "tfxl.b"]]),
    # one side inside a function: still a cycle
    ({"tfxl/": "", "tfxl.a": "def f():\n    from tfxl import b\n",
      "tfxl.b": "from tfxl.a import f\n"}, [["tfxl.a", "tfxl.b"]]),
    # through a package's __init__, which runs before its module
    ({"tfxl/": "", "tfxl.p/": "from tfxl.p.m import y\n", "tfxl.p.m": "y = 1\n",
      "tfxl.a": "from tfxl.p.m import y\n", "tfxl.p.n": "import tfxl.a\n",
      "tfxl.q": "from tfxl.p import n\n"}, []),
    ({"tfxl/": "", "tfxl.p/": "from tfxl.p.m import y\n", "tfxl.p.m": "from tfxl.a import z\n",
      "tfxl.a": "from tfxl.p.n import w\nz = 1\n", "tfxl.p.n": "w = 1\n"},
     [["tfxl.a", "tfxl.p", "tfxl.p.m"]]),
    # a lazy package's name: an edge to the module its table names
    ({"tfxl/": "", "tfxl.p/": "_LAZY = {'Model': 'm', **{n: 'tfxl.c' for n in ('C',)}}\n",
      "tfxl.p.m": "from tfxl.c import C\n", "tfxl.c": "def f():\n    from tfxl.p import Model\n"},
     [["tfxl.c", "tfxl.p.m"]]),
    # a package importing its own modules, and a relative import: no cycle
    ({"tfxl/": "", "tfxl.p/": "from . import m\n", "tfxl.p.m": "from ..q import v\n",
      "tfxl.q": "v = 1\n"}, []),
])
def test_cycles_are_found_wherever_the_imports_are(sources, cycles):
    # A name ending in "/" is a package.
    modules = {name.rstrip("/"): (source, name.endswith("/"))
               for name, source in sources.items()}
    assert strongly_connected(import_graph(modules)) == cycles
