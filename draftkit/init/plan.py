"""`draftkit plan RUN`: what a run will take on this machine before any work starts: tokens to
regenerate and harvest, hidden-state disk (train.mode=stored), memory for each stage, time per stage.

    draftkit plan runs/qwen3-8b-math-eagle3
    draftkit plan runs/qwen3-8b-math-eagle3 data.max_samples=2000    # what fewer samples cost

`draftkit init` prints the same plan, and when a stored harvest would not fit the free disk
(with FIT_MARGIN and FIT_HEADROOM) it writes `train.mode: online` instead and says why.

Every time is an ESTIMATE. Tokens: the prepared data's real counts once `prepare` ran, else the
recipe's sample counts x an assumed conversation length (PROMPT_TOKENS + ANSWER_FILL x
data.regen_max_new_tokens, capped by data.max_seq_len). Speeds: this device's measured matmul
FLOP/s and copy bandwidth (core/speed.py) times efficiencies: a `scripts/bench_scale.py`
result of this machine (results/bench_scale*.json, any random:<name> target of >= 50M params)
calibrates them; else the EFFICIENCY defaults below. A forward costs 2 x params FLOPs per
token, a training step 6 x the head's parameters per TTT step, a decode step of S sequences
max(weights / bandwidth, S x forward FLOPs / FLOP/s).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.core import artifacts, config, hardware, prepared_data, speed
from draftkit.core.config import RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.harvest.shards import DISK_FIXES, ID_BYTES, bytes_per_token
from draftkit.prepare.recipes import load_recipe

PROMPT_TOKENS = 150  # assumed templated prompt length before `prepare` counted the real ones
ANSWER_FILL = 0.75  # assumed share of data.regen_max_new_tokens a regenerated answer uses
RESPONSE_TOKENS = 400  # assumed dataset answer length without regeneration
FIT_MARGIN = 1.10  # a stored harvest fits when its bytes x this + FIT_HEADROOM <= free disk
FIT_HEADROOM = 2 << 30
# achieved share of the matmul FLOP/s (without a bench_scale calibration of this machine)
EFFICIENCY = {"forward": 0.5, "train": 0.3, "decode": 0.3, "harvest_vs_forward": 0.8}
MIN_CALIBRATION_PARAMS_B = 0.05  # smaller bench targets are overhead-bound: they calibrate nothing


@dataclass
class Plan:
    run: str
    target: str
    params_b: float
    device: str  # where the run computes, as `draftkit env` names it
    tokens_from: str  # 'prepared data' or the assumption used
    train_samples: int
    eval_samples: int
    tokens_per_sample: float
    regen_tokens: int
    harvest_tokens: int
    bytes_per_token: int  # hidden states + ids
    taps: list[int]
    disk_bytes: int  # the stored harvest
    disk_dir: str
    free_bytes: int
    fits: bool  # the stored harvest fits free disk with the margin
    mode: str  # train.mode
    memory: dict[str, int]  # stage -> bytes (estimates)
    memory_limit: int  # RAM (CPU) or the GPU's memory
    rates: dict[str, float]  # tokens/s per stage (estimates)
    rates_from: str
    seconds: dict[str, float]  # stage -> seconds (estimates)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- tokens


def _prepared(paths: artifacts.RunPaths, cfg: RunConfig) -> dict | None:
    """Real token counts of a prepared run (None before `prepare`)."""
    if not (paths.data / "train").is_dir():
        return None
    train = prepared_data.load_rows(paths.data, "train")
    ev = prepared_data.load_rows(paths.data, "eval")
    ev_lens = list(ev["length"]) if ev is not None else []
    if 0 < cfg.harvest.eval_sequences < len(ev_lens):
        ev_lens = ev_lens[:cfg.harvest.eval_sequences]
    lens = list(train["length"])
    return {"train": len(lens), "eval": len(ev_lens), "tokens": sum(lens) + sum(ev_lens),
            "regen": 0, "from": "prepared data (regeneration done)"}


def _assumed(cfg: RunConfig) -> dict:
    """Token counts from the recipe's sample counts and an assumed conversation length."""
    d = cfg.data
    recipe = load_recipe(d.recipe)
    train = d.max_samples or recipe.max_samples
    ev = d.eval_samples or recipe.eval_samples
    if d.source == "local":  # the shipped/generated samples bound what prepare can take
        train = min(train, _local_rows(recipe, recipe.sources))
        ev = min(ev, _local_rows(recipe, [recipe.eval] if recipe.eval else []))
    train = (train + d.self_instruct) * (1 + d.substitute_copies)
    ev_h = min(ev, cfg.harvest.eval_sequences) if cfg.harvest.eval_sequences else ev
    answer = ANSWER_FILL * d.regen_max_new_tokens if d.regenerate else RESPONSE_TOKENS
    per = min(d.max_seq_len, PROMPT_TOKENS + answer)
    why = (f"assumed {per:.0f} tokens per conversation: {PROMPT_TOKENS}-token prompts + "
           + (f"{ANSWER_FILL:.0%} of data.regen_max_new_tokens={d.regen_max_new_tokens}"
              if d.regenerate else f"{RESPONSE_TOKENS}-token dataset answers")
           + f", at most data.max_seq_len={d.max_seq_len}")
    regen = int((train + ev) * (per - PROMPT_TOKENS)) if d.regenerate else 0
    return {"train": train, "eval": ev_h, "tokens": int((train + ev_h) * per), "regen": regen,
            "from": why, "per": per}


