"""PARD drafts (drafts/pard): the packed parallel positions against a hand-worked example and
against vLLM's per-request input (one HF forward per anchor), the loss at k=1 against the
draft-lm kind's, the mask-token choice, the stages on tiny-llama (train -> export -> reference
eval), the warm start from a draft-lm run, and one refresh through the kind interface."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _runs import make_run, one_thread, save_best

from draftkit import api
from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.lm_family import build as lm_build
from draftkit.drafts.lm_family.model import DraftLM
from draftkit.drafts.pard import layout
from draftkit.drafts.pard.build import build_pard, choose_mask_token
from draftkit.drafts.pard.drafter import PardDrafter
from draftkit.drafts.pard.model import PardLM

K, M = 3, 0  # k, and the tiny-llama mask token (its <|endoftext|>, the only unused special)


def _pard(tiny_target, layers: int = 2, k: int = K, impl: str | None = None) -> PardLM:
    lm = lm_build.truncate(tiny_target.path, layers)
    if impl:
        lm.config._attn_implementation = impl
    lm.config.pard_token = M
    t = tiny_target.model
    return PardLM(lm, t.model.norm.weight, t.lm_head.weight, t.config.rms_norm_eps, k)


# ----------------------------------------------------------------------------- the layout


def test_pack_is_the_hand_worked_example():
    """layout.py's docstring: T=5, anchors {1, 2}, k=3."""
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    anchors = torch.tensor([[False, True, True, False, False]])
    p = layout.pack(ids, torch.ones_like(anchors), anchors, 3, pard_token=99)
    assert p.input_ids.tolist() == [[10, 11, 12, 13, 14, 99, 99, 99, 99]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 3, 4]]
    assert p.anchors.tolist() == [[1, 2]] and p.num_real == 5
    assert layout.slot_index(p, 1).tolist() == [[5, 6]]
    assert layout.slot_index(p, 2).tolist() == [[7, 8]]
    sees = {q: [k for k in range(9) if p.allowed[0, q, k]] for q in range(9)}
    assert sees == {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3, 4],
                    5: [0, 1, 5], 6: [0, 1, 2, 6], 7: [0, 1, 5, 7], 8: [0, 1, 2, 6, 8]}
    # labels: slot j of anchor a predicts x_{a+1+j}, judged by the target's state at a+j
    learn = torch.tensor([[False, True, True, True, True]])
    for j, labels, states, scored in ((0, [2, 3], [1, 2], [True, True]),
                                      (1, [3, 4], [2, 3], [True, True]),
                                      (2, [4, 0], [3, 0], [True, False])):  # x_5: past the end
        got = layout.step_targets(ids, learn, p.anchors, j)
        assert [g.tolist() for g in got] == [[labels], [states], [scored]], j


