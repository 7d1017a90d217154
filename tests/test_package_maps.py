"""Package docstrings name modules that exist (issue 37: `sim/search` and `sim/calibrate` named
one long gone). Two forms are checked in every package's `__init__` docstring: a map line
(`    name   what it holds`, `name.py`, `pkg.sub`, or `module.function`), and a backticked
dotted name under a project package (`sim.collectives.nccl`, `sim.engine.network.Network`),
whose longest module prefix must exist and define the next name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("parasim", "sim", "topology", "traces", "executor")
MAP_LINE = re.compile(r"^\s*([a-z_][a-z0-9_]*(?:\.[a-z_][A-Za-z0-9_]*)*)(?:\.py)?\s{2,}\S")
DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)")


def _file(module: str) -> Path | None:
    """The source of a project module or package, None when there is none."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _defines(module: str, name: str) -> bool:
    """Whether `module` defines or imports `name` at its top level, or has it as a
    submodule."""
    if _file(f"{module}.{name}") is not None:
        return True
    path = _file(module)
    assert path is not None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = {node.name}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            continue
        if name in names:
            return True
    return False


def stale_names(package: str, doc: str) -> list[str]:
    """The names `package`'s docstring gives that name no module (or nothing in one)."""
    stale = []
    for line in doc.splitlines():
        if (match := MAP_LINE.match(line)) and not match.group(1).startswith("parasim "):
            name = match.group(1)
            full = name if name.split(".")[0] in PACKAGES else f"{package}.{name}"
            first = full.split(".")[:len(package.split(".")) + 1] \
                if full.startswith(package + ".") else full.split(".")[:2]
            if _file(".".join(first)) is None:
                stale.append(name)
    for name in DOTTED.findall(doc):
        parts = name.split(".")
        known = max(i for i in range(1, len(parts) + 1) if _file(".".join(parts[:i])))
        if known < len(parts) and not _defines(".".join(parts[:known]), parts[known]):
            stale.append(name)
    return stale


def _package_docs() -> dict[str, str]:
    docs = {}
    for top in PACKAGES:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            name = ".".join(init.parent.relative_to(ROOT).parts)
            docs[name] = ast.get_docstring(ast.parse(init.read_text())) or ""
    return docs


def test_the_check_finds_a_stale_map_line_and_a_stale_dotted_name():
    doc = ("The search.\n\n    space.py   the space\n"
           "    command.py the handler (one space: prose, not a map line)\n"
           "    gone      a module that is not there\n"
           "See `sim.search.run.search` and `sim.search.run.nothing_here`.")
    assert stale_names("sim.search", doc) == ["gone", "sim.search.run.nothing_here"]


def test_every_package_docstring_names_modules_that_exist():
    stale = {package: names for package, doc in _package_docs().items()
             if (names := stale_names(package, doc))}
    assert stale == {}
