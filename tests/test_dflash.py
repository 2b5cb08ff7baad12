"""DFlash (drafts/dflash): every training block is the one forward vLLM runs for that anchor (a
dense attention over [context keys ; the whole block], written here from the model's own
projections), the loss is the hand-computed KL over the block's slots, the reference drafter
drafts one block and ignores what it drafted, the checkpoint is vLLM's DFlash format (0-based
target_layer_ids, mask_embedding.pt, explicit RoPE theta), the CPU k_norm fix norms each layer
with its own weights, and the kind runs init -> harvest -> train -> export on the tiny target
and refreshes through the kind interface. vLLM serving: tests/test_dflash_vllm.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from _runs import DRAFT, copy_run, make_run, one_thread, write_token_counts

from draftkit import api
from draftkit.core import config
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds
from draftkit.drafts.dflash import format as fmt
from draftkit.drafts.dflash import vllm_patch
from draftkit.drafts.dflash.drafter import DFlashDrafter
from draftkit.drafts.dflash.model import DFlashDraft
from draftkit.drafts.eagle_family.layer import apply_rope, rms_norm
from draftkit.drafts.eagle_family.vocab import DraftVocab

V, VD, H, K, MASK = 64, 40, 32, 3, 5


def make_spec(num_layers: int = 2) -> fmt.DFlashSpec:
    return fmt.DFlashSpec(
        hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, rms_norm_eps=1e-6, rope_theta=1e5, rope_scaling=None,
        max_position_embeddings=256, target_vocab_size=V, draft_vocab_size=VD,
        target_hidden_size=H, aux_layer_ids=[1, 2, 4], num_layers=num_layers,
        mask_token_id=MASK, num_speculative_tokens=K, target_num_layers=6)


def make_draft(seed: int = 0, num_layers: int = 2) -> DFlashDraft:
    """Random weights, random 'target' tensors, non-trivial norms and mask embedding."""
    g = torch.Generator().manual_seed(seed)
    spec = make_spec(num_layers)
    vocab = DraftVocab.build(torch.randint(0, 1000, (V,), generator=g), VD)
    torch.manual_seed(seed)
    model = DFlashDraft(spec, vocab)
    model.load_target_tensors(torch.randn(V, H, generator=g), 1 + 0.1 * torch.randn(H, generator=g),
                              torch.randn(V, H, generator=g) * 0.3, init_lm_head=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        model.mask_embedding.copy_(torch.randn(H, generator=g))
    return model.eval()


def make_batch(lengths: list[int], t: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    attn = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    loss_mask = attn.clone()
    loss_mask[:, :2] = 0
    ids = torch.randint(0, V, (len(lengths), t), generator=g)
    ids[ids == MASK] = MASK + 1  # the mask id appears where the test puts it
    return {"aux": torch.randn(len(lengths), t, 3 * H, generator=g),
            "last": torch.randn(len(lengths), t, H, generator=g) * 3,
            "input_ids": ids * attn, "loss_mask": loss_mask, "attention_mask": attn}


def dense_block(model: DFlashDraft, aux: torch.Tensor, first: int) -> torch.Tensor:
    """What vLLM computes for one request: context c_p = hidden_norm(fc(h_p)) at positions
    0..C-1 into every layer's K/V (k_norm, RoPE), query [first, MASK x k] at positions C..C+k,
    pre-norm layers attending over [context keys ; block keys] with NO mask. -> logits [k, Vd]."""
    c = aux.shape[0]
    ctx = rms_norm(F.linear(aux, model.fc.weight), model.hidden_norm.weight, 1e-6)  # [C, H]
    ids = torch.tensor([first] + [MASK] * K)
    x = model.embed_tokens.weight[ids].clone()
    x[1:] = model.mask_embedding  # slots holding the mask id read the learned embedding
    pos = torch.arange(c + K + 1)
    cos, sin = model.rotary(pos[None], x.dtype)
    for layer in model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_norm(a.q_proj(h).view(-1, 4, 8)).transpose(0, 1)  # [nH, S, hd]
        kq = a.k_norm(a.k_proj(h).view(-1, 2, 8)).transpose(0, 1)
        vq = a.v_proj(h).view(-1, 2, 8).transpose(0, 1)
        kc = a.k_norm(a.k_proj(ctx).view(-1, 2, 8)).transpose(0, 1)
        vc = a.v_proj(ctx).view(-1, 2, 8).transpose(0, 1)
        q = apply_rope(q[None], cos[:, c:], sin[:, c:])[0]
        kq, kc = apply_rope(kq[None], cos[:, c:], sin[:, c:])[0], \
            apply_rope(kc[None], cos[:, :c], sin[:, :c])[0]
        k, v = torch.cat([kc, kq], 1).repeat_interleave(2, 0), torch.cat([vc, vq], 1).repeat_interleave(2, 0)
        out = F.scaled_dot_product_attention(q, k, v)  # non-causal
        r = a.o_proj(out.transpose(0, 1).reshape(K + 1, H)) + x
        x = layer.mlp(layer.post_attention_layernorm(r)) + r
    return model.lm_head(model.norm(x)[1:])


@torch.no_grad()
def test_every_training_block_is_the_forward_vllm_runs(one_thread):
    model = make_draft()
    batch = make_batch([11, 8], 11)  # row 1 right-padded
    states = model.block_states(batch["aux"], batch["input_ids"], batch["attention_mask"])
    assert len(states) == K
    for b, n in enumerate([11, 8]):
        for t in range(n - 1):
            want = dense_block(model, batch["aux"][b, : t + 1], int(batch["input_ids"][b, t + 1]))
            got = torch.stack([model.lm_head(states[j][b, t]) for j in range(K)])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"b={b} t={t}")
            torch.testing.assert_close(model.draft_logits(batch["aux"][b, : t + 1],
                                                          int(batch["input_ids"][b, t + 1])),
                                       want, rtol=1e-4, atol=1e-4)
    later = dict(batch, input_ids=batch["input_ids"].clone(), aux=batch["aux"].clone())
    later["input_ids"][:, 6:], later["aux"][:, 6:] = 1, 0.5  # anchors t <= 4 must not see it
    again = model.block_states(later["aux"], later["input_ids"], later["attention_mask"])
    for j in range(K):
        assert torch.equal(again[j][:, :5], states[j][:, :5])


@torch.no_grad()
def test_loss_is_the_hand_computed_kl_over_the_block(one_thread):
    model = make_draft(seed=1)
    batch = make_batch([10, 7], 10, seed=3)
    batch["loss_mask"][0, 6] = 0  # a prompt token inside row 0: not learned
    loss, metrics = model(batch)
    valid, learn = batch["attention_mask"].bool(), (batch["attention_mask"] * batch["loss_mask"]).bool()
    head = model.verifier_lm_head[model.t2d]
    want = 0.0
    for j in range(K):
        kls = []
        for b in range(2):
            for t in range(10 - 2 - j):  # slot j+1 at anchor t drafts x_{t+2+j}
                if valid[b, t] and learn[b, t + 2 + j]:
                    p = F.log_softmax(rms_norm(batch["last"][b, t + 1 + j], model.verifier_norm,
                                               1e-6) @ head.T, -1)
                    q = F.log_softmax(dense_block(model, batch["aux"][b, : t + 1],
                                                  int(batch["input_ids"][b, t + 1]))[j], -1)
                    kls.append(float((p.exp() * (p - q)).sum()))
        assert metrics[f"n_{j}"] == len(kls)
        want += 0.8 ** j * sum(kls) / len(kls)
    assert float(loss) == pytest.approx(want, rel=1e-4)
    assert 1.0 <= metrics["sim_al"] <= 1.0 + K


class _Features:
    def __init__(self, aux: torch.Tensor):
        self.aux_layer_ids, self.aux = [1, 2, 4], aux

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        return self.aux[: ids.numel()]


@torch.no_grad()
def test_the_reference_drafter_drafts_one_block():
    model = make_draft(seed=2)
    batch = make_batch([9], 9)
    ids = batch["input_ids"][0]  # verified x_0..x_8: context h_0..h_7, first token x_8
    want = model.target_logits(dense_block(model, batch["aux"][0, :8], int(ids[8])))  # [K, V]
    for drafted in ((11, 12), (30, 31)):
        d = DFlashDrafter(model, _Features(batch["aux"][0]))
        got = [d.begin(ids), d.extend(drafted[0]), d.extend(drafted[1])]
        torch.testing.assert_close(torch.stack(got), want, rtol=1e-4, atol=1e-4)
        with pytest.raises(DraftkitError, match="drafts 3 tokens"):
            d.extend(0)


def test_checkpoint_is_vllms_dflash_format(tmp_path):
    model = make_draft()
    model.save_pretrained(tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"] and conf["model_type"] == "qwen3"
    assert conf["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 1, 3]}
    assert conf["rope_theta"] == 1e5 and conf["rope_parameters"]["rope_theta"] == 1e5
    assert conf["num_hidden_layers"] == 2 and conf["block_size"] == K + 1
    mask = torch.load(tmp_path / "mask_embedding.pt", weights_only=True)
    assert mask["mask_token_id"] == MASK and torch.equal(mask["embedding"], model.mask_embedding)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            "layers.1.self_attn.k_norm.weight"} <= names
    assert not any(n.startswith("model.") or "embed_tokens" in n for n in names)
    target = (model.embed_tokens.weight, model.verifier_norm, model.verifier_lm_head)

    class _Target(torch.nn.Module):  # module_tensors reads model.embed_tokens/norm, lm_head
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = torch.nn.Embedding.from_pretrained(target[0])
            self.model.norm = torch.nn.Module()
            self.model.norm.weight = target[1]
            self.lm_head = torch.nn.Linear(H, V, bias=False)
            self.lm_head.weight.data.copy_(target[2])

    again = DFlashDraft.from_pretrained(tmp_path, _Target())
    for name, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name
    (tmp_path / "mask_embedding.pt").unlink()
    with pytest.raises(DraftkitError, match="learned mask embedding"):
        DFlashDraft.from_pretrained(tmp_path, _Target())


def test_taps_avoid_the_last_layer_and_the_block_is_trained_k():
    with pytest.raises(DraftkitError, match=r"must lie in \[1, 7\]"):
        fmt.check_taps([2, 4, 8], 8)
    with pytest.raises(DraftkitError, match="ascending"):
        fmt.check_taps([4, 2], 8)
    with pytest.raises(DraftkitError, match="train.ttt_steps=3"):
        kinds.get("dflash").check_train(config.merge(config.RunConfig(), {
            "draft": {"kind": "dflash", "num_speculative_tokens": 4}, "train": {"ttt_steps": 3}}))
    sc = kinds.get("dflash").speculative_config("/d", 3, "probabilistic")
    assert sc == {"method": "dflash", "model": "/d", "num_speculative_tokens": 3,
                  "draft_sample_method": "probabilistic"}


def test_k_norm_fix_norms_each_layer_with_its_own_weights():
    """The patched `_normalize_context_k` equals per-layer RMSNorm with each layer's k_norm
    row; a stand-in for the CPU op (layer 0's row for all) differs and the probe says so.
    The real vLLM method is probed in tests/test_dflash_vllm.py."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    weights = torch.rand(3, 8, generator=g) + 0.5  # [L, hd]
    all_k = torch.randn(3, 5, 2, 8, generator=g)  # [L, C, nKV, hd]
    fake = SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
    got = vllm_patch.normalize_context_k(fake, all_k)
    for i in range(3):
        torch.testing.assert_close(got[i], rms_norm(all_k[i], weights[i], 1e-6))

    def layer0_only(self, k):  # what vLLM-CPU's rms_norm op does with a [L, hd] weight
        return rms_norm(k, self._k_norm_weights[0], self._rms_norm_eps)

    assert not torch.allclose(layer0_only(fake, all_k)[1:], got[1:])
    assert vllm_patch.loses_layers(layer0_only)
    assert not vllm_patch.loses_layers(vllm_patch.normalize_context_k)
    assert vllm_patch.install in kinds.get("dflash").vllm_patches()


@torch.no_grad()
def test_the_cost_models_draft_step_is_one_block_over_a_cached_context():
    model = make_draft()
    call = kinds.get("dflash").draft_step_call(model, 3, 20)
    assert call().shape == (3, K, VD)  # k mask slots' logits per sequence


# ----------------------------------------------------------------------------- the lifecycle


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_target):
    """init -> harvest -> train (4 steps) -> export of a dflash run on tiny-llama."""
    with one_thread():
        run = make_run(tmp_path_factory.mktemp("dflash"), tiny_target.tokenizer, kind="dflash",
                       name="df", n_train=8, n_eval=4, overrides=[
                           *DRAFT, "train.max_steps=4", "train.eval_every=2",
                           "train.batch_tokens=256", "train.num_workers=0", "train.lr=3e-3",
                           "tracking.backend=none", "harvest.dtype=float32"])
        write_token_counts(run)
        api.harvest(run)
        out = api.train(run)
        export = api.export(run, ["export.check=false"])
    return {"run": run, "train": out, "export": export}


