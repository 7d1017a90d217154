"""A whole training run with failures, checkpoints and restarts: `parasim goodput`.

    from sim.goodput.plan import plan_run
    from sim.goodput.montecarlo import simulate_run
    run = plan_run(exp, summary, target_tokens=1.5e13)     # rates, costs, intervals
    outcome = simulate_run(run, runs=200, seed=0)           # the seeded Monte-Carlo

`fleets` (published per-component failure rates, one source each), `rates` (components,
their counts and the job's mean time to interruption), `causes` (what the Monte-Carlo draws:
the fleet's causes, planned maintenance, hangs, loss spikes; default spares), `settings`
(the optional `[reliability]` table), `costs` (checkpoint size, write and restart times),
`interval` (Young's and Daly's optimal intervals and the expected effective fraction),
`montecarlo` (the event simulation of the run), `plan` (what the command prints),
`recovery` (restart, in-memory and elastic recovery; the work a failure loses), `stragglers`
(slow nodes over a run, and their eviction), `badput` (ml-goodput-measurement's categories),
`outputs` (the JSON, time-to-train), `text` and `report` (the HTML page). Step time and
memory come from `sim.simulate.predict` and `sim.models.memory`: nothing here derives them
again.
"""
