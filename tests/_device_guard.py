"""A stand-in accelerator for CI, which has no GPU: tensors "on the device" fail when mixed with
CPU tensors exactly as CUDA tensors do, while the arithmetic runs on the CPU.

    with device_guard() as dev:                 # dev = torch.device("lazy")
        model.to(dev)                           # parameters become OnDevice tensors
        model(batch_on_cpu)                     # RuntimeError: Expected all tensors to be on
                                                # the same device, ... lazy and cpu!

Inside the block, the `lazy` device stands for the accelerator: `.to("lazy")`, `device="lazy"`
factories and every op on such a tensor give `OnDevice` tensors, which report `device == lazy`
and hold real CPU data, so data-dependent code (boolean masks, `.item()`, `.tolist()`) runs as on
a GPU. An op that mixes an OnDevice tensor with a CPU tensor of one or more dimensions raises, as
CUDA does; CPU scalars (0-dim) mix freely, as they do on CUDA. `.cpu()` / `.to("cpu")` gives a
plain CPU tensor back, and `copy_` copies across devices, as both do on CUDA. `lazy` is torch's lazy-tensor backend, linked into every build and used by
nothing draftkit loads (transformers does use `meta` to build models, so that one stays free);
CUDA itself cannot stand in, a CPU build refuses `.to("cuda")` before any Python hook runs.
Departure from CUDA: CPU index tensors into a device tensor (`x_gpu[idx_cpu]`) are refused here,
while CUDA copies them over; code should keep indices on the device anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("lazy")


class OnDevice(torch.Tensor):
    """A tensor on the stand-in accelerator: reports `DEVICE`, computes on `elem` (CPU)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=DEVICE, requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor):
        self.elem = elem

    def tolist(self):  # a device-to-host read, as on CUDA
        return self.elem.tolist()

    def untyped_storage(self):  # device memory has a storage and pointers too
        return self.elem.untyped_storage()

    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _is_device(dev) -> bool:
    return dev is not None and torch.device(dev).type == DEVICE.type


def _dispatch(func, args, kwargs):
    if func is torch.ops.aten.copy_.default:  # copies cross devices, on CUDA too
        func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        return args[0]
    flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    on_device = any(isinstance(t, OnDevice) for t in tensors)
    target = kwargs.get("device")
    if on_device:
        cpu = [t for t in tensors if not isinstance(t, OnDevice) and t.dim() > 0]
        if cpu:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{DEVICE.type} (the stand-in accelerator) and cpu! ({func}; CPU tensor of shape "
                f"{tuple(cpu[0].shape)})")
    if _is_device(target):
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    to_cpu = target is not None and not _is_device(target)
    if to_cpu or not (on_device or _is_device(target)):
        return out
    return tree_map(_wrap, out)


def _unwrap(x):
    return x.elem if isinstance(x, OnDevice) else x


def _wrap(x):
    return OnDevice(x) if isinstance(x, torch.Tensor) and not isinstance(x, OnDevice) else x


class _Guard(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _from_data(make):
    """torch.tensor / as_tensor build their tensor below Python dispatch: place it by hand."""

    def build(data, *args, device=None, **kwargs):
        if _is_device(device):
            return OnDevice(make(data, *args, device="cpu", **kwargs))
        return make(data, *args, device=device, **kwargs)
    return build


@contextlib.contextmanager
def device_guard() -> Iterator[torch.device]:
    """Inside: `lazy` is the stand-in accelerator (see the module docstring)."""
    saved = torch.tensor, torch.as_tensor
    torch.tensor, torch.as_tensor = _from_data(torch.tensor), _from_data(torch.as_tensor)
    try:
        with _Guard():
            yield DEVICE
    finally:
        torch.tensor, torch.as_tensor = saved


def on_device(t: torch.Tensor) -> bool:
    return isinstance(t, OnDevice)
