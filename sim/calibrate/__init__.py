"""Calibration: measured traces in, a profile of fitted link and compute parameters out.

    parasim calibrate --run localhost -o here.json          # microbenchmarks, then the fit
    parasim calibrate runs/tiny runs/bench -o here.json     # fit traces already recorded

    observe   timed trace -> communication and compute samples, in the simulator's terms
    links     latency and bandwidth per link class, least squares on the simulator's lowerings
    kernels   the compute model's rates, overheads and exponent, least squares on its formula
    interference  comm_interference from the probes timed alone and beside a collective
    fit       all three, into a version-2 profile with `calibrated: true` and `measured_on`;
              figures the data do not pin down keep the base profile's values, each named
    microbench  what to measure (targets), the bench spec, the run through the executor
    summary   what the command prints: figures, intervals, residuals (table or --json)

The command is `sim.commands.calibrate` (the executor is imported only there, and only for
--run). Nothing is imported here: the command line reads its flags without loading scipy.
"""
