"""Regenerate assistant turns with the target, resumably: vLLM by default, HF `generate` as
the fallback (`data.regen_engine=hf`).

Multi-turn conversations are regenerated turn by turn, in order: wave 1 rewrites every
conversation's first assistant turn, wave 2 the second one given the target's own first answer,
and so on, so every masked token is the target's and every prompt is one the target could meet.
Each batch of `data.regen_batch_size` requests is saved atomically as JSONL under
`data/.regen/<split>-<fingerprint>/`, where the fingerprint covers the conversations and every
generation setting; a rerun after a crash loads finished batches instead of regenerating them.
Per-request seeds (from data.seed, the conversation id and the turn) keep sampled runs
reproducible across resumes with vLLM; HF seeds each batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from draftkit.core import artifacts, engine_settings, hardware
from draftkit.core.config import RunConfig
from draftkit.core.errors import DraftkitError
from draftkit.prepare import chat_mask
from draftkit.prepare.sources import Conversation, seed_for
from draftkit.serving import vllm_engine
from draftkit.targets.load import load_target
from draftkit.targets.tokens import eos_ids

ENGINES = ("vllm", "hf")


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int


@dataclass
class Completion:
    token_ids: list[int]  # generated ids up to (not incl.) the end-of-turn token
    stopped: bool  # the target ended the turn itself (False: cut at max_tokens)


class Generator:
    """The target as a text generator, started on first use (cached batches need no engine)."""

    def __init__(self, cfg: RunConfig, tok, target_path: Path):
        if cfg.data.regen_engine not in ENGINES:
            raise DraftkitError(f"data.regen_engine must be one of {', '.join(ENGINES)}, got "
                                f"{cfg.data.regen_engine!r}")
        self.cfg, self.tok, self.path = cfg, tok, Path(target_path)
        self.kind = cfg.data.regen_engine
        self.stop = eos_ids(tok, target_path)
        self._llm = self._model = None
        self.calls = self.tokens = 0
        self.seconds = 0.0

    def generate(self, reqs: list[Request]) -> list[Completion]:
        t0 = time.perf_counter()
        outs = self._vllm(reqs) if self.kind == "vllm" else self._hf(reqs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.tokens += sum(len(o.token_ids) + o.stopped for o in outs)
        return outs

    def _finish(self, ids: list[int], limit: int) -> Completion:
        for k, t in enumerate(ids[:limit]):
            if t in self.stop:
                return Completion(ids[:k], True)
        return Completion(ids[:limit], False)

    def _vllm(self, reqs: list[Request]) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        if self._llm is None:
            d, t = self.cfg.data, self.cfg.target
            max_len = min(d.max_seq_len, t.max_position_embeddings or d.max_seq_len)
            seqs = max(1, min(256, d.regen_batch_size))
            spec = vllm_engine.EngineSpec(
                model=str(self.path), dtype=d.regen_dtype, max_model_len=max_len, seed=d.seed,
                max_num_seqs=seqs, settings=engine_settings.for_run(
                    self.cfg, d.regen_dtype, max_num_seqs=seqs, regeneration=True))
            self._llm = vllm_engine.start(spec)
        params = [vllm_engine.sampling(r.temperature, r.max_tokens, top_p=r.top_p,
                                       seed=r.seed if r.temperature > 0 else None) for r in reqs]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
        results = self._llm.generate(prompts, params, use_tqdm=False)
        return [self._finish(list(o.outputs[0].token_ids), r.max_tokens)
                for o, r in zip(results, reqs, strict=True)]

    def _hf(self, reqs: list[Request]) -> list[Completion]:
        import torch
        from transformers import GenerationConfig

        if self._model is None:
            t = self.cfg.target
            self._model = load_target(t.name, dtype=t.dtype, revision=t.revision).model
        model = self._model
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.stop)
        width = max(len(r.prompt_ids) for r in reqs)
        # left padding: [B, W]; row b = pad * (W - len_b) + prompt_b
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in reqs])
        attn = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids)
                             for r in reqs])
        sample = reqs[0].temperature > 0
        gc = GenerationConfig(max_new_tokens=max(r.max_tokens for r in reqs), do_sample=sample,
                              temperature=reqs[0].temperature if sample else None,
                              top_p=reqs[0].top_p if sample else None, top_k=None,
                              pad_token_id=pad, eos_token_id=sorted(self.stop))
        torch.manual_seed(reqs[0].seed)
        device = next(model.parameters()).device
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                                 generation_config=gc)  # [B, W + new]
        return [self._finish(out[b, width:].tolist(), r.max_tokens) for b, r in enumerate(reqs)]

    def close(self) -> None:
        if self._llm is not None:
            vllm_engine.stop(self._llm)
            self._llm = None
        self._model = None


class BatchStore:
    """Finished batches as `<key>.jsonl` under `root`, written atomically."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.hits = self.misses = 0

    def get(self, key: str, ids: list[str]) -> list[dict] | None:
        path = self.root / f"{key}.jsonl"
        if not path.is_file():
            return None
        recs = [json.loads(line) for line in path.read_text().splitlines() if line]
        return recs if [r["id"] for r in recs] == ids else None

    def put(self, key: str, recs: list[dict]) -> None:
        artifacts.write_text_atomic(self.root / f"{key}.jsonl",
                                    "".join(json.dumps(r) + "\n" for r in recs))

    def run(self, key: str, ids: list[str], reqs: list[Request], gen: Generator) -> list[dict]:
        """Cached records for this batch, or generate + decode + save them."""
        recs = self.get(key, ids)
        if recs is not None:
            self.hits += 1
            return recs
        self.misses += 1
        outs = gen.generate(reqs)
        recs = [{"id": i, "token_ids": o.token_ids, "stopped": o.stopped,
                 "text": gen.tok.decode(o.token_ids, skip_special_tokens=True)}
                for i, o in zip(ids, outs, strict=True)]
        self.put(key, recs)
        return recs


