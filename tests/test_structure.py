"""The shape the architecture promises (issue 17, DESIGN.md's layout): no import circle among
the project's modules, counting lazy and type-checking imports; no module over 400 lines;
`sim/`'s own folder holds at most ten modules besides `__init__` and `__main__` (that the
simulator never imports torch is tests/test_no_torch.py's).

    pytest tests/test_structure.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("parasim", "sim", "topology", "traces", "executor")
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every project module `path` imports, anywhere in the file (lazy and TYPE_CHECKING
    imports too): `from a.b import c` counts a.b.c when it is a module, else a.b."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path, name, set(modules)):
            # a package's __init__ importing its own submodules is not a circle with them
            if not target.startswith(name + ".") or path.name != "__init__.py":
                graph.add_edge(name, target)
    return graph


def test_the_finder_counts_lazy_and_type_checking_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from sim.profile import Profile\n"
                      "def f():\n    from sim.engine import replay\n    import traces.io\n")
    known = {"sim", "sim.profile", "sim.engine", "sim.engine.replay", "traces", "traces.io"}
    assert _imports(source, "x.mod", known) == {"sim.profile", "sim.engine",
                                                 "sim.engine.replay", "traces.io"}


def test_no_import_circle_among_the_project_modules():
    graph = _graph()
    circles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == []


def test_no_module_over_400_lines():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_sim_folder_holds_at_most_ten_modules():
    own = sorted(p.name for p in (ROOT / "sim").glob("*.py")
                 if p.name not in ("__init__.py", "__main__.py"))
    assert len(own) <= 10, own
