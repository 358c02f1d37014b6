"""The package's shape: docs/architecture.md's map matches the tree, every import points down its
layers, and the model stands alone.

The import graph is read from the source (ast), so a cycle hidden by an import inside a function
is found too: such imports are themselves refused.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter

from tests.conftest import REPO

PACKAGE = REPO / "microgpt"


def module_name(path) -> str:
    """microgpt/heads/roles.py -> heads.roles"""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def modules() -> list:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__init__.py"]


def imports(path) -> tuple[set[str], list[str]]:
    """(the microgpt modules `path` imports at its top level, the ones it imports elsewhere)."""
    tree = ast.parse(path.read_text())
    top, nested = set(), []
    top_nodes = {id(n) for n in tree.body}
    # an entry point's imports inside its module-level `with entry.loading(...)`: top level too
    top_nodes |= {id(b) for n in tree.body if isinstance(n, ast.With) for b in n.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("microgpt"):
            package = node.module.removeprefix("microgpt").lstrip(".")
            if package in (
                "",
                "commands",
                "data",
                "heads",
                "sample",
                "train",
                "viz",
            ):  # from microgpt import x
                names = [f"{package}.{a.name}".lstrip(".") for a in node.names]
            else:
                names = [package]
        elif isinstance(node, ast.Import):
            names = [a.name[len("microgpt.") :] for a in node.names if a.name[:9] == "microgpt."]
        if not names:
            continue
        if id(node) in top_nodes:
            top.update(names)
        else:
            nested.append(f"{module_name(path)}:{node.lineno}")
    return top, nested


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p)[0] for p in modules()}


def documented_layers() -> list[tuple[str, list[str]]]:
    """docs/architecture.md's map: (layer, its modules), lowest first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^    layer (\w+):\s+(.+)$", text, re.M)
    return [(layer, [f[:-3].replace("/", ".") for f in files.split()]) for layer, files in rows]


def test_no_module_imports_another_inside_a_function():
    nested = [where for p in modules() for where in imports(p)[1]]
    assert nested == [], f"imports of microgpt modules inside functions: {nested}"


def test_the_import_graph_has_no_cycle():
    try:
        order = list(TopologicalSorter(graph()).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {e.args[1]}") from None
    assert order.index("model") < order.index("sample.generate") < order.index("train.trainer")


def test_the_map_names_every_module_once():
    documented = [m for _, ms in documented_layers() for m in ms]
    assert len(documented) == len(set(documented)), "a module is in two layers"
    assert sorted(documented) == sorted(graph()), "docs/architecture.md's map and microgpt/ differ"


def test_every_import_points_down_the_layers():
    """A module imports only its own layer and the layers before it on the map: an edge such as
    heads -> train.trainer, data -> commands, or config -> viz, fails."""
    layer_of = {m: i for i, (_, ms) in enumerate(documented_layers()) for m in ms}
    g = graph()
    upward = sorted(
        f"{module} -> {imported}"
        for module, imported_ in g.items()
        for imported in imported_
        if layer_of[imported] > layer_of[module]
    )
    assert not upward, f"imports that point up the layers: {upward}"


def test_the_core_knows_no_edge():
    g = graph()
    assert g["model"] == {"kv_cache"}
    # the core's own rules only: the user-error type, atomic files, the run-folder rule
    within = {"files": {"errors"}, "system": {"errors"}, "runs": {"errors", "files"}}
    within |= {"tokenizer": {"errors"}, "entry": {"errors"}}
    for module in ("kv_cache", "tokenizer", "files", "errors", "entry", "system", "runs"):
        assert g[module] <= within.get(module, set()), f"{module} imports {g[module]}"
    edges = dict(documented_layers())["edges"]
    for module, imported in g.items():
        if module not in edges:
            assert not imported & set(edges), f"{module} imports the edge {imported & set(edges)}"


def test_importing_the_model_imports_nothing_else_of_microgpt():
    code = (
        "import sys, microgpt.model; "
        "print(sorted(m for m in sys.modules if m.startswith('microgpt')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['microgpt', 'microgpt.kv_cache', 'microgpt.model']"
