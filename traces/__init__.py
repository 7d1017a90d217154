"""The common language of parasim: ops, traces, model and layout arithmetic, schedules.

Stdlib and numpy only, so that the simulator, the topology and the executor can all speak it.
"""