def test_init_harvest_train_export_on_the_tiny_target(trained_run, tiny_target):
    cfg = api.load_config(trained_run["run"])
    assert cfg.draft.kind == "dflash" and cfg.draft.aux_layer_ids == [1, 3, 5]
    hist = json.loads((trained_run["train"] / "history.json").read_text())
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and hist[-1]["loss"] < hist[0]["loss"]
    out = trained_run["export"]
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "dflash", "model": ".", "num_speculative_tokens": K,
        "draft_sample_method": "probabilistic"}
    conf = json.loads((out / "config.json").read_text())
    assert conf["dflash_config"]["target_layer_ids"] == [0, 2, 4]
    assert conf["dflash_config"]["mask_token_id"] == tiny_target.tokenizer.unk_token_id or \
        conf["dflash_config"]["mask_token_id"] == tiny_target.tokenizer.pad_token_id
    assert "/" not in conf["draftkit"]["verifier"] and (out / "mask_embedding.pt").is_file()
    kind = kinds.get("dflash")
    assert all(a == b for a, b in kind.export_shapes(conf, cfg).values())
    draft = kind.load_export(out, tiny_target.model)
    best = DFlashDraft.from_pretrained(trained_run["train"] / "best", tiny_target.model)
    assert torch.equal(draft.fc.weight, best.fc.weight) and kind.aux_layer_ids(draft) == [1, 3, 5]
    view = kind.engine_view(out)
    assert "model.layers.1.self_attn.qkv_proj.weight" in view and "lm_head.weight" in view
    assert torch.equal(view["model.mask_embedding"], best.mask_embedding.detach())
    assert "draft_id_to_target_id" in view and "t2d" not in view


