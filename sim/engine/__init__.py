"""The event engine: it runs ops on streams over a graph and knows no transformer and no host.

    lowering   a plan's communication lowered to flows before the run (pure)
    flows      flow sets and lowerings, the values the network moves
    maxmin     max-min fair sharing of links among groups of flows
    network    the flow-level network on simpy
    meetings   who waits for whom: collectives meet when every member has issued them
    replay     the step: streams, dependencies, communication and compute timed
"""
