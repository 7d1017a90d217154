"""The commands of `parasim`, one module each, all of one shape: `HELP`, `add_arguments(parser)`
and `run(args) -> exit status`. What they share (printing, the progress bar, the cluster flags,
`--profile`, trace outputs) is in `common`; `sim.cli` only dispatches.
"""
