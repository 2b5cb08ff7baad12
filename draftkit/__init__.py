"""draftkit: the whole life of a speculative-decoding draft model for an RL policy.

The Python API mirrors the CLI verbs: `draftkit.init(...)`, `draftkit.prepare(run)`,
`draftkit.harvest(run)`, `draftkit.train(run)`, `draftkit.export(run)`,
`draftkit.evaluate(run)`. Stage modules share those names, so the package binds the
functions after importing the modules; reach a module's other names with
`from draftkit.harvest import open_harvest` (not `draftkit.harvest.open_harvest`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import load as load_config  # noqa: E402
from .evaluate import evaluate  # noqa: E402
from .export import export  # noqa: E402
from .harvest import harvest  # noqa: E402
from .init import init_run as init  # noqa: E402
from .prepare import prepare  # noqa: E402
from .target import load_target  # noqa: E402
from .train import train  # noqa: E402

__all__ = ["evaluate", "export", "harvest", "init", "load_config", "load_target", "prepare",
           "train"]
