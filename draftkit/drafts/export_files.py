"""What every kind's export writes beside its weights, kind-neutral: speculative_config.json
(the run's draft as its kind serves it, `run_speculative_config`) and README.md, both through
`write_serving_files`; the README's serving snippets (vLLM, NeMo-RL, verl) for that config, and
optional JSON reads.
"""

from __future__ import annotations

from pathlib import Path

from draftkit.core import artifacts
from draftkit.drafts import kind as kinds


def read_json(path: Path) -> dict:
    """A JSON file's dict, {} when there is no such file."""
    return artifacts.read_json(path) if path.is_file() else {}


def run_speculative_config(cfg, model: str = ".") -> dict:
    """vLLM's speculative_config of the run's draft, asked of its kind: k =
    draft.num_speculative_tokens, drafted as draft.draft_sample_method, `model` as given ("."
    in the export's own file: the export dir)."""
    d = cfg.draft
    return kinds.of(cfg).speculative_config(model, d.num_speculative_tokens, d.draft_sample_method)


def write_serving_files(tmp: Path, cfg, readme: str) -> None:
    """An export's speculative_config.json (`run_speculative_config`, "model": ".") and
    README.md (`readme`, whose snippets name the dir) into `tmp`, the export's atomic dir."""
    artifacts.write_json_atomic(tmp / "speculative_config.json", run_speculative_config(cfg))
    artifacts.write_text_atomic(tmp / "README.md", readme)


def serving_snippets(target: str, sc: str) -> str:
    """The export README's serving part (any draft kind): relocation, vLLM, NeMo-RL, verl lines
    for `speculative_config` JSON `sc`, and the vLLM-CPU plugin note."""
    return f"""This directory holds no path of the machine that wrote it: copy it anywhere.
`speculative_config.json` says `"model": "."` (this directory; vLLM resolves it against its
working directory, so run from here or put this directory's path there, as below).

## vLLM

```bash
vllm serve {target} --speculative-config '{sc}'
```

```python
from vllm import LLM
llm = LLM(model="{target}", speculative_config={sc})
```

## NeMo-RL (rollouts through vLLM; `vllm_kwargs` is passed to `vllm.LLM`)

```yaml
policy:
  generation:
    vllm_kwargs:
      speculative_config: {sc}
```

## verl (vLLM rollout; extra engine arguments go through `engine_kwargs.vllm`)

```bash
+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config='{sc}'
```

On vllm-cpu 0.32.0, sampled (T > 0) verification divides the target logits by uninitialised
temperatures; install draftkit in the serving environment: its vLLM plugin
(`draftkit.serving.vllm_plugin`, loaded by vLLM in every engine process) fixes it. CUDA vLLM is not
affected.
"""
