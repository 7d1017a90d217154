"""Live tensor bytes the executor holds on CPU, counted by storage, with the peak.

On a GPU `torch.cuda.max_memory_allocated` answers; on CPU nothing does, so the executor counts
what it holds itself: parameters, gradients, optimizer state, communication buffers, and the
activations autograd saves between a kernel's forward and its backward (seen through
`torch.autograd.graph.saved_tensors_hooks`). A storage is counted once however many tensors
view it; parameter storages are excluded from activations (a saved weight is not a new tensor).
"""

from __future__ import annotations

from collections import Counter

import torch

CATEGORIES = ("params", "grads", "optimizer", "activations", "comm")


class MemoryMeter:
    """Reference-counted storages by data pointer; `peak_bytes` is the most ever live at once."""

    def __init__(self) -> None:
        self._storages: dict[int, list] = {}  # ptr -> [nbytes, refs, category]
        self._excluded: set[int] = set()
        self.live = Counter({c: 0 for c in CATEGORIES})
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_by_category: dict[str, int] = dict(self.live)

    def hold(self, tensor: torch.Tensor, category: str) -> int:
        """Count `tensor`'s storage (once per storage); returns the key to `drop` later, 0 for
        nothing held (an empty storage, or a parameter buffer saved as an activation)."""
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or (category == "activations" and ptr in self._excluded):
            return 0
        entry = self._storages.get(ptr)
        if entry is not None:
            entry[1] += 1
            return ptr
        nbytes = storage.nbytes()
        self._storages[ptr] = [nbytes, 1, category]
        self.live[category] += nbytes
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_by_category = dict(self.live)
        return ptr

    def drop(self, ptr: int) -> None:
        if ptr == 0:
            return
        entry = self._storages[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            del self._storages[ptr]
            self.live[entry[2]] -= entry[0]
            self.live_bytes -= entry[0]

    def exclude(self, tensor: torch.Tensor) -> int:
        """Never count this storage as a saved activation (a parameter buffer); returns its key
        for `include` when the buffer is freed."""
        ptr = tensor.untyped_storage().data_ptr()
        self._excluded.add(ptr)
        return ptr

    def include(self, ptr: int) -> None:
        self._excluded.discard(ptr)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes
        self.peak_by_category = dict(self.live)
