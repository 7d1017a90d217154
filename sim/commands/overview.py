"""What bare `parasim` prints: each command in one line with one example command line, and the
example each command's `--help` ends with. The examples name only files a fresh clone has (the
shipped configs and traces) or makes itself (`here.json` by `calibrate`), and a test parses
every one of them (`tests/sim/commands/test_overview_cli.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

EXAMPLES: Mapping[str, str] = {
    "collective": "parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce "
                  "--sizes 1M:4G",
    "simulate": "parasim simulate --set parallel.micro_batch=2 --report step.html",
    "replay": "parasim replay tests/data/kineto/a100-2rank-nccl-rank0.json.gz "
              "--cluster dgx-a100",
    "run": "parasim run sim/examples/gpt-tiny-localhost.toml --out runs/tiny",
    "search": "parasim search --gpus 512 --top 8 --report search.html",
    "calibrate": "parasim calibrate --run localhost -o here.json",
    "validate": "parasim validate sim/examples/gpt-tiny-2rank-localhost.toml "
                "--profile here.json",
    "goodput": "parasim goodput --days 30 --report goodput.html",
    "sweep": "parasim sweep parallel.micro_batch 1 2 4 --report sweep.html",
    "export": "parasim export --chakra chakra --config sim/examples/gpt-tiny-2rank-localhost.toml",
    "from-megatron": "parasim from-megatron \"--tensor-model-parallel-size 8 "
                     "--sequence-parallel\" --gpus 8 "
                     "--model hf:tests/data/hf/Meta-Llama-3-8B.config.json",
    "whatif": "parasim whatif runs/tiny --set parallel.dp=2 --set parallel.tp=1",
}
"""One command line per command, in `sim.cli.COMMANDS`' order."""


def epilog(name: str) -> str:
    """The line a command's `--help` ends with."""
    return f"example: {EXAMPLES[name]}"


def overview(helps: Mapping[str, str], version: str) -> str:
    """Bare `parasim`: the commands, each its one line of help and its example."""
    width = max(map(len, helps))
    lines = [f"parasim {version}: simulate distributed LLM training steps.", "",
             "usage: parasim COMMAND [ARGS...]    (parasim COMMAND --help for its flags)", ""]
    for name, help_text in helps.items():
        lines += [f"  {name:<{width}}  {help_text}", f"  {'':<{width}}    {EXAMPLES[name]}"]
    return "\n".join(lines)