def test_one_refresh_publishes_a_dflash_version(trained_run, tiny_target, tmp_path):
    """rl/job.refresh through the kind interface: load, features, step_logits (k x [B, T, Vd]),
    finetune, export; the published dir is a DFlash export."""
    from _rl_helpers import save_policy, write_rollouts

    from draftkit.rl import publish
    from draftkit.rl.job import refresh

    run = copy_run(trained_run["run"], "df-rl", subs=("export",))
    with one_thread():
        policy = save_policy(tiny_target, tmp_path / "ckpt" / "step_1")
        rollouts = write_rollouts(tiny_target, tmp_path / "rollouts" / "step_1.jsonl", 24, 0)
        res = refresh(run, policy, [rollouts], ["refresh.budget_steps=20", "refresh.lr=3e-3",
                                                "refresh.batch_tokens=2048"])
    assert res["status"] == "published", res
    lin = res["lineage"]
    assert lin["draft_kind"] == "dflash"
    assert lin["al_after"]["T=0"]["al"] > lin["al_before"]["T=0"]["al"]
    pub = publish.DraftStore(run).root / res["version"]
    assert json.loads((pub / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    assert json.loads((pub / "speculative_config.json").read_text())["method"] == "dflash"
    kind = kinds.get("dflash")
    model = kind.load(pub, tiny_target.model, K)
    ids = torch.randint(0, 512, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             **kind.features(model, tiny_target.model, ids, torch.ones_like(ids))}
    steps, vocab_ids = kind.step_logits(model, batch)
    assert len(steps) == K and steps[0].shape == (2, 10, 256) and vocab_ids.shape == (256,)
    before = kind.load(trained_run["export"], tiny_target.model, K)
    assert not torch.equal(model.fc.weight, before.fc.weight)  # refreshed ...
    assert torch.equal(model.mask_embedding, before.mask_embedding)  # ... but what vLLM re-reads
