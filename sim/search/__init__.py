"""`parasim search`: which layout trains a model fastest on a cluster, and fits.

    space.py     the candidate space of a [search] table; pruning by the layout's own rules
    passes.py    the plan builder's ops of one layer, the embedding and the output layer
    analytic.py  the analytic tier: closed-form step time and memory from the simulator's parts
    rule.py      the seeds' rule of thumb as a layout
    problem.py   the config as a value a worker rebuilds; a worker's cached context
    engines.py   this process, local worker processes, or a Ray cluster
    run.py       the two tiers: screen everything, simulate the best K; Kendall tau
    output.py    the ranked table and the --json object
    report.py    the plotly page: step time against peak memory
    command.py   the command line's handler
"""
