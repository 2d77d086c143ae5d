"""The services' modules import one another without a circle (issue 38: topics ↔
subscriptions ↔ federation ↔ publish ↔ prepare ↔ deliveries), function-level imports
included, and use no private helper of one another. The import-linter contract
``services-no-circle`` (``make lint``) keeps the named chain in order; this finds any circle."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

import broker.services

SERVICES = Path(broker.services.__file__).parent


def _module_of(name: str) -> str:
    # broker.services.selectors.view -> broker.services.selectors (a package is one module)
    return ".".join(name.split(".")[:3])


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_services_modules_import_one_another_without_a_circle():
    graph = grimp.build_graph("broker", include_external_packages=False)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        if not module.startswith("broker.services."):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("broker.services.") and (
                    _module_of(imported) != _module_of(module)):
                edges.setdefault(_module_of(module), set()).add(_module_of(imported))
    assert _circles(edges) == []


def test_no_service_module_uses_another_ones_private_names():
    offences = []
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules = set()  # names bound to sibling modules: from . import topics as topic_service
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is None and node.level:
                modules.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level and node.module:
                offences.extend(f"{path.name}: from .{node.module} import {alias.name}"
                                for alias in node.names if alias.name.startswith("_"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                offences.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert offences == []
