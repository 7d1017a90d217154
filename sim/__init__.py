"""The discrete-event simulator, in subpackages named for what they hold:

    sim.engine       the event engine: ops on streams over a graph, flows shared max-min
                     fairly, meetings of collectives, the communication lowering; no
                     transformer, no host
    sim.collectives  collective algorithms and NCCL's choices (cost models of communication)
    sim.models       compute time per kernel, memory per rank
    sim.calibrate    fitting profiles from measured traces; the microbenchmarks
    sim.search       layout search: analytic screen, full simulation of the best
    sim.report       the outputs: timeline, plotly reports, validation page
    sim.commands     one module per command (its arguments, its run); `sim.cli` dispatches

and at the top, what the commands share: the experiment config (`config`), calibration
profiles (`profile`), provenance, step metrics, `simulate.predict`, measured-trace replay
(`measured`) and validation. Never imports torch; only `run`, `calibrate --run` and `validate`
reach the executor, lazily.
"""
