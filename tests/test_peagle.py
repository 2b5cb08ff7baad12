"""P-EAGLE (drafts/peagle): each parallel slot of the training unroll sees exactly what vLLM's
one-forward drafting gives it (an explicit context + mask-slot sequence through the head's
plain causal `step`), the loss is the hand-computed KL over those slots, the reference drafter
ignores what was drafted, the checkpoint is the speculators `peagle` format, and the kind runs
init -> harvest -> train -> export on the tiny target, warm-starts from an EAGLE-3 head and
refreshes through the kind interface. vLLM serving: tests/test_peagle_vllm.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from _eagle3_helpers import V, make_batch, make_model, make_spec
from _runs import DRAFT, copy_run, make_run, one_thread, save_best, write_token_counts

from draftkit import api
from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.eagle_family.layer import rms_norm
from draftkit.drafts.eagle_family.vocab import DraftVocab
from draftkit.drafts.peagle.drafter import PEagleDrafter
from draftkit.drafts.peagle.model import PEagleDraft

K, MASK = 3, 5


def make_head(seed: int = 0) -> PEagleDraft:
    """A P-EAGLE head on the hand-built EAGLE-3 head of _eagle3_helpers (random target
    tensors, non-trivial norms), with a random mask_hidden."""
    spec = make_spec()
    base = make_model(spec, ttt_steps=K, seed=seed)
    model = PEagleDraft(spec, DraftVocab.from_d2t(base.d2t, V), ttt_steps=K, mask_token_id=MASK)
    model.load_target_tensors(base.embed_tokens.weight, base.verifier_norm,
                              base.verifier_lm_head, init_lm_head=False)
    model.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        model.mask_hidden.copy_(torch.randn(model.mask_hidden.shape,
                                            generator=torch.Generator().manual_seed(seed + 7)))
    return model.eval()


def vllm_slots(model, batch: dict, b: int, t: int, j: int) -> torch.Tensor:
    """Draft logits [Vd] of slot j at anchor t as vLLM computes them: context tokens
    x_1..x_{t+1} beside fuse(h_0..h_t) at positions 0..t, then j mask slots (mask token,
    fuse(mask_hidden)) at positions t+1..t+j, one causal pass; the last row."""
    fused = model.fuse(batch["aux"][b:b + 1])[0]  # [T, H]
    _, mask_hidden = model.mask_inputs(1, j)  # [1, j, H]
    ids = torch.cat([batch["input_ids"][b, 1:t + 2], torch.full((j,), model.mask_token_id)])
    hidden = torch.cat([fused[: t + 1], mask_hidden[0]])  # [t+1+j, H]
    logits, _ = model.step(ids[None], hidden[None], torch.arange(t + 1 + j)[None])
    return logits[0, -1]


@torch.no_grad()
def test_each_parallel_slot_sees_what_vllm_gives_it(one_thread):
    model = make_head()
    batch = make_batch(model.spec, [12, 9], 12)  # row 1 right-padded
    steps = model.ttt_unroll(batch["aux"], batch["input_ids"], batch["attention_mask"])
    assert len(steps) == K
    for b, n in enumerate([12, 9]):
        for t in range(n - 1):
            for j in range(K):
                torch.testing.assert_close(steps[j][b, t], vllm_slots(model, batch, b, t, j),
                                           rtol=1e-5, atol=1e-5, msg=f"b={b} t={t} slot {j}")
    # slot 0 is EAGLE-3's first step, and no slot depends on the tokens after the anchor
    eagle3 = make_model(make_spec(), ttt_steps=1)
    torch.testing.assert_close(steps[0], eagle3.ttt_unroll(
        batch["aux"], batch["input_ids"], batch["attention_mask"])[0])
    later = dict(batch, input_ids=batch["input_ids"].clone())
    later["input_ids"][:, 6:] = 1  # tokens x_6.. change: anchors t <= 4 must not see it
    again = model.ttt_unroll(later["aux"], later["input_ids"], later["attention_mask"])
    for j in range(K):
        assert torch.equal(again[j][:, :5], steps[j][:, :5])


@torch.no_grad()
def test_loss_is_the_hand_computed_kl_over_the_slots(one_thread):
    model = make_head(seed=1)
    batch = make_batch(model.spec, [10, 7], 10, seed=3)
    batch["loss_mask"][0, 6] = 0  # a prompt token inside row 0: not learned
    loss, metrics = model(batch)
    valid = batch["attention_mask"].bool()
    learn = valid & batch["loss_mask"].bool()
    eps, head = model.spec.rms_norm_eps, model.verifier_lm_head[model.t2d]  # [Vd, H]
    want = 0.0
    for j in range(K):
        kls = []
        for b in range(2):
            for t in range(10 - 2 - j):  # slot j at anchor t drafts x_{t+2+j}
                if not (valid[b, t] and learn[b, t + 2 + j]):
                    continue
                p = F.log_softmax(rms_norm(batch["last"][b, t + 1 + j], model.verifier_norm,
                                           eps) @ head.T, -1)  # verifier at x_{t+1+j}
                q = F.log_softmax(vllm_slots(model, batch, b, t, j), -1)
                kls.append(float((p.exp() * (p - q)).sum()))
        assert metrics[f"n_{j}"] == len(kls)
        want += 0.8 ** j * sum(kls) / len(kls)
    assert float(loss) == pytest.approx(want, rel=1e-5)


class _Features:
    """A stand-in HFTarget: fixed aux features of a sequence."""

    def __init__(self, aux: torch.Tensor):
        self.aux_layer_ids, self.aux = [1, 2, 4], aux

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        return self.aux[: ids.numel()]


@torch.no_grad()
def test_the_reference_drafter_ignores_what_was_drafted():
    model = make_head(seed=2)
    batch = make_batch(model.spec, [9], 9)
    ids = batch["input_ids"][0]  # verified x_0..x_8: the anchor is t = 7
    drafter = PEagleDrafter(model, _Features(batch["aux"][0]))
    got = [drafter.begin(ids), drafter.extend(11), drafter.extend(12)]
    again = PEagleDrafter(model, _Features(batch["aux"][0]))
    other = [again.begin(ids), again.extend(30), again.extend(31)]
    for j in range(K):
        want = model.target_logits(vllm_slots(model, batch, 0, 7, j))  # [V]
        assert torch.equal(got[j], other[j])
        torch.testing.assert_close(got[j], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(DraftkitError, match="PEagleDraft"):
        PEagleDrafter(make_model(make_spec()), _Features(batch["aux"][0]))


def test_checkpoint_is_the_speculators_peagle_format(tmp_path):
    model = make_head()
    model.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["speculators_model_type"] == "peagle" and conf["mask_token_id"] == MASK
    assert conf["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    layer = conf["transformer_layer_config"]
    assert layer["fc_norm"] is False and layer["norm_output"] is False  # vLLM reads them here
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(tensors["mask_hidden"], model.mask_hidden.detach())
    tensors.pop("mask_hidden")
    save_file(tensors, str(tmp_path / "model.safetensors"))  # vLLM refuses this: so do we
    with pytest.raises(DraftkitError, match="needs `mask_hidden`"):
        PEagleDraft.from_pretrained(tmp_path)
    with pytest.raises(DraftkitError, match="train.ttt_steps=2 trains 2 parallel slots"):
        kinds.get("peagle").check_train(config.merge(config.RunConfig(), {
            "draft": {"kind": "peagle"}, "train": {"ttt_steps": 2}}))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_target):
    """init -> harvest -> train (4 steps) -> export of a peagle run on tiny-llama."""
    with one_thread():
        run = make_run(tmp_path_factory.mktemp("peagle"), tiny_target.tokenizer, kind="peagle",
                       name="pe", n_train=8, n_eval=4, overrides=[
                           *DRAFT, "train.max_steps=4", "train.eval_every=2",
                           "train.batch_tokens=256", "train.num_workers=0",
                           "tracking.backend=none", "harvest.dtype=float32"])
        write_token_counts(run)
        api.harvest(run)
        out = api.train(run)
        export = api.export(run, ["export.check=false"])
    return {"run": run, "train": out, "export": export}


def test_init_harvest_train_export_on_the_tiny_target(trained_run, tiny_target):
    cfg = api.load_config(trained_run["run"])
    assert cfg.draft.kind == "peagle" and cfg.train.ttt_steps == K
    hist = json.loads((trained_run["train"] / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and hist[-1]["loss"] < hist[0]["loss"]
    out = trained_run["export"]
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "eagle3", "parallel_drafting": True, "model": ".", "num_speculative_tokens": K,
        "draft_sample_method": "probabilistic"}
    kind = kinds.get("peagle")
    conf = json.loads((out / "config.json").read_text())
    assert conf["mask_token_id"] == tiny_target.tokenizer.pad_token_id
    assert all(a == b for a, b in kind.export_shapes(conf, cfg).values())
    draft = kind.load_export(out, tiny_target.model)
    best = PEagleDraft.from_pretrained(trained_run["train"] / "best", tiny_target.model)
    assert torch.equal(draft.mask_hidden, best.mask_hidden) and kind.aux_layer_ids(draft) == [1, 3, 5]
    view = kind.engine_view(out)
    assert torch.equal(view["mask_hidden"], best.mask_hidden.detach()[None])
    assert "model.layers.0.self_attn.qkv_proj.weight" in view and "model.mask_hidden" not in view


def test_warm_start_from_an_eagle3_head_keeps_its_layer(trained_run, tiny_target, tmp_path):
    from _runs import random_draft

    eagle3 = random_draft(trained_run["run"], tiny_target.model)
    eagle3.save_pretrained(tmp_path / "eagle3")
    cfg = config.load(trained_run["run"], [f"train.init_from={tmp_path / 'eagle3'}"])
    model = kinds.get("peagle").build(cfg, [], tiny_target)
    assert isinstance(model, PEagleDraft) and model.mask_token_id == 0  # tiny-llama's pad
    for name, value in eagle3.export_state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    with pytest.raises(DraftkitError, match="holds an EAGLE-3 head"):
        kinds.get("peagle").load_export(tmp_path / "eagle3", tiny_target.model)
    (trained_run["run"].parent / "pe-export-eagle3").mkdir()
    other = copy_run(trained_run["run"], "pe-export-eagle3", subs=())
    save_best(other, eagle3)
    with pytest.raises(DraftkitError, match="holds an EAGLE-3 head, not a P-EAGLE one"):
        api.export(other, ["export.check=false"])


def test_one_refresh_publishes_a_peagle_version(trained_run, tiny_target, tmp_path):
    """rl/job.refresh through the kind interface: load, features, step_logits (k x [B, T, Vd]),
    finetune, export; the published dir is a P-EAGLE export."""
    from _rl_helpers import save_policy, write_rollouts

    from draftkit.rl import publish
    from draftkit.rl.job import refresh

    run = copy_run(trained_run["run"], "pe-rl", subs=("export",))
    with one_thread():
        policy = save_policy(tiny_target, tmp_path / "ckpt" / "step_1")
        rollouts = write_rollouts(tiny_target, tmp_path / "rollouts" / "step_1.jsonl", 24, 0)
        res = refresh(run, policy, [rollouts], ["refresh.budget_steps=20", "refresh.lr=3e-3",
                                                "refresh.batch_tokens=2048"])
    assert res["status"] == "published", res
    lin = res["lineage"]
    assert lin["draft_kind"] == "peagle" and lin["al_after"]["T=0"]["al"] > lin["al_before"]["T=0"]["al"]
    pub = publish.DraftStore(run).root / res["version"]
    assert json.loads((pub / "config.json").read_text())["speculators_model_type"] == "peagle"
    assert json.loads((pub / "speculative_config.json").read_text())["parallel_drafting"] is True
    kind = kinds.get("peagle")
    model = kind.load(pub, tiny_target.model, K)
    ids = torch.randint(0, 512, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             **kind.features(model, tiny_target.model, ids, torch.ones_like(ids))}
    steps, vocab_ids = kind.step_logits(model, batch)
    assert len(steps) == K and steps[0].shape == (2, 10, 256) and vocab_ids.shape == (256,)
