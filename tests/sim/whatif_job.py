"""The small job the what-if tests capture and predict: two ranks of a tiny GPT on
localhost (`LOCAL`), and the same sharing two cores (`JOB`, `[cluster] cores`)."""

LOCAL = """
[model]
layers = 2
hidden = 128
heads = 4
seq_len = 64
vocab = 512

[parallel]
dp = 2
micro_batch = 1
global_batch = 4

[cluster]
preset = "localhost"
gpus_per_node = 2
"""
JOB = LOCAL + "cores = 2\n"