def test_padding_rows_and_slots_see_only_what_they_may():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    anchors = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    p = layout.pack(ids, valid, anchors, 2, pard_token=3)
    assert p.anchors.tolist() == [[0, 1, 2], [0, -1, -1]]
    row = p.allowed[1]  # [7, 7]: 4 real + 3 slots
    assert row[:, 2:4].sum(0).tolist() == [1, 1]  # padded real tokens: only themselves
    assert [k for k in range(7) if row[4, k]] == [0, 4]  # slot of anchor 0
    assert [k for k in range(7) if row[5, k]] == [5]  # padding slot: itself only
    assert p.position_ids[1, 4:].tolist() == [1, 0, 0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_forward_is_vllms_input_for_every_anchor(tiny_target, impl, one_thread):
    """Slot j of anchor a in one packed forward == the LM on [x_0..x_a, m, .., m] (positions
    0..a+k-1, plain causal), vLLM's parallel-drafting input, at row a+j: for every anchor."""
    model = _pard(tiny_target, impl=impl).eval()
    ids = torch.randint(3, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0
    with torch.no_grad():
        steps = model.step_logits(ids, attn)  # k x [B, T, V], index t = anchor t+1
        for b in range(2):
            n = int(attn[b].sum())
            for a in range(1, n):
                x = torch.cat([ids[b, :a + 1], torch.full((K - 1,), M)])
                want = model.lm(input_ids=x[None]).logits[0, a:]  # [k, V]
                drafter = PardDrafter(model.lm, slots=2)  # begin, then one doubling
                got = [drafter.begin(ids[b, :a + 1])] + [drafter.extend(-1) for _ in range(K - 1)]
                for j in range(K):
                    torch.testing.assert_close(steps[j][b, a - 1], want[j], rtol=1e-4, atol=1e-4)
                    torch.testing.assert_close(got[j], want[j], rtol=1e-4, atol=1e-4)
            for j in range(K):  # no anchor past the row's end
                assert not steps[j][b, n - 1:].any()


def test_at_k1_the_loss_is_the_draft_lms(tiny_target, one_thread):
    """One slot per anchor is the plain LM: PardLM(k=1) == DraftLM, loss and metrics."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 512, (2, 12), generator=g)
    attn, loss_mask = torch.ones_like(ids), torch.zeros_like(ids)
    attn[1, 8:], loss_mask[:, 3:] = 0, 1
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask,
             "last": torch.randn(2, 12, 128, generator=g)}
    pard = _pard(tiny_target, k=1)
    plain = DraftLM(pard.lm, pard.target_norm, pard.target_lm_head, pard.eps, 1)
    (lp, mp), (ld, md) = pard(batch), plain(batch)
    torch.testing.assert_close(lp, ld)
    for key in ("n_0", "correct_0", "cond_n_0", "cond_correct_0", "kl_sum_0"):
        assert mp[key] == pytest.approx(md[key]), key


def test_forward_scores_every_step_and_learns(tiny_target, one_thread):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 512, (2, 10), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "loss_mask": torch.ones_like(ids), "last": torch.randn(2, 10, 128, generator=g)}
    model = _pard(tiny_target)
    _, metrics = model(batch)
    # anchors 0..8 (x_{a+1} learned); step j scores those with a+1+j <= 9
    assert [metrics[f"n_{j}"] for j in range(K)] == [18.0, 16.0, 14.0]
    assert [metrics[f"w_{j}"] for j in range(K)] == [pytest.approx(1 / K)] * K
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(5):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert model.lm.get_input_embeddings().weight.grad[M].abs().sum() > 0  # the mask row learns
    batch["input_ids"][0, 4] = M  # the mask token as a real token: refused
    with pytest.raises(DraftkitError, match="holds the PARD mask token 0"):
        model(batch)


# ----------------------------------------------------------------------------- the mask token


def test_mask_token_choice(tiny_target):
    tok = tiny_target.tokenizer
    assert choose_mask_token(tok, 512, [2]) == M  # pad <|endoftext|>: the only one left
    assert choose_mask_token(tok, 520, [2]) == 512  # a padded embedding: the first row past it
    other = copy.deepcopy(tok)  # a template that uses every special token leaves none
    other.chat_template = "<|endoftext|>{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(DraftkitError, match="no token of the target's vocabulary"):
        choose_mask_token(other, 512, [2])


# ----------------------------------------------------------------------------- the stages


STAGES = ["train.max_steps=4", "train.eval_every=2", "train.batch_tokens=512",
          "train.num_workers=0", "tracking.backend=none", "harvest.dtype=float32",
          "export.check=false", "draft.num_layers=2"]


@pytest.fixture(scope="module")
def pard_run(tmp_path_factory, tiny_target):
    with one_thread():
        run = make_run(tmp_path_factory.mktemp("pard"), tiny_target.tokenizer, kind="pard",
                       n_train=8, n_eval=4, overrides=STAGES)
        api.harvest(run)
        out = api.train(run)
        yield {"run": run, "train": out, "export": api.export(run)}


def test_train_then_export_a_pard_draft(pard_run):
    hist = json.loads((pard_run["train"] / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and hist[-1]["loss"] < hist[0]["loss"]
    best = json.loads((pard_run["train"] / "best" / "meta.json").read_text())["eval"]
    assert {"cond_acc_0", "cond_acc_2", "sim_al"} <= set(best)
    out = pard_run["export"]
    conf = json.loads((out / "config.json").read_text())
    assert conf["pard_token"] == M and conf["num_hidden_layers"] == 2
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "draft_model", "model": ".", "num_speculative_tokens": K,
        "draft_sample_method": "probabilistic", "parallel_drafting": True}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "pard" and meta["pard_token"] == M
    assert "parallel_drafting" in (out / "README.md").read_text()
    kind = kinds.get("pard")
    assert (kind.name, kind.method) == ("pard", "draft_model")
    cfg = config.load(pard_run["run"])
    assert kind.export_shapes(conf, cfg) == {"vocab": (512, 512), "pard_token": (M, M)}
    assert kind.export_shapes({**conf, "pard_token": 600}, cfg)["pard_token"][1] != 600
    # the engine every stage builds for this export drafts in parallel
    from draftkit.serving import speculative

    assert speculative.method_config("pard", K, out)["parallel_drafting"] is True


def test_reference_eval_of_the_export(pard_run, tmp_path):
    rep = api.evaluate(pard_run["run"], [
        "eval.engine=reference", "eval.k_values=[3]", "eval.temperatures=[0]",
        "eval.max_new_tokens=12", "eval.reference_prompts=2", f"eval.results_dir={tmp_path}"])
    (row,) = rep["reference"]["rows"]
    assert (row["method"], row["k"]) == ("reference-pard", 3) and row["drafts"] > 0
    assert row["acceptance_length"] == pytest.approx(1 + sum(row["per_position"]))


def test_warm_start_from_a_draft_lm_run_and_from_a_pard_export(pard_run, tmp_path, tiny_target):
    """train.init_from a draft-lm run: its weights, a new mask token; a PARD export keeps its."""
    src = make_run(tmp_path, kind="draft-lm", name="dlm", overrides=["draft.num_layers=2"])
    lm = lm_build.truncate(tiny_target.path, 2)
    torch.manual_seed(0)
    lm.model.layers[0].mlp.up_proj.weight.data.normal_()  # not the target's: a "trained" draft
    save_best(src, DraftLM.for_target(lm, tiny_target.model, config.load(src)))
    cfg = config.load(pard_run["run"], [f"train.init_from={src}"])
    pard = build_pard(cfg, tiny_target)
    assert pard.pard_token == M and pard.k == K
    for name, value in lm.state_dict().items():
        assert torch.equal(pard.lm.state_dict()[name], value), name
    exported = pard_run["export"]
    conf = json.loads((exported / "config.json").read_text())
    conf["pard_token"] = 1  # another mask than the chooser's: the warm start keeps it
    (tmp_path / "pard-export").mkdir()
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "pard-export" / f).write_bytes((exported / f).read_bytes())
    (tmp_path / "pard-export" / "config.json").write_text(json.dumps(conf))
    cfg = config.load(pard_run["run"], [f"train.init_from={tmp_path / 'pard-export'}"])
    assert build_pard(cfg, tiny_target).pard_token == 1


# ----------------------------------------------------------------------------- refresh


@pytest.fixture(scope="module")
def refreshed(pard_run, tmp_path_factory, tiny_target):
    from _rl_helpers import save_policy, write_rollouts

    from draftkit.rl.job import refresh

    tmp = tmp_path_factory.mktemp("pard-rl")
    with one_thread():
        policy = save_policy(tiny_target, tmp / "ckpt" / "step_1")
        rollouts = write_rollouts(tiny_target, tmp / "rollouts" / "step_1.jsonl", 24, 0)
        res = refresh(pard_run["run"], policy, [rollouts],
                      ["refresh.budget_steps=10", "refresh.lr=3e-3", "refresh.batch_tokens=1024",
                       "refresh.heldout_fraction=0.3"])
    return res


def test_a_refresh_through_the_kind_interface_publishes(pard_run, refreshed):
    from draftkit.rl import publish

    assert refreshed["status"] == "published", refreshed
    store = publish.DraftStore(pard_run["run"])
    pub = store.root / refreshed["version"]
    lin = store.lineage(refreshed["version"])
    assert lin["draft_kind"] == "pard" and lin["k"] == K
    before, after = lin["al_before"]["T=0"], lin["al_after"]["T=0"]
    print(f"refresh: drift AL {before['al']:.3f} -> {after['al']:.3f}")
    assert after["al"] > before["al"] and len(after["per_position"]) == K
    assert json.loads((pub / "config.json").read_text())["pard_token"] == M
    assert json.loads((pub / "speculative_config.json").read_text())["parallel_drafting"] is True
    view = kinds.get("pard").engine_view(pub)
    assert "model.layers.1.self_attn.qkv_proj.weight" in view
    assert artifacts.RunPaths(pard_run["run"]).export.is_dir()