def _local_rows(recipe, sources: list) -> int:
    """Rows the local sample of `sources` holds: mathgen counts, local JSONL/Parquet rows."""
    n = 0
    for src in sources:
        files = [*src.files, *(src.local.files if src.local else [])]
        n += src.local.count if src.local and src.local.mathgen else 0
        for f in map(recipe.resolve, files):
            if f.suffix == ".parquet":
                import pyarrow.parquet as pq  # the prepare stack's (datasets) own dependency

                n += pq.ParquetFile(f).metadata.num_rows
            elif f.is_file():
                with open(f, "rb") as fh:
                    n += sum(1 for line in fh if line.strip())
    return n


# ----------------------------------------------------------------------------- shapes


def head_params(cfg: RunConfig) -> tuple[float, float]:
    """(trained params, frozen embedding params) of an EAGLE-3-shaped head: fc over the taps,
    one decoder layer per draft.num_layers, lm_head over the draft vocab."""
    d, t = cfg.draft, cfg.target
    h, heads, kv = d.hidden_size or t.hidden_size, d.num_attention_heads, d.num_key_value_heads
    hd = d.head_dim or (h // max(heads, 1))
    layer = 2 * h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * d.intermediate_size
    fc = len(d.aux_layer_ids) * t.hidden_size * h
    return fc + max(1, d.num_layers) * layer + h * d.draft_vocab_size, t.vocab_size * h


def _train_flops(cfg: RunConfig) -> float:
    """FLOPs per token of a training step: fc once, layer + lm_head per TTT step, x6."""
    trained, _ = head_params(cfg)
    d = cfg.draft
    fc = len(d.aux_layer_ids) * cfg.target.hidden_size * d.hidden_size
    return max(1.0, 6 * (fc + cfg.train.ttt_steps * (trained - fc)))


def _forward_flops(cfg: RunConfig, seq: float) -> float:
    """FLOPs per token of a target forward at mean length `seq` (attention over seq/2 keys)."""
    t = cfg.target
    attn = 4 * t.num_hidden_layers * (seq / 2) * t.num_attention_heads * (
        t.head_dim or t.hidden_size // max(t.num_attention_heads, 1))
    return max(1.0, 2 * t.params_b * 1e9 + attn)


# ----------------------------------------------------------------------------- speeds


def _calibration(hw: hardware.Hardware, device: str, dirs: list[Path]) -> tuple[dict, str]:
    """Efficiencies measured by scripts/bench_scale.py on this machine, where one exists."""
    for d in dirs:
        for path in sorted(Path(d).glob("bench_scale*.json")):
            try:
                res = artifacts.read_json(path)
                same = res["hardware"]["device"] == device and (
                    res["hardware"].get("cuda_name") == hw.cuda_name if device == "cuda"
                    else res["hardware"]["cpu_model"] == hw.cpu_model)
                if not same or res["target_params_b"] < MIN_CALIBRATION_PARAMS_B:
                    continue
                peak = speed.flops(speed.machine_speed(device, hw), res["dtypes"]["target"])
                fwd = res["bare_forward"]["tokens_per_s"] * 2 * res["target_params_b"] * 1e9
                train = res["train"]["tokens_per_s"] * 6 * res["head_trainable_params_m"] * 1e6 * (
                    res["ttt_steps"])
                return ({"forward": fwd / peak, "train": train / peak,
                         "decode": EFFICIENCY["decode"],
                         "harvest_vs_forward": res["harvest_vs_bare"]},
                        f"{path.name} ({res['target']}) calibrates this machine")
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return dict(EFFICIENCY), "default efficiencies (no scripts/bench_scale.py result of this machine)"


def rates(cfg: RunConfig, seq: float, results_dirs: list[Path] | None = None,
          hw: hardware.Hardware | None = None) -> tuple[dict, str]:
    """Estimated tokens/s of each stage on this machine, and where the figures come from."""
    hw = hw or hardware.detect()
    dev = hw.device if cfg.train.device == "auto" else cfg.train.device
    sp = speed.machine_speed(dev, hw)
    eff, source = _calibration(hw, dev, results_dirs or [])
    fwd_dtype = hardware.resolve(cfg.target.dtype, dev, hw)
    fwd_fl = _forward_flops(cfg, seq)
    forward = speed.flops(sp, fwd_dtype) * eff["forward"] / fwd_fl
    train = speed.flops(sp, hardware.resolve(cfg.train.dtype, dev, hw)) * eff["train"] / (
        _train_flops(cfg))
    regen_dtype = hardware.resolve(cfg.data.regen_dtype, dev, hw)
    seqs = max(1, min(256, cfg.data.regen_batch_size))
    weights = cfg.target.params_b * 1e9 * hardware.TORCH_DTYPES[regen_dtype].itemsize
    step = max(weights / sp["bandwidth"],
               seqs * fwd_fl / (speed.flops(sp, regen_dtype) * eff["decode"]))
    out = {"forward": forward, "harvest": forward * eff["harvest_vs_forward"], "train": train,
           "online": 1 / (1 / forward + 1 / train), "regenerate": seqs / step}
    gflops = speed.flops(sp, fwd_dtype) / 1e9
    return out, (f"{dev} matmul {gflops:,.0f} GFLOP/s ({fwd_dtype}), copy "
                 f"{sp['bandwidth'] / 1e9:,.0f} GB/s, measured; {source}")


# ----------------------------------------------------------------------------- memory, disk


def memory(cfg: RunConfig, bytes_per_token: int) -> dict[str, int]:
    """Peak bytes per stage (estimates): weights, optimizer state, activations of a batch."""
    t, tr = cfg.target, cfg.train
    dt = hardware.TORCH_DTYPES[hardware.resolve(t.dtype)].itemsize
    weights = t.params_b * 1e9 * dt
    act_fwd = cfg.harvest.batch_tokens * (4 * t.hidden_size + 2 * t.intermediate_size) * dt
    trained, frozen = head_params(cfg)
    head = trained * 16 + frozen * 4  # fp32 weights, grads, AdamW m and v; frozen embedding
    logits = tr.ttt_steps * cfg.draft.draft_vocab_size * 4 * 3  # logits, softmax, grad (fp32)
    layer = tr.ttt_steps * cfg.draft.hidden_size * 4 * 24
    act_train = tr.batch_tokens * (logits + layer + (len(cfg.draft.aux_layer_ids) + 1)
                                   * t.hidden_size * 4)
    act_online = tr.batch_tokens * (4 * t.hidden_size + 2 * t.intermediate_size) * dt
    return {"harvest": int(weights + act_fwd + cfg.harvest.shard_tokens * bytes_per_token * 2),
            "stored train": int(head + act_train),
            "online train": int(weights + head + act_train + act_online)}


def memory_limit(device: str) -> int:
    """Bytes of the device's memory: the GPU's, or this machine's RAM."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fits(disk_bytes: int, free: int) -> bool:
    """A stored harvest of `disk_bytes` fits `free` bytes with the margin."""
    return disk_bytes * FIT_MARGIN + FIT_HEADROOM <= free


# ----------------------------------------------------------------------------- the plan


def make(cfg: RunConfig, paths: artifacts.RunPaths, results_dirs: list[Path] | None = None,
         hw: hardware.Hardware | None = None) -> Plan:
    """The plan of run `cfg` whose artifacts live at `paths` (the run dir may not exist yet)."""
    hw = hw or hardware.detect()
    counts = _prepared(paths, cfg) or _assumed(cfg)
    samples = counts["train"] + counts["eval"]
    per = counts.get("per") or counts["tokens"] / max(samples, 1)
    bpt = bytes_per_token(len(cfg.draft.aux_layer_ids), cfg.target.hidden_size,
                          cfg.harvest.dtype) + ID_BYTES
    disk = counts["tokens"] * bpt
    free, _measured = artifacts.free_disk(paths.harvest)
    r, source = rates(cfg, per, results_dirs, hw)
    tr = cfg.train
    train_tokens = counts["tokens"] * tr.epochs
    if tr.max_steps:
        train_tokens = min(train_tokens, tr.max_steps * tr.batch_tokens * tr.grad_accum)
    dev = hw.device if tr.device == "auto" else tr.device
    seconds = {"regenerate": counts["regen"] / r["regenerate"],
               "harvest": counts["tokens"] / r["harvest"], "train": train_tokens / r["train"],
               "online train": train_tokens / r["online"]}
    return Plan(run=cfg.name, target=cfg.target.name, params_b=cfg.target.params_b, device=dev,
                tokens_from=counts["from"], train_samples=counts["train"],
                eval_samples=counts["eval"], tokens_per_sample=per,
                regen_tokens=counts["regen"], harvest_tokens=counts["tokens"],
                bytes_per_token=bpt, taps=list(cfg.draft.aux_layer_ids), disk_bytes=disk,
                disk_dir=str(paths.harvest), free_bytes=free, fits=fits(disk, free), mode=tr.mode,
                memory=memory(cfg, bpt), memory_limit=memory_limit(dev), rates=r,
                rates_from=source, seconds=seconds)


def choose_mode(cfg: RunConfig, p: Plan) -> bool:
    """Switch `cfg` (and `p`) to online training when its stored harvest does not fit the
    disk; False when nothing changed (already online, it fits, the kind trains from stored shards only)."""
    if cfg.train.mode != "stored" or p.fits:
        return False
    cfg.train.mode = "online"
    try:
        kinds.of(cfg).check_train(cfg)
    except DraftkitError:
        cfg.train.mode = "stored"
        return False
    p.mode = "online"
    return True


def plan_run(run_dir: str | Path, overrides: list[str] | None = None,
             results_dirs: list[Path] | None = None) -> Plan:
    """The plan of the run at `run_dir` (its config after `overrides`)."""
    run = config.open_run(run_dir, overrides)
    return make(run.cfg, run.paths, results_dirs if results_dirs is not None else [Path("results")])


# ----------------------------------------------------------------------------- rendering


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def _hours(s: float) -> str:
    return f"{s / 3600:,.1f} h" if s >= 3600 else f"{s / 60:,.1f} min" if s >= 60 else f"{s:.0f} s"


def render(p: Plan) -> str:
    m = p.memory
    stored = p.seconds["harvest"] + p.seconds["train"]
    lines = [
        f"plan for {p.run}: target {p.target} ({p.params_b:g}B params) on {p.device} "
        "- an ESTIMATE",
        f"  data        {p.train_samples:,} train + {p.eval_samples:,} eval conversations, "
        f"~{p.tokens_per_sample:,.0f} tokens each ({p.tokens_from})",
        f"  regenerate  {p.regen_tokens:,} tokens written by the target (vLLM)",
        f"  harvest     {p.harvest_tokens:,} tokens x {p.bytes_per_token:,} B (taps {p.taps} + "
        f"last state, x hidden size x storage dtype, + ids) = {_size(p.disk_bytes)}",
        f"  disk        {_size(p.free_bytes)} free at {p.disk_dir}: stored harvest "
        + ("fits" if p.fits else f"does NOT fit (needs x{FIT_MARGIN} + {_size(FIT_HEADROOM)})"),
        f"  memory      harvest {_size(m['harvest'])}, stored train {_size(m['stored train'])}"
        f", online train {_size(m['online train'])} (this {p.device} has "
        f"{_size(p.memory_limit)})",
        f"  time        regenerate {_hours(p.seconds['regenerate'])}; stored: harvest "
        f"{_hours(p.seconds['harvest'])} + train {_hours(p.seconds['train'])} = "
        f"{_hours(stored)}; online train {_hours(p.seconds['online train'])}",
        "  speeds      " + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in p.rates.items()),
        f"              from {p.rates_from}",
        f"  mode        train.mode={p.mode}",
    ]
    lines += [f"  note        {n}" for n in p.notes]
    if not p.fits and p.mode == "online":
        lines.append(f"  note        online: a stored harvest would need {_size(p.disk_bytes)} "
                     f"and {p.disk_dir} has {_size(p.free_bytes)} free (init picks online then; "
                     "harvest.dir=PATH on a larger disk and train.mode=stored go back)")
    if not p.fits and p.mode == "stored":
        lines.append("  note        a stored harvest would fill the disk: " + DISK_FIXES)
    if m["online train"] > p.memory_limit and p.mode == "online":
        lines.append("  note        online training needs more memory than this device has: "
                     "lower train.batch_tokens, or train on a larger device")
    return "\n".join(lines)
