"""The package's structure, read statically: every rope/**/*.py parsed with ``ast``, nothing imported.

* No import cycles among rope's modules. Every import counts, at module level and inside functions
  alike (the lazy ones, e.g. :mod:`rope.apply` importing :mod:`rope.kernels.operators` when it first
  takes the kernel path, only defer Triton: they must not close a cycle either). An edge goes to the
  module named; the parent packages Python initialises on the way are not edges (every module is
  under ``rope``, whose ``__init__`` imports the API).
* No module imports a private name (``_name``) of another rope module, by ``from m import _name``
  or as ``m._name``: what modules share is public in its home module. Private *modules*
  (:mod:`rope._checks`) are the package's shared internals, imported by its modules by design.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rope"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _base(module: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` reads from, its relative level resolved."""
    if node.level == 0:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(module: str):
    """(target module, imported name or None, line) for every import of a rope module in ``module``;
    the name is None for ``import rope.x`` and for ``from p import x`` where x is a module."""
    for node in ast.walk(ast.parse(MODULES[module].read_text(), str(MODULES[module]))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield f"{base}.{alias.name}", None, node.lineno
                elif base in MODULES:
                    yield base, alias.name, node.lineno


def _graph() -> dict[str, set[str]]:
    return {module: {target for target, _, _ in _imports(module) if target != module} for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_the_scan_sees_the_package_and_its_imports():
    """The scan is not vacuous: it finds the modules and the edges known to exist, relative and
    lazy ones included, and the cycle finder finds a cycle that is there."""
    graph = _graph()
    assert {"rope", "rope.apply", "rope.limits", "rope.kernels.operators", "rope.kernels.triton_rotary"} <= set(graph)
    assert {"rope._checks", "rope.limits", "rope.angles"} <= graph["rope.apply"]
    assert "rope.kernels.operators" in graph["rope.apply"]  # imported inside a function
    assert "rope.limits" in graph["rope.kernels.operators"]
    assert "rope.attention.encodings" in graph["rope.experiment.methods"]  # from ..attention import encodings
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]  # each reported
    report = _cycle_report([["rope.apply", "rope.kernels.operators"]])  # a made-up cycle: its real edge is shown
    assert report.startswith("rope.apply <-> rope.kernels.operators\n") and "rope.apply:" in report


def _cycle_report(cycles: list[list[str]]) -> str:
    """Every cycle in full, with the import lines that close it (``module:line imports target``)."""
    lines = []
    for component in cycles:
        lines.append(" <-> ".join(component))
        lines += sorted({f"    {module}:{line} imports {target}" for module in component
                         for target, _, line in _imports(module) if target in component and target != module})
    return "\n".join(lines)


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"{len(cycles)} import cycle(s) among rope's modules:\n{_cycle_report(cycles)}"


def _private_uses(module: str):
    """Private names of other rope modules that ``module`` imports or reads as attributes."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    modules_bound = {}  # local name -> rope module, for the attribute reads
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    modules_bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for target, name, line in _imports(module):
        if name is not None and name.startswith("_") and target != module:
            yield f"{module}:{line} imports {target}.{name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules_bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            yield f"{module}:{node.lineno} reads {modules_bound[node.value.id]}.{node.attr}"


def test_no_module_uses_another_modules_private_names():
    assert [use for module in sorted(MODULES) for use in _private_uses(module)] == []
