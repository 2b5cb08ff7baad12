"""Device -> host staging for harvest: a ring of host buffers, one shard each, filled by
non-blocking copies on a side stream so the target's next forward starts while the last one's
states cross to the host.

On CUDA the buffers are pinned, every copy runs on `stream` after it waits for the compute
stream, and the device source is `record_stream`-ed so the allocator does not hand its memory
to the next forward before the copy has read it. `seal` records an event after a shard's last
copy; a writer thread waits on that event (`Slot.wait`), never the main thread. A slot goes
back to the ring only when its writer is done with it, so `acquire` blocks while every slot is
in flight: host memory stays at `slots` shards.

On the CPU (no CUDA, or the target on the CPU) the same calls copy synchronously into plain
buffers and `wait` returns at once: the fallback the CPU tests run.
"""

from __future__ import annotations

import queue

import torch


class Slot:
    """One host buffer set: `buffers[name]` [capacity, ...]; `event` set by `HostRing.seal`."""

    def __init__(self, index: int, buffers: dict[str, torch.Tensor]):
        self.index, self.buffers = index, buffers
        self.event = None  # torch.cuda.Event after the shard's last copy, on CUDA

    def wait(self) -> None:
        """Block until every copy into this slot has landed (called by the writer thread)."""
        if self.event is not None:
            self.event.synchronize()


class HostRing:
    """`slots` host buffer sets; `specs[name] = (row shape, dtype)` each with `capacity` rows."""

    def __init__(self, device: torch.device | str, specs: dict[str, tuple[tuple, torch.dtype]],
                 capacity: int, slots: int = 3):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        # every buffer up front (pinning takes time): callers count it as setup, not as work
        self._slots = [Slot(i, {name: torch.empty((capacity, *row), dtype=dtype,
                                                  pin_memory=self.cuda)
                                for name, (row, dtype) in specs.items()})
                       for i in range(slots)]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            self._free.put(i)

    def acquire(self) -> Slot:
        """A free slot (blocks while every slot waits for its writer)."""
        slot = self._slots[self._free.get()]
        slot.event = None
        return slot

    def release(self, slot: Slot) -> None:
        self._free.put(slot.index)

    def begin(self) -> None:
        """Before a batch's copies: the side stream waits for the work queued so far on the
        compute stream (the forward and the encode that made the sources)."""
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def copy(self, slot: Slot, name: str, start: int, src: torch.Tensor) -> None:
        """slot.buffers[name][start:start+len(src)] <- src (a device tensor, rows first)."""
        dst = slot.buffers[name][start:start + src.shape[0]]
        if not self.cuda:
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(self.stream)  # keep src's memory until the side stream has read it

    def seal(self, slot: Slot) -> None:
        """After a shard's last copy: the event its writer waits on."""
        if self.cuda:
            slot.event = torch.cuda.Event()
            slot.event.record(self.stream)
