"""The package's shape: every import points down, and the model stands alone.

The import graph is read from the source (ast), so a cycle hidden by an import inside a
function is found too: such imports are themselves refused.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter

from tests.conftest import REPO

PACKAGE = REPO / "microgpt"


def sibling_imports(path) -> tuple[set[str], list[str]]:
    """(the microgpt modules `path` imports at its top level, the ones it imports elsewhere)."""
    tree = ast.parse(path.read_text())
    top, nested = set(), []
    top_nodes = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("microgpt"):
            if node.module == "microgpt":  # from microgpt import distributed
                names = [f"microgpt.{a.name}" for a in node.names]
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("microgpt.")]
        if not names:
            continue
        if id(node) in top_nodes:
            top.update(n.split(".")[1] for n in names)
        else:
            nested.append(f"{path.name}:{node.lineno}")
    return top, nested


def graph() -> dict[str, set[str]]:
    return {p.stem: sibling_imports(p)[0] for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_no_module_imports_a_sibling_inside_a_function():
    nested = [where for p in PACKAGE.glob("*.py") for where in sibling_imports(p)[1]]
    assert nested == [], f"imports of microgpt modules inside functions: {nested}"


def test_the_import_graph_has_no_cycle():
    try:
        order = list(TopologicalSorter(graph()).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {e.args[1]}") from None
    assert order.index("model") < order.index("generate") < order.index("trainer")


def documented_layers() -> list[str]:
    """The modules in the order of the README's Layout list, lowest first."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("## Layout") :]
    block = block[block.index("    microgpt/") : block.index("    conf/")]
    return re.findall(r"^      (\w+)\.py", block, re.M)


def test_every_import_points_down_the_documented_list():
    """Each module imports only modules above it in the README's Layout list, and the list names
    every module once: an edge such as heads -> checkpoint, or a module left out, fails."""
    g, order = graph(), documented_layers()
    assert sorted(order) == sorted(g), "the README's Layout list and microgpt/ differ"
    assert len(order) == len(set(order))
    upward = {
        f"{module} -> {imported}"
        for i, module in enumerate(order)
        for imported in g[module] - set(order[:i])
    }
    assert not upward, f"imports that point up the layout: {sorted(upward)}"


def test_the_core_knows_no_edge():
    g = graph()
    assert g["model"] == {"kv_cache"}
    assert g["kv_cache"] == set() and g["tokenizer"] == set() and g["files"] == set()
    edges = {"cli", "startup_checks", "trainer", "tensorboard", "compare", "sampling", "heads"}
    for module in ("model", "generate", "checkpoint", "runs", "config", "data", "head_analysis"):
        assert not g[module] & edges, f"{module} imports {g[module] & edges}"


def test_importing_the_model_imports_nothing_else_of_microgpt():
    code = (
        "import sys, microgpt.model; "
        "print(sorted(m for m in sys.modules if m.startswith('microgpt')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['microgpt', 'microgpt.kv_cache', 'microgpt.model']"


def test_no_block_of_six_lines_is_written_twice():
    """The same six or more lines (comments and blank lines aside) in two places of microgpt/
    is one rule written twice: say it once, in the module that owns it."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        lines = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines(), 1)]
        code = [(n, text) for n, text in lines if text and not text.startswith("#")]
        for k in range(len(code) - 5):
            block = tuple(text for _, text in code[k : k + 6])
            if sum(map(len, block)) >= 120:  # closing brackets and short lines are no rule
                seen.setdefault(block, []).append(f"{path.name}:{code[k][0]}")
    repeated = [places for places in seen.values() if len(places) > 1]
    assert not repeated, f"the same six lines in several places: {repeated}"
