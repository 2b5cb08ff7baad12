"""The draft-kind registry: a kind defined outside draftkit, registered here, runs through
init -> harvest -> train -> export with no stage knowing its name (drafts/kind.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _runs import make_run, one_thread
from safetensors.torch import load_file, save_file
from torch import nn

from draftkit import api
from draftkit.core import artifacts
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.lm_family.losses import metrics


class Bigram(nn.Module):
    """Next-token logits from the current token alone: a [V, V] table."""

    def __init__(self, vocab: int, k: int):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)
        self.k = k

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        ids, valid = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        learn = valid[:, 1:] & batch["loss_mask"][:, 1:].bool()  # [B, T-1]: x_{t+1} learned
        logits = self.table(ids[:, :-1])  # [B, T-1, V]
        nxt = ids[:, 1:]  # [B, T-1]
        loss = nn.functional.cross_entropy(logits[learn], nxt[learn], reduction="sum")
        correct = (logits.argmax(-1) == nxt) & learn  # [B, T-1]
        pad = torch.zeros_like(learn[:, :1])
        n = max(1, int(learn.sum()))
        return loss / n, metrics(torch.cat([correct, pad], 1), torch.cat([learn, pad], 1),
                                 self.k, float(loss.detach()), float(loss.detach()))


class BigramKind:
    name, method = "toy-bigram", "draft_model"

    def resolve(self, cfg, info) -> None:
        cfg.draft.aux_layer_ids = cfg.draft.aux_layer_ids or [info.num_hidden_layers]

    def describe(self, cfg) -> str | None:
        return "toy-bigram: a next-token table"

    def check_train(self, cfg) -> None:
        if cfg.train.mode != "stored":
            raise DraftkitError("toy-bigram trains from stored shards only (train.mode=stored)")

    def build(self, cfg, data_runs, target) -> nn.Module:
        return Bigram(cfg.target.vocab_size, cfg.draft.num_speculative_tokens)

    def export_run(self, run) -> Path:
        best = run.paths.train / "best"
        out = run.export_dir
        with artifacts.atomic_dir(out, overwrite=True) as tmp:
            save_file(load_file(str(best / "trainable.safetensors")), str(tmp / "table.safetensors"))
            artifacts.write_json_atomic(tmp / "speculative_config.json",
                                        {"method": self.method, "model": ".",
                                         "num_speculative_tokens": run.cfg.draft.num_speculative_tokens})
        return out


@pytest.fixture
def toy_kind(monkeypatch):
    """BigramKind, registered (for this test only) by docs/draft-kinds.md's block as written."""
    from test_docs import example

    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))
    exec(example("docs/draft-kinds.md", "register-a-kind"), {"MyKind": BigramKind})  # noqa: S102
    return kinds.get(BigramKind.name)


def test_a_registered_kind_runs_through_train_and_export(toy_kind, tmp_path, tiny_target):
    assert "toy-bigram" in kinds.names()
    with one_thread():
        run = make_run(tmp_path, tiny_target.tokenizer, kind="toy-bigram", n_train=8, n_eval=4,
                       overrides=["train.max_steps=4", "train.eval_every=2", "train.batch_tokens=256",
                                  "train.num_workers=0", "tracking.backend=none",
                                  "harvest.dtype=float32", "export.check=false"])
        assert api.load_config(run).draft.aux_layer_ids == [tiny_target.model.config.num_hidden_layers]
        api.harvest(run)
        out = api.train(run)
        hist = json.loads((out / "history.json").read_text())
        assert [h["step"] for h in hist] == [1, 2, 3, 4] and hist[-1]["loss"] < hist[0]["loss"]
        export = api.export(run)
    table = load_file(str(export / "table.safetensors"))["table.weight"]
    best = load_file(str(out / "best" / "trainable.safetensors"))["table.weight"]
    assert torch.equal(table, best)
    sc = json.loads((export / "speculative_config.json").read_text())
    assert sc["method"] == "draft_model" and sc["num_speculative_tokens"] == 3
    with pytest.raises(DraftkitError, match="stored shards only"):
        api.train(run, ["train.mode=online"])


def test_an_unknown_kind_names_the_known_ones(tmp_path):
    with pytest.raises(DraftkitError, match="unknown draft kind 'medusa'.*draft-lm, eagle3"):
        api.init("tiny-llama", "math", kind="medusa", runs_dir=tmp_path)
