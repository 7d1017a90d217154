"""`parasim search`: which layout trains a model fastest on a cluster, and fits.

    space.py     the candidate space of a [search] table; pruning by the layout's own rules
    passes.py    the plan builder's ops of one layer, the embedding and the output layer
    analytic.py  the analytic tier: closed-form step time and memory from the simulator's parts
    rank_work.py what each pipeline rank runs per micro-batch, for the analytic step
    stage_time.py  a chunk's time for one micro-batch in the analytic tier
    rule.py      the seeds' rule of thumb as a layout
    problem.py   the config as a value a worker rebuilds; a worker's cached context
    engines.py   this process, local worker processes, or a Ray cluster
    ray_address.py  `--ray HOST:PORT` checked by one TCP connection before Ray is asked
    orphans.py   a worker ends when the parasim process that started it ends
    stopped.py   a search whose worker is stopped ends with one line
    cost.py      the order simulations are sent in (the longest first)
    run.py       the two tiers: screen everything, simulate the best K; Kendall tau
    output.py    the ranked table and the --json object
    report.py    the plotly page: step time against peak memory
    goodput.py   --objective goodput: the simulated layouts ranked by goodput over a run
    sim.commands.search  the command line's handler
"""
