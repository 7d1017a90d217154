"""The choices of `traces.model.ModelSpec`'s string keys (checked in its `__post_init__`)."""

ATTENTIONS = ("flash", "unfused")
"""`model.attention`: flash attention or the unfused softmax kernels."""
FFNS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
STACKS = ("fused", "compiled", "eager")
"""`model.kernels`: the software stack's kernels for a block (`traces.stack`)."""
POSITIONS = ("learned", "rope")
