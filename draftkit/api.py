"""The public Python API: one function per CLI verb, each taking a run directory and
`key=value` overrides (the CLI is a thin layer over these).

    from draftkit import api
    run = api.init("smollm2-135m", "math", name="demo")
    api.prepare(run); api.harvest(run); api.train(run); api.export(run); api.evaluate(run)

Stage modules live in their lifecycle subpackages (`draftkit.prepare.stage`, ...); nothing
here shadows a module.
"""

from __future__ import annotations

from draftkit.core.config import load as load_config
from draftkit.eval.stage import evaluate
from draftkit.export.stage import export
from draftkit.harvest.stage import harvest
from draftkit.init.plan import plan_run as plan
from draftkit.init.stage import init_run as init
from draftkit.prepare.stage import prepare
from draftkit.rl.drift import drift
from draftkit.rl.job import refresh
from draftkit.rl.refresher import DraftRefresher
from draftkit.rl.rollout_servers import swap
from draftkit.rl.status import status
from draftkit.rl.watch import watch
from draftkit.targets.load import load_target
from draftkit.train.stage import train

__all__ = ["DraftRefresher", "drift", "evaluate", "export", "harvest", "init", "load_config",
           "load_target", "plan", "prepare", "refresh", "status", "swap", "train", "watch"]
