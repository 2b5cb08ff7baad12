"""Training near the hardware: batches onto the device one step ahead, the frozen target parts
in the dtype the hardware computes in, and the compiled parts (train.compile).

`DeviceFeed` on CUDA: when the loop takes batch i, batch i+1 is already on its way: pinned
(the DataLoader's pin-memory thread did it when it has workers, else `pin_memory` here) and
copied with `non_blocking` on a side stream, so the host-to-device copy overlaps step i's
compute; the step's stream waits for the copy's event before it reads the batch, and each
tensor is marked used on that stream (record_stream) so the allocator does not hand its memory
to the side stream too early. Elsewhere (the CPU) it is the plain path: each batch moved when
it is taken, nothing read ahead.

`frozen_to` casts the frozen copies of the target's tensors a draft holds (its
`FROZEN_TARGET_PARTS`: embedding, final norm, lm_head) to train.dtype's resolved dtype: bf16
where the hardware runs it natively (hardware.py), where autocast would otherwise cast the fp32
[V, H] lm_head again at every call (autocast caches only weights that require grad); fp32
elsewhere, unchanged. The trainable weights stay fp32 master weights.

`compile_parts` asks the draft for the modules worth compiling (`compile_parts()`: fused
elementwise kernels for its norms and MLPs) when train.compile is on.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from draftkit.core.batching import to_device
from draftkit.core.errors import DraftkitError

Batch = dict[str, torch.Tensor]


class DeviceFeed:
    """`take()` -> the next batch of `batches` on `device` (StopIteration at the end)."""

    def __init__(self, batches: Iterator[Batch], device: torch.device):
        self.batches, self.device = batches, device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.ahead: tuple[Batch, torch.cuda.Event] | None = None

    def take(self) -> Batch:
        if self.stream is None:
            return to_device(next(self.batches), self.device)
        current = self.ahead or self._start(next(self.batches))
        self.ahead = None
        batch, copied = current
        step_stream = torch.cuda.current_stream(self.device)
        step_stream.wait_event(copied)
        for t in batch.values():
            if isinstance(t, torch.Tensor):
                t.record_stream(step_stream)
        nxt = next(self.batches, None)
        if nxt is not None:
            self.ahead = self._start(nxt)
        return batch

    def _start(self, batch: Batch) -> tuple[Batch, torch.cuda.Event]:
        """Pin `batch` and queue its copy on the side stream; (device batch, copy done event)."""
        with torch.cuda.stream(self.stream):  # the pinned source outlives the copy: torch's
            # pinned-memory allocator keeps a block until the copies queued from it are done
            moved = {k: (v if v.is_pinned() else v.pin_memory()).to(self.device,
                                                                    non_blocking=True)
                     if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            return moved, self.stream.record_event()


def frozen_to(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Cast the model's frozen target parts (`FROZEN_TARGET_PARTS`, parameter names) to
    `dtype` in place; returns the names cast."""
    names = [n for n in getattr(model, "FROZEN_TARGET_PARTS", ())
             if model.get_parameter(n).dtype != dtype]
    for name in names:
        p = model.get_parameter(name)
        if p.requires_grad:
            raise ValueError(f"{name} is trainable; only frozen target parts change dtype")
        p.data = p.data.to(dtype)
    return names


def compile_parts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """torch.compile the modules the draft names (its `compile_parts()`), in place; returns
    them. A draft that names none cannot honour train.compile."""
    if not hasattr(model, "compile_parts"):
        raise DraftkitError(f"train.compile: {type(model).__name__} names no parts to compile;"
                            " set train.compile=false")
    parts = list(model.compile_parts())
    for m in parts:
        m.compile(dynamic=True)  # batch shapes vary: one graph for them all
    return parts
