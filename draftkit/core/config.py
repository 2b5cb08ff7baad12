"""The one home for defaults: run-config dataclasses, YAML load/save and `key=value` overrides.

A run is described by one `draftkit.yaml` (a `RunConfig`), written fully resolved by `init`
and read by every later stage. Unknown keys and wrong types are errors that name the key.
Templates in `configs/` are partial YAML layered over these defaults before `init` derives
the target-dependent fields (aux ids, draft vocab, draft decoder shapes, optimizer scale).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from draftkit.core.artifacts import RunPaths
from draftkit.core.errors import DraftkitError

CONFIG_NAME = "draftkit.yaml"


class ConfigError(DraftkitError, ValueError):
    """A config file or override that does not fit the schema; the message names the key."""


@dataclass
class TargetConfig:
    name: str = "smollm2-135m"  # registry name, hub id or local HF dir
    hub_id: str = ""  # resolved Hugging Face id ('' for in-process/local targets)
    revision: str = "main"  # hub revision recorded in every artifact's provenance
    source: str = "hub"  # hub | gguf | random | local (see registry.py)
    family: str = "llama"  # decoder family: llama | qwen3
    architecture: str = "LlamaForCausalLM"
    num_hidden_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    max_position_embeddings: int = 0
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    params_b: float = 0.0  # parameter count in billions
    dtype: str = "auto"  # forward dtype; auto = native bf16 (CUDA, AVX512-BF16/AMX) else fp32


DEFAULT_KIND = "eagle3"  # the draft kind of a run that names none (init --draft, a bare draft dir)


@dataclass
class DraftConfig:
    kind: str = DEFAULT_KIND  # a kind of drafts/kind.py: eagle3 | draft-lm | peagle | pard | dflash
    num_speculative_tokens: int = 3  # k; 3 was best in the NeMo-RL study
    # how vLLM drafts at T > 0 (its speculative_config.draft_sample_method): greedy (vLLM's
    # default) = the draft's argmax, accepted with the target's p(x); probabilistic = sampled
    # from the draft, accepted with sum min(p, q): +0.15-0.25 AL at T=1 on the demo's head
    # (scripts/bench_draft_sampling.py). Lossless both; at T = 0 both draft the argmax.
    draft_sample_method: str = "probabilistic"
    aux_layer_ids: list[int] = field(default_factory=list)  # vLLM convention; [] = [2, N//2, N-3]
    draft_vocab_size: int = 0  # 0 = derived from the target vocab (see registry.draft_vocab_rule)
    # The single decoder layer (speculators `transformer_layer_config`), derived from the target.
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    # Norm flags, written explicitly at export (vLLM defaults norm_before_residual to true).
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    model: str = ""  # draft-lm only: registry name or path of the small LM
    # draft-lm only: how the small LM starts. sibling = draft.model (a smaller model with the
    # target's tokenizer); truncate = the target's first `num_layers` decoder layers + final
    # norm, embedding, lm_head; scratch = random weights in the target's architecture with
    # `num_layers` layers and the widths above. '' = sibling where the registry has one.
    init: str = ""
    # decoder layers. draft-lm truncate/scratch: 0 = max(2, N // 5). eagle3: 0 = 1 (EAGLE-3's
    # one layer); more stack plain decoder layers on it (vLLM serves them: llama_eagle3.py)
    num_layers: int = 0
    # eagle3 only: start the decoder layer from target layer n instead of random weights
    # (negative counts from the end: -3 = layer N-3, the one the default last aux state enters);
    # layer i of a multi-layer head from target layer n+i. null = random. How the weights map:
    # drafts/eagle_family/init_layer.py
    init_layer_from: int | None = None
    # eagle3 only: a new head's final norm starts from the target's final norm, the norm its
    # lm_head rows (copied from the target) were trained behind; false = ones
    init_norm_from_target: bool = False


@dataclass
class DataConfig:
    recipe: str = "math"  # data_recipes/<recipe>.yaml
    # hub = the recipe's HF datasets; local = its shipped/generated sample, no download
    # (was `offline`, still read: RENAMED)
    source: str = "hub"
    max_samples: int = 0  # 0 = the recipe's own limit
    eval_samples: int = 0  # 0 = the recipe's own held-out size
    seed: int = 0
    system_prompt: str = ""  # '' = the recipe's (or the chat template's default)
    max_seq_len: int = 1024  # tokens per conversation after templating; longer are truncated
    regenerate: bool = True  # rewrite assistant turns with the target
    regen_engine: str = "vllm"  # vllm | hf
    regen_temperature: float = 1.0  # RL samples at T~1
    regen_top_p: float = 1.0
    regen_max_new_tokens: int = 512
    regen_batch_size: int = 64  # prompts per engine call (also the resume granularity)
    regen_dtype: str = "auto"  # vLLM dtype for regeneration and self-instruct (auto: hardware.py)
    self_instruct: int = 0  # target-written prompts (Magpie-style) added to TRAIN before regen
    self_instruct_temperature: float = 1.0  # sampling temperature for target-written prompts
    # per train conversation, copies with its rare question words replaced (answers too) by
    # other rare words, so the head learns to copy words from the question (substitute.py)
    substitute_copies: int = 0
    substitute_max_df: float = 0.03  # "rare": in at most this share of the train questions


@dataclass
class HarvestConfig:
    shard_tokens: int = 16384  # tokens per safetensors shard
    batch_tokens: int = 8192  # tokens per target forward (packed by length)
    dtype: str = "bfloat16"  # dtype of the stored hidden states, as readers get them back
    # '' = stored in `dtype` as is; fp8 = e4m3 with a float32 scale per token and layer,
    # quantised on the device: about half the bytes of bf16 (harvest/encode.py)
    storage_dtype: str = ""
    # how sequences of different lengths share a forward (harvest/stage.py):
    # equal = only equal lengths share one, so stored states are bit-identical to each
    #   sequence's own forward (on real chat data most forwards then hold one sequence);
    # pad = length-sorted padded batches; varlen = sequences concatenated into rows of up to
    #   batch_tokens, positions restarting per sequence, attention kept within each (no
    #   padding); both within fp32 noise of `equal`; auto = varlen on CUDA, equal on the CPU
    packing: str = "auto"
    writers: int = 4  # writer threads (each holds one shard in host memory while it writes)
    eval_sequences: int = 256  # first N prepared eval sequences harvested into harvest/eval (0 = all)
    # where the shards go: '' = <run>/harvest; a path (relative to the cwd) on a larger disk.
    # Harvest refuses to start when the shards it still has to write exceed that disk's free
    # space; `draftkit plan RUN` shows the bytes (init/plan.py)
    dir: str = ""


@dataclass
class TrainConfig:
    # stored = from the harvest's stored shards; online = the target in the loop (no shards)
    # (was `offline`, still read: RENAMED)
    mode: str = "stored"
    ttt_steps: int = 3  # training-time-test unroll depth
    ttt_decay: float = 0.8  # loss weight of step i is decay**i
    # positions the draft learns to predict: assistant = assistant tokens only (loss_mask);
    # all = every token whose target hidden state was harvested, prompt tokens included.
    # Eval (simulated AL, best checkpoint) always counts assistant tokens only.
    loss_on: str = "assistant"
    # EAGLE-3 training-only augmentation (EAGLE's feature noise): the target's aux features get
    # Gaussian noise of this std relative to each aux layer's per-token RMS; 0 = off. A head
    # trained on few conversations meets features at draft time it never saw exactly.
    feature_noise: float = 0.0
    # EAGLE-3 only: keep the head's final norm and lm_head fixed at their start values (the
    # target's, with draft.init_norm_from_target): the layer learns to write the target's
    # final-hidden space and 2.4M fewer weights fit the few conversations
    freeze_head: bool = False
    epochs: int = 4
    max_steps: int = 0  # 0 = epochs decide
    # stop once training has used this many CPU-seconds (process CPU time of the loop's own
    # steps, all threads; evals and checkpoints not counted); 0 = no limit. The lr schedule
    # still follows epochs / max_steps. Resumes count the seconds already spent.
    max_cpu_seconds: float = 0.0
    batch_tokens: int = 8192  # tokens per micro-batch (sequences packed by length)
    # a micro-batch's T is rounded up to a multiple of this, one length bucket per batch, so
    # an epoch has <= 2 batch shapes per bucket and bf16 CPU training's per-shape kernel
    # caches stop growing with the harvest (masks keep the padding out of the loss); 1 = off
    pad_multiple: int = 64
    grad_accum: int = 1
    num_workers: int = 1  # stored: DataLoader processes reading shards ahead (0 = in-process)
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_grad_norm: float = 0.5
    eval_every: int = 100  # optimizer steps
    save_every: int = 100
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # autocast dtype; auto = native bf16 (CUDA, AVX512-BF16/AMX) else fp32
    # torch.compile the draft's elementwise-heavy parts (its RMSNorms and MLPs; a draft LM's
    # decoder layers) into fused kernels. Off by default: not yet measured to pay for its
    # compile time on any machine (measure with benchmarks/cost/train_step.py first)
    compile: bool = False
    # warm start: a speculators-format head (train/best, a checkpoint, an export, or a run dir =
    # its train/best); its weights AND its draft vocab are the starting point (refresh jobs).
    # draft-lm: a trained draft LM's HF dir (the same places), instead of draft.init
    init_from: str = ""
    # the divergence every kind learns the target's distribution p by (drafts/divergence.py;
    # refresh fine-tunes with it too): kl = forward KL(p || q), as EAGLE-3; tv = total
    # variation 1/2 sum|p - q| = 1 - sum min(p, q), one minus the expected acceptance of a
    # draft token at T=1 with probabilistic drafting; mix = (1 - loss_mix) * kl + loss_mix * tv.
    # kl here; the EAGLE-3 and P-EAGLE templates (configs/eagle3.yaml, peagle.yaml) set mix, the
    # best at T=1 in results/bench_sampling_ab.md; the other kinds were not measured with it
    loss: str = "kl"
    loss_mix: float = 0.5  # train.loss=mix only: the weight of tv, in [0, 1]
    # draft-lm only: loss = (1 - ce_weight) * train.loss's divergence over the full vocab
    # + ce_weight * cross-entropy on the data's next token (hard labels)
    ce_weight: float = 0.0
    # more stored train data: other runs (same target and aux layer ids) whose harvest joins
    # this run's train shards and whose token counts join the draft vocab; eval stays this run's
    extra_runs: list[str] = field(default_factory=list)

    def check(self) -> None:
        """The loss options (ConfigError naming the key and the choices)."""
        check_loss(self.loss, self.loss_mix)


LOSSES = ("kl", "tv", "mix")  # train.loss: what drafts/divergence.py computes for each


def check_loss(name: str, mix: float) -> None:
    """train.loss names a known divergence and train.loss_mix is a weight in [0, 1]."""
    if name not in LOSSES:
        raise ConfigError(f"train.loss={name!r} is not a known loss; choose one of "
                          f"{', '.join(LOSSES)}")
    if not 0.0 <= mix <= 1.0:
        raise ConfigError(f"train.loss_mix={mix} must be in [0, 1] (the weight of tv in "
                          "train.loss=mix)")


@dataclass
class EvalConfig:
    engine: str = "vllm"  # reference | vllm | both
    k_values: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    # rollouts run at T=1 in large batches: the serving choice must hold at each of these
    # (eval/choice.py); a batch needs as many eval prompts (eval.num_prompts)
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 16, 32])
    num_prompts: int = 32  # eval prompts from the recipe's held-out split
    max_new_tokens: int = 256
    dtype: str = "auto"  # vLLM dtype for measurements (auto: hardware.py)
    seed: int = 0
    reference_prompts: int = 4  # prompts the torch reference decoder runs (no KV cache: slow)
    lossless_prompts: int = 0  # prompts of the fp32 greedy lossless check (0 = every eval prompt)
    # prompts of the batch-1 rows (0 = every eval prompt): one sequence at a time, the costliest
    # rows of a CPU eval; larger batches and eval.splits keep eval.num_prompts
    latency_prompts: int = 0
    # more prompt splits (eval/splits.py: seen-templates, hand-written), each measured by the
    # same engines at the largest eval batch; [] = the run's held-out split only
    splits: list[str] = field(default_factory=list)
    # where the report eval-<run>-<time>.{json,md,png} goes: '' = the run's own eval/ dir;
    # a path (relative to the cwd) writes the files there, and the run's eval/ keeps json + md
    results_dir: str = ""
    # the method and k to serve per batch size (eval/choice.py -> <run>/eval/choice.json, then
    # the export's serving.json): within this fraction of the fastest, the simplest method wins
    choice_margin: float = 0.02
    # the temperature whose speed decides among the methods no slower than no speculation at
    # every eval temperature (RL samples rollouts at T=1); unmeasured: the lowest speedup over T
    choice_temperature: float = 1.0
    # other runs with an export (e.g. a DFlash run trained from this run's harvest), measured
    # by the same engines' grid beside this run's draft, rows named by their kind's method;
    # reported only: the serving choice and serving.json stay this run's export's
    compare_runs: list[str] = field(default_factory=list)
    # where the draft's AL (tokens per target step) falls below this in any measured row, the
    # report links `draftkit diagnose RUN` (eval/diagnose.py: why, ranked, with fixes); 0 = never
    diagnose_below: float = 1.5


@dataclass
class ExportConfig:
    out: str = ""  # '' = <run>/export
    check: bool = True  # load the export in vLLM and compare AL with the simulated AL
    check_prompts: int = 16
    al_gap_warn: float = 0.5  # warn when |vLLM AL - simulated AL| exceeds this


@dataclass
class EngineConfig:
    """Every vLLM engine draftkit starts (regeneration, eval, export's check, refresh probes,
    RL rollouts); `auto`/0 resolve on this machine in core/engine_settings.py (`draftkit env`)."""
    # 0 = auto: 1 on a CPU; on GPUs the fewest that hold the target's weights with room for KV
    tensor_parallel_size: int = 0
    data_parallel_size: int = 1  # regeneration only: engine replicas (vLLM data parallel, GPUs)
    # auto = CUDA graphs on CUDA; on a CPU eager unless measured faster compiled; true | false
    enforce_eager: bool | str = "auto"
    gpu_memory_utilization: float = 0.0  # 0 = vLLM's default (0.9); GPUs only
    max_num_seqs: int = 0  # 0 = each use's own (regeneration: data.regen_batch_size up to 256)
    # VLLM_CPU_OMP_THREADS_BIND: auto = measured (scripts/bench_cpu_bind.py --record), else
    # vLLM's default, which keeps one core for its frontend; vllm | all (every core) | a mask
    cpu_threads_bind: str = "auto"


@dataclass
class TrackingConfig:
    backend: str = "wandb"  # wandb | none
    project: str = "draftkit"
    mode: str = "auto"  # auto = online with WANDB_API_KEY, else offline
    log_every: int = 10


@dataclass
class RefreshConfig:
    """`draftkit refresh` / `watch` / `DraftRefresher` (draftkit/rl/)."""
    replay: int = 0  # rows of older rollouts (from earlier refreshes' lineage) mixed in
    budget_steps: int = 100  # optimizer steps per refresh (0 = budget_s decides)
    budget_s: float = 0.0  # wall-clock seconds per refresh (0 = budget_steps decides)
    lr: float = 1e-4  # constant fine-tune lr (warm start: small; verl co-training uses 1e-5)
    batch_tokens: int = 4096  # tokens per fine-tune micro-batch (sequences packed by length)
    heldout_fraction: float = 0.2  # share of the new rollouts held out for before/after AL
    min_gain: float = 0.0  # publish only if AL after > AL before + min_gain
    temperature: float = 0.0  # the AL that decides publishing: T=0 (argmax) or T>0 (p/q rule)
    draft_sampling: str = "greedy"  # greedy = vLLM's default draft_sample_method | probabilistic
    max_seq_len: int = 2048  # rollout tokens kept per row (longer rows are cut)
    # how the policy's features on the train + replay rows are held during the fine-tune:
    # online = in RAM (fast, no disk); harvest = written once as shards (harvest.dtype,
    # harvest.shard_tokens) under drafts/.capture/<job>/ and streamed back: for rollout sets
    # that do not fit in RAM, and a crashed job reuses the finished capture (rl/capture.py)
    capture: str = "online"
    seed: int = 0
    every: int = 0  # watch/DraftRefresher: refresh every N policy steps (0 = off)
    al_drop: float = 0.0  # ... or when AL < (1 - al_drop) * AL right after the last refresh
    probe_prompts: int = 8  # swap health check: prompts generated at T=0 after a swap
    probe_max_tokens: int = 64  # tokens per probe completion; at least k + 2
    min_probe_al: float = 1.2  # swap health check: engine AL on the probes must exceed this
    # swap health check: a probe that measured fewer draft steps (a k-schedule that drafts
    # nothing at that batch, a saturated engine) decides nothing (verdict error), never failed
    min_probe_drafts: int = 8
    engine_timeout_s: float = 120.0  # rollout servers: seconds one HTTP call may take (swap, probes)
    status_timeout_s: float = 5.0  # `draftkit status`: seconds each engine may take to answer
    poll_s: float = 10.0  # watch: seconds between scans of the checkpoint/rollout dirs
    # the gate: publish only with at least this many held-out draft starts (response positions
    # where a draft of k begins, as drift.estimate counts them); fewer = "undecided"
    min_heldout_starts: int = 64
    # true = publish only if held-out AL rose by > min_gain (the product); false = publish
    # every finished job unjudged (smoke tests and benchmarks; the lineage and the log say so)
    gate: bool = True
    # watch: a rollout file without a NAME.jsonl.done marker is used only once it has not
    # changed for this many seconds (a safety net: writers should rename into place)
    rollout_settle_s: float = 30.0

    def check(self, k: int = 1) -> None:
        """Ranges a gate needs to mean something (ConfigError naming the key and the fix); `k`:
        the draft's num_speculative_tokens (a probe shorter than k + 2 tokens drafts nothing)."""
        problems = self._swap_problems(k)
        if not self.min_gain >= 0:
            problems.append(f"refresh.min_gain={self.min_gain} must be >= 0 (a negative gain "
                            "publishes worse drafts; to publish unjudged, set refresh.gate=false)")
        if not self.min_probe_al > 1.0:
            problems.append(f"refresh.min_probe_al={self.min_probe_al} must be > 1.0 (AL 1.0 "
                            "is a draft that never gets a token accepted)")
        if not 0.0 < self.heldout_fraction < 1.0:
            problems.append(f"refresh.heldout_fraction={self.heldout_fraction} must be in (0, "
                            "1): some prompts train, the others judge (e.g. 0.2)")
        if self.min_heldout_starts < 1:
            problems.append(f"refresh.min_heldout_starts={self.min_heldout_starts} must be "
                            ">= 1 (e.g. 64)")
        if self.rollout_settle_s < 0:
            problems.append(f"refresh.rollout_settle_s={self.rollout_settle_s} must be >= 0")
        if problems:
            raise ConfigError("; ".join(problems))

    def _swap_problems(self, k: int) -> list[str]:
        """The swap check's and the watch's numbers: finite, positive, a probe that can draft."""
        problems = []
        for key in ("engine_timeout_s", "poll_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"refresh.{key}={value} must be a finite number > 0")
        for key in ("probe_prompts", "min_probe_drafts"):
            if getattr(self, key) < 1:
                problems.append(f"refresh.{key}={getattr(self, key)} must be >= 1")
        if self.probe_max_tokens < k + 2:
            problems.append(f"refresh.probe_max_tokens={self.probe_max_tokens} must be >= k + 2 "
                            f"= {k + 2} (draft.num_speculative_tokens={k}): a shorter probe "
                            "drafts nothing, and a probe that measured nothing decides nothing")
        if not math.isfinite(self.min_probe_al):
            problems.append(f"refresh.min_probe_al={self.min_probe_al} must be finite")
        return problems


@dataclass
class RunConfig:
    name: str = "run"
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    harvest: HarvestConfig = field(default_factory=HarvestConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    refresh: RefreshConfig = field(default_factory=RefreshConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- typed merge


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_value(key: str, tp: Any, value: Any) -> Any:
    """Return `value` coerced to `tp` (int->float only) or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _check_value(key, opt, value)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"config key {key!r} must be a list, got {value!r}")
        return [_check_value(f"{key}[{i}]", item_tp, v) for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} must be a mapping, got {value!r}")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"config key {key!r} must be true/false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config key {key!r} must be an integer, got {value!r}")
    if tp in (str, float) and not isinstance(value, tp):
        raise ConfigError(f"config key {key!r} must be a {tp.__name__}, got {value!r}")
    return value


# Values renamed so that "offline" means one thing (no network: HF_HUB_OFFLINE): {key: {old:
# new}}. The old value still works for one release and prints one deprecation line per process.
RENAMED = {"data.source": {"offline": "local"}, "train.mode": {"offline": "stored"}}
_warned: set[tuple[str, str]] = set()


def renamed(key: str, value: Any) -> Any:
    """`value` of config key `key` under its current name (RENAMED), with a deprecation line."""
    new = RENAMED.get(key, {}).get(value) if isinstance(value, str) else None
    if new is None:
        return value
    if (key, value) not in _warned:
        _warned.add((key, value))
        print(f"draftkit: {key}={value} is deprecated, use {key}={new} (the same meaning; "
              f"'offline' now means only no network); the old name goes in the next release",
              file=sys.stderr)
    return new


def merge(obj: Any, data: dict, prefix: str = "") -> Any:
    """Apply a nested dict onto dataclass `obj` in place, validating keys and types."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping")
    hints = _hints(type(obj))
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in hints:
            valid = ", ".join(hints)
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {valid}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            merge(current, value, prefix=f"{full}.")
        else:
            setattr(obj, key, _check_value(full, hints[key], renamed(full, value)))
    return obj


def parse_overrides(items: list[str]) -> dict:
    """['train.lr=1e-4', 'eval.k_values=[1,3]'] -> nested dict (values parsed as YAML)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.lr=1e-4)")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        if isinstance(value, str) and _looks_numeric(raw):
            value = float(raw)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def _looks_numeric(raw: str) -> bool:
    try:
        float(raw)
        return True
    except ValueError:
        return False


def deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v
    return base


def from_dict(data: dict) -> RunConfig:
    return merge(RunConfig(), data)


def load(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a run config (a file or a run dir holding draftkit.yaml) plus overrides."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(
            f"no run config at {path}; create one with `draftkit init --target NAME --data RECIPE`"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    cfg = from_dict(data)
    if overrides:
        merge(cfg, parse_overrides(overrides))
    cfg.train.check()
    cfg.refresh.check(cfg.draft.num_speculative_tokens)
    return cfg


def dump(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None)


def run_dir_of(path: str | Path) -> Path:
    """Run directory for a run path given on the command line (dir or its draftkit.yaml)."""
    path = Path(path)
    return path.parent if path.name == CONFIG_NAME else path


@dataclass
class Run:
    """One resolved run: its config (overrides applied) and where its artifacts live. A stage's
    entry point builds it once with `open_run` and passes it down."""
    cfg: RunConfig
    paths: RunPaths

    @property
    def export_dir(self) -> Path:
        """Where the run's export lives: export.out, default <run>/export."""
        return Path(self.cfg.export.out).expanduser() if self.cfg.export.out else self.paths.export


def run_paths(path: str | Path) -> RunPaths:
    """Where the artifacts of the run at `path` live, its config's harvest.dir honoured (a dir
    without a run config gets the default layout)."""
    run_dir = run_dir_of(path)
    if not (run_dir / CONFIG_NAME).is_file():
        return RunPaths(run_dir)
    return RunPaths(run_dir, harvest_dir=load(run_dir).harvest.dir or None)


def open_run(path: str | Path, overrides: list[str] | None = None) -> Run:
    """The run at `path` (its dir or its draftkit.yaml) with `key=value` overrides applied."""
    run_dir = run_dir_of(path)
    cfg = load(run_dir, overrides)
    return Run(cfg, RunPaths(run_dir, harvest_dir=cfg.harvest.dir or None))
