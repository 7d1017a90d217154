"""Every shipped example's outputs, written to a folder and compared byte for byte with another
tree's: the check that a refactoring (issue 37's moves) changed no output.

    python tests/bench/compare_outputs.py against main       # one command: REF's tree vs this
    python tests/bench/compare_outputs.py write OUT [--tree DIR] [--only NAME ...]
    python tests/bench/compare_outputs.py compare A B        # exit 1 and the list when they differ

For each `sim/examples/*.toml` of a tree it writes, from a fresh `python -m sim` of that tree:

    NAME.simulate.json   `simulate --json` (the file's bytes: stdout); NAME.simulate.exit its
                         exit status and stderr, so a refusal is compared too
    NAME.trace.json      `--trace` of the same run, restricted to rank 0 (`--trace-ranks 0`:
                         the whole-step trace of a 2048-GPU example is 200 MB and 2 minutes)
    NAME.report.html     `--report` of the same run (plotly's, deterministic)
    NAME.search.json     `search --json --top 2 --workers 1` (the screen of the whole space, then
                         two layouts simulated in full, in one process: the same bytes every run)
    NAME.goodput.json    `goodput --json --runs 50` (the seeded Monte-Carlo, a quarter of the
                         default 200 runs)

Each command runs under a time limit (`--limit`, 600 s by default; a run over it is written as
such and so differs from a finished one). The paths the commands see are the same in every
tree (a link named `tree` to the tree, outputs beside it), so no absolute path reaches an
output. `write` took 577 s on the 2-core machine shared under load 4 (`against`: twice that);
most of it is the largest examples' reports (`--only` narrows the examples).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 600.0

COMMANDS: dict[str, list[str]] = {
    "simulate": ["simulate", "{config}", "--json", "--trace", "{name}.trace.json",
                 "--trace-ranks", "0", "--report", "{name}.report.html"],
    "search": ["search", "{config}", "--json", "--top", "2", "--workers", "1"],
    "goodput": ["goodput", "{config}", "--json", "--runs", "50"],
}
"""Each command's arguments; {config} is the example's path under the tree, {name} its stem."""


def examples(tree: Path) -> list[Path]:
    """The shipped examples of a tree, by name."""
    return sorted((tree / "sim" / "examples").glob("*.toml"))


def write(tree: Path, out: Path, only: list[str] | None = None, limit_s: float = LIMIT_S,
          python: str = sys.executable) -> None:
    """Every example's outputs from `tree`'s code into `out` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parasim-outputs-") as work:
        here = Path(work)
        (here / "tree").symlink_to(tree.resolve(), target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
        for config in examples(tree):
            name = config.stem
            if only and name not in only:
                continue
            for command, template in COMMANDS.items():
                args = [a.format(config=f"tree/sim/examples/{config.name}", name=name)
                        for a in template]
                print(f"{name}: {command}", file=sys.stderr, flush=True)
                _run(python, args, here, env, limit_s, out / f"{name}.{command}")
            for made in sorted(here.glob(f"{name}.*")):
                shutil.move(made, out / made.name)


def _run(python: str, args: list[str], cwd: Path, env: dict[str, str], limit_s: float,
         stem: Path) -> None:
    """One command: its stdout to STEM.json, its exit status and stderr to STEM.exit."""
    try:
        proc = subprocess.run([python, "-m", "sim", *args], cwd=cwd, env=env,
                              capture_output=True, timeout=limit_s)
        stdout, status = proc.stdout, f"exit {proc.returncode}\n".encode() + proc.stderr
    except subprocess.TimeoutExpired:
        stdout, status = b"", f"over the {limit_s:g} s limit\n".encode()
    stem.parent.joinpath(f"{stem.name}.json").write_bytes(stdout)
    stem.parent.joinpath(f"{stem.name}.exit").write_bytes(status)


def compare(a: Path, b: Path) -> list[str]:
    """The files of two output folders that differ: 'differs: NAME', 'only in A: NAME' or
    'only in B: NAME', sorted by name; [] when every file is byte-identical."""
    names_a = {p.name for p in a.iterdir() if p.is_file()}
    names_b = {p.name for p in b.iterdir() if p.is_file()}
    lines = []
    for name in sorted(names_a | names_b):
        if name not in names_b:
            lines.append(f"only in {a}: {name}")
        elif name not in names_a:
            lines.append(f"only in {b}: {name}")
        elif not filecmp.cmp(a / name, b / name, shallow=False):
            lines.append(f"differs: {name}")
    return lines


def export(ref: str, into: Path) -> Path:
    """The tree of git revision `ref` of this repository, unpacked into `into`."""
    archive = into / "tree.tar"
    with archive.open("wb") as file:
        subprocess.run(["git", "archive", ref], cwd=ROOT, stdout=file, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def report(lines: list[str], a: Path, b: Path) -> int:
    """Print the differences (or that there are none); the exit status."""
    for line in lines:
        print(line)
    if not lines:
        count = sum(1 for p in a.iterdir() if p.is_file())
        print(f"{count} files byte-identical: {a} and {b}")
    return 1 if lines else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wr = sub.add_parser("write", help="write a tree's outputs into OUT")
    wr.add_argument("out", type=Path)
    wr.add_argument("--tree", type=Path, default=ROOT, help="the tree (default: this one)")
    cmp = sub.add_parser("compare", help="compare two output folders byte for byte")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    ag = sub.add_parser("against", help="REF's outputs vs this tree's, compared")
    ag.add_argument("ref", nargs="?", default="main", help="git revision (default main)")
    ag.add_argument("--keep", type=Path, help="keep both output folders under this folder")
    for p in (wr, ag):
        p.add_argument("--only", nargs="+", metavar="NAME", help="only these examples (stems)")
        p.add_argument("--limit", type=float, default=LIMIT_S, help="seconds per command")
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.tree, args.out, args.only, args.limit)
        return 0
    if args.command == "compare":
        return report(compare(args.a, args.b), args.a, args.b)
    with tempfile.TemporaryDirectory(prefix="parasim-against-") as tmp:
        base = args.keep or Path(tmp)
        before, after = base / f"before-{args.ref.replace('/', '_')}", base / "after"
        write(export(args.ref, Path(tmp)), before, args.only, args.limit)
        write(ROOT, after, args.only, args.limit)
        return report(compare(before, after), before, after)


if __name__ == "__main__":
    sys.exit(main())
