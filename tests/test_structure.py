"""The shape the architecture promises (issue 17, DESIGN.md's layout): no import circle among
the project's modules, counting lazy and type-checking imports; no module over 400 lines of
code (docstrings, comments and blank lines not counted: a file grows with its idea and splits
where the idea splits, into modules named for what they hold; compacting code to fit under the
number is not a fix);
`sim/`'s own folder holds at most ten modules besides `__init__` and `__main__` (that the
simulator never imports torch is tests/test_no_torch.py's).

    pytest tests/test_structure.py -q
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("parasim", "sim", "topology", "traces", "executor")
MAX_LINES = 400
"""Lines of code a module may hold (`code_lines`)."""
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}


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


def code_lines(source: str) -> int:
    """The lines holding code: a token other than a comment, and not in a docstring (the
    first string statement of a module, class or function); a multi-line string that is not a
    docstring counts every line it spans."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.difference_update(range(first.lineno, (first.end_lineno or 0) + 1))
    return len(lines)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = ('"""Module\n\ndocstring."""\n\n# a comment\nimport os  # counted\n\n'
              'class A:\n    """Class docstring."""\n\n    def f(self):\n'
              '        """Function\n        docstring."""\n        x = """two\nlines"""\n'
              '        return (x,\n                os)\n')
    # import, class, def, the two lines of x's string, the two of the return
    assert code_lines(source) == 7


def test_no_module_over_400_lines_of_code():
    long = {name: n for name, path in _modules().items()
            if (n := code_lines(path.read_text())) > MAX_LINES}
    assert long == {}


def test_sim_folder_holds_at_most_ten_modules():
    own = sorted(p.name for p in (ROOT / "sim").glob("*.py")
                 if p.name not in ("__init__.py", "__main__.py"))
    assert len(own) <= 10, own
