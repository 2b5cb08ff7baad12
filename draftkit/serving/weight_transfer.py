"""draftkit's vLLM weight-transfer engine (backend "draftkit"): vLLM's native draft update
(`start_draft_weight_update` -> `update_weights` -> `finish_weight_update`) from a published
draft's safetensors files, on the CPU as on a GPU. vLLM's own engines (NCCL, IPC) need a GPU.

    LLM(..., weight_transfer_config={"backend": "draftkit"})    # drafter_swap.engine_kwargs()
    vllm serve ... --weight-transfer-config '{"backend": "draftkit"}'

An update names a directory, not tensors: `update_info = {"directory": DIR, "secret": S}`
(tensors through `collective_rpc` arrive as lists; a path crosses the RPC and each worker reads
the files itself, so trainer and engines share a filesystem). The worker loads them with vLLM's
layerwise reload (the path `reload_weights` takes), which runs vLLM-CPU's repacking of linear
weights again: a plain `load_weights` into the live model leaves repacked layers empty there.

The secret: every update carries `DRAFTKIT_SWAP_SECRET`, which the server process (and so each
worker) was started with; an update without it, or with another, is refused before the model
is touched. vLLM's dev-mode routes (`/update_weights`) are unauthenticated even with
`--api-key`: with this backend they cannot load a draft without the secret either. An engine
started without the variable refuses every update.

Departure from vLLM's IPC engine: `start_weight_update` only opens the session; the layerwise
reload starts inside `update_weights`, after the secret and the files were checked, so a
refused or broken update leaves the old weights in place (a reload that raises halfway puts the
layers it had not finished back). The loaded directory is recorded on the model
(`draftkit_path`), where `drafter_swap`'s worker extension reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from draftkit.serving.drafter_swap import BACKEND, SECRET_ENV, read_draft, secret_matches


def _engine_base():
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    return WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo


_Engine, _InitInfo, _UpdateInfo = _engine_base()


@dataclass
class DraftkitInitInfo(_InitInfo):
    """No rendezvous: the files are the transport."""


@dataclass
class DraftkitUpdateInfo(_UpdateInfo):
    directory: str  # a draft dir (speculators format) every worker can read
    secret: str = field(default="", repr=False)  # the server's DRAFTKIT_SWAP_SECRET: never logged


class DraftkitWeightTransferEngine(_Engine):
    init_info_cls = DraftkitInitInfo
    update_info_cls = DraftkitUpdateInfo
    supports_draft_weight_update = True

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self._secret = os.environ.get(SECRET_ENV, "")
        self._reloading = False

    def init_transfer_engine(self, init_info) -> None:
        pass

    def start_weight_update(self) -> None:
        self._reloading = False  # the reload starts in receive_weights, once the update checks

    def receive_weights(self, update_info: DraftkitUpdateInfo) -> None:
        import torch
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if not self._secret:
            raise PermissionError(f"draftkit update refused: this server was started without "
                                  f"{SECRET_ENV} in its environment; restart it with one")
        if not secret_matches(update_info.secret, self._secret):
            raise PermissionError(f"draftkit update refused: wrong or missing {SECRET_ENV}")
        tensors = read_draft(update_info.directory)  # before the model is touched
        if not self._reloading:
            initialize_layerwise_reload(self.model)
            self._reloading = True
        try:
            with torch.no_grad():
                self.model.load_weights(iter(tensors.items()))
        except BaseException:
            self._finish()  # layers that did not load get their old tensors back
            raise
        self.model.draftkit_path = os.path.realpath(update_info.directory)

    def update_weights(self, update_info: dict) -> None:
        import torch

        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # vLLM's engines sync here; a CPU has nothing to
            torch.accelerator.synchronize()

    def finish_weight_update(self) -> None:
        self._finish()

    def _finish(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if self._reloading:
            self._reloading = False
            finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass


def register() -> None:
    """Make backend "draftkit" known to vLLM's factory (idempotent; the plugin calls it)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "draftkit.serving.weight_transfer", "DraftkitWeightTransferEngine")
