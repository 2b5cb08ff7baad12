"""The run templates (`configs/`) and data recipes (`data_recipes/`, with their local samples)
that ship with draftkit, found through importlib.resources.

The repository keeps both at its top level; `draftkit/_data/` links to them, and the wheel ships
them as package data (pyproject.toml), so the same lookup works in an installed wheel, an
editable install and a source checkout.
"""

from __future__ import annotations

import contextlib
import functools
from importlib import resources
from pathlib import Path

from draftkit.core.errors import DraftkitError

_KEEP_OPEN = contextlib.ExitStack()  # extracted copies (zip imports) live as long as the process


@functools.cache
def data_dir(name: str) -> Path:
    """A directory of draftkit's shipped data: 'configs' or 'data_recipes'."""
    ref = resources.files("draftkit").joinpath("_data", name)
    path = Path(_KEEP_OPEN.enter_context(resources.as_file(ref)))
    if not path.is_dir():
        raise DraftkitError(
            f"draftkit's {name}/ is missing (looked at {path}): reinstall draftkit, or in a "
            f"source checkout restore the link draftkit/_data/{name} -> ../../{name} "
            "(`git checkout draftkit/_data`; on Windows enable git symlinks)")
    return path


def configs_dir() -> Path:
    return data_dir("configs")


def recipes_dir() -> Path:
    return data_dir("data_recipes")
