"""draftkit: the whole life of a speculative-decoding draft model for an RL policy.

The Python API mirrors the CLI verbs; each stage lives in its own module and is imported
lazily so `import draftkit` stays cheap (no torch/vLLM import until a stage runs).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "init": ("draftkit.init", "init_run"),
    "prepare": ("draftkit.prepare", "prepare"),
    "harvest": ("draftkit.harvest", "harvest"),
    "train": ("draftkit.train", "train"),
    "export": ("draftkit.export", "export"),
    "evaluate": ("draftkit.evaluate", "evaluate"),
    "load_target": ("draftkit.target", "load_target"),
    "load_config": ("draftkit.config", "load"),
}

__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        module, attr = _API[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'draftkit' has no attribute {name!r}")
