"""The discrete-event simulator: network, collectives, compute, memory, step replay, the CLI.

Never imports torch; `sim.cli` reaches the executor lazily, only for `parasim run`.
"""