def settings(cfg: RunConfig, tok) -> dict:
    """Everything besides the prompts that changes what the target writes."""
    d, t = cfg.data, cfg.target
    return {"target": t.name, "revision": t.revision, "engine": d.regen_engine,
            "dtype": hardware.resolve(d.regen_dtype if d.regen_engine == "vllm" else t.dtype),
            "temperature": d.regen_temperature, "top_p": d.regen_top_p,
            "max_new_tokens": d.regen_max_new_tokens, "max_seq_len": d.max_seq_len,
            "batch": d.regen_batch_size, "seed": d.seed, "template": tok.chat_template}


def regenerate(convs: list[Conversation], gen: Generator, cfg: RunConfig, root: Path,
               split: str) -> dict:
    """Rewrite every assistant turn of `convs` in place with the target; return stats.

    Turn `w` of a conversation is generated in wave `w`, after its earlier turns. A turn whose
    prompt reaches max_seq_len ends the conversation before it (counted as trimmed)."""
    d, tok = cfg.data, gen.tok
    key = artifacts.fingerprint([[(c.id, c.messages) for c in convs], settings(cfg, tok)])[:16]
    store = BatchStore(Path(root) / f"{split}-{key}")
    stats = {"turns": 0, "trimmed_turns": 0, "hit_max_new_tokens": 0, "fingerprint": key}
    waves = max((sum(m["role"] == "assistant" for m in c.messages) for c in convs), default=0)
    bar = tqdm(total=sum(sum(m["role"] == "assistant" for m in c.messages) for c in convs),
               desc=f"regenerate {split}", unit="turn")
    for w in range(waves):
        todo = []  # (conversation, message index, request)
        for c in convs:
            turns = [i for i, m in enumerate(c.messages) if m["role"] == "assistant"]
            if len(turns) <= w:
                continue
            ids = chat_mask.prompt_ids(tok, c.messages, turns[w])
            if len(ids) >= d.max_seq_len:  # no room left: end the conversation before it
                if w == 0:  # nothing to keep: left as is, chat_mask.fit_turns drops it
                    continue
                stats["trimmed_turns"] += len(turns) - w
                bar.update(len(turns) - w)
                c.messages = c.messages[:turns[w - 1] + 1]
                continue
            todo.append((c, turns[w], Request(
                ids, min(d.regen_max_new_tokens, d.max_seq_len - len(ids)), d.regen_temperature,
                d.regen_top_p, seed_for(d.seed, c.id, w))))
        for b in range(0, len(todo), d.regen_batch_size):
            chunk = todo[b:b + d.regen_batch_size]
            recs = store.run(f"w{w}-b{b // d.regen_batch_size:05d}", [c.id for c, _, _ in chunk],
                             [r for _, _, r in chunk], gen)
            for (c, mi, _), rec in zip(chunk, recs, strict=True):
                c.messages[mi] = {"role": "assistant", "content": rec["text"].strip()}
                stats["hit_max_new_tokens"] += not rec["stopped"]
            stats["turns"] += len(chunk)
            bar.update(len(chunk))
    bar.close()
    stats.update(batches=store.hits + store.misses, cached_batches=store.hits)
    return stats
