"""End to end on tiny-llama through the real stages: init -> prepare (HF regeneration) ->
harvest -> train (offline, and online with the target in the loop) -> export -> vLLM check."""

from __future__ import annotations

import json

import pytest
import torch
from _runs import copy_run, one_thread, train_history
from safetensors.torch import load_file, save_file

from benchmarks.cost import train_step
from benchmarks.learning import eagle3, misses
from draftkit import api
from draftkit.core import artifacts, config
from draftkit.core.errors import DraftkitError
from draftkit.harvest.shards import open_harvest
from draftkit.train.data import epoch_plan

OVERRIDES = [
    "data.source=local", "data.max_samples=48", "data.eval_samples=8",
    "data.regen_engine=hf", "data.regen_max_new_tokens=24", "data.regen_temperature=0.0",
    "draft.draft_vocab_size=256", "harvest.dtype=float32", "harvest.eval_sequences=8",
    "train.max_steps=8", "train.eval_every=4", "train.save_every=4", "train.batch_tokens=1024",
    "tracking.backend=none", "export.check_prompts=8", "eval.max_new_tokens=24",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with one_thread():
        root = tmp_path_factory.mktemp("life")
        run = api.init("tiny-llama", "math", name="life", runs_dir=root, overrides=OVERRIDES)
        api.prepare(run)
        api.harvest(run)
        yield run


def test_offline_and_online_training_see_identical_batches(run):
    out = api.train(run)
    offline = train_history(out)
    assert (out / "best" / "meta.json").is_file()
    assert json.loads((out / "meta.json").read_text())["steps"] == 8
    online_run = copy_run(run, "life-online", subs=("data",))
    api.train(online_run, overrides=["train.mode=online"])
    online = train_history(artifacts.RunPaths(online_run).train)
    # the same batches and weights; online capture runs padded batches through the target,
    # which moves fp32 hidden states in the last bits only (harvest stores unpadded forwards)
    assert len(online) == len(offline) == 8
    torch.testing.assert_close(torch.tensor([h["loss"] for h in online]),
                               torch.tensor([h["loss"] for h in offline]), rtol=1e-5, atol=1e-6)
    assert offline[-1]["loss"] < offline[0]["loss"]


def _trained(run):
    best = artifacts.RunPaths(run).train / "best"
    if not best.exists():
        api.train(run)
    return best


def _eval_metrics(train_dir):
    return json.loads((train_dir / "best" / "meta.json").read_text())["eval"]


def test_warm_start_resumes_from_the_head_and_its_vocab(run):
    """lr=0 freezes the weights: a warm-started run must evaluate exactly like the head it
    started from, a cold one like a fresh head."""
    best = _trained(run)
    head = _eval_metrics(best.parent)
    frozen = ["train.lr=0", "train.max_steps=1", "train.eval_every=1", "train.save_every=1"]
    warm, cold = copy_run(run, "life-warm"), copy_run(run, "life-cold")
    # reversed counts: a vocab rebuilt from them would break the head's lm_head rows
    freqs = artifacts.RunPaths(warm).data / "token_freqs.safetensors"
    save_file({"counts": load_file(str(freqs))["counts"].flip(0).contiguous()}, str(freqs))
    api.train(warm, overrides=[*frozen, f"train.init_from={best}"])
    api.train(cold, overrides=frozen)
    got = _eval_metrics(artifacts.RunPaths(warm).train)
    for key in ("acc_0", "acc_1", "acc_2", "sim_al", "loss"):
        assert got[key] == pytest.approx(head[key], rel=1e-5), key
    assert _eval_metrics(artifacts.RunPaths(cold).train)["sim_al"] < head["sim_al"]
    # the benchmark's budget counts the steps that made the initial head
    assert eagle3.budget(warm)["warm_start"] == [{
        "from": str(run), "steps": 8,
        "train_s": json.loads((best.parent / "meta.json").read_text())["timings"]["train_s_this_call"]}]


def test_warm_start_refuses_a_head_of_other_draft_settings(run):
    _trained(run)
    with pytest.raises(DraftkitError, match="norm_before_fc=False there, True here"):
        api.train(run, overrides=[f"train.init_from={run}", "draft.norm_before_fc=true"])
    with pytest.raises(DraftkitError, match="set draft.draft_vocab_size=256"):
        api.train(run, overrides=[f"train.init_from={run}", "draft.draft_vocab_size=128"])
    with pytest.raises(DraftkitError, match="not an EAGLE-3 checkpoint"):
        api.train(run, overrides=[f"train.init_from={run.parent}"])


def test_extra_runs_add_their_harvest_to_the_train_data(run):
    other = copy_run(run, "life-extra")
    one = ["train.max_steps=0", "train.epochs=1", "train.eval_every=1000", "train.save_every=1000"]
    both = copy_run(run, "life-both")
    out = api.train(both, overrides=[*one, f"train.extra_runs=[{other}]"])
    # one epoch = the batch plan over both runs' sequences (each length now twice)
    lengths = open_harvest(artifacts.RunPaths(run).harvest).lengths()
    cfg = config.load(both)
    assert len(lengths) > 0 and json.loads((out / "meta.json").read_text())["steps"] == len(
        epoch_plan(lengths * 2, cfg.train.batch_tokens, cfg.train.seed, 0, cfg.train.pad_multiple))
    # the benchmark's data budget counts the extra run's data too
    single = json.loads((artifacts.RunPaths(run).data / "stats.json").read_text())["train"]
    budget = eagle3.budget(both)
    assert budget["train_samples"] == 2 * single["samples"]
    assert budget["harvest_tokens"] == 2 * sum(lengths) and budget["warm_start"] == []
    with pytest.raises(DraftkitError, match="twice or names this run itself"):
        api.train(both, overrides=[f"train.extra_runs=[{both}]"])
    with pytest.raises(DraftkitError, match="not a run dir"):
        api.train(both, overrides=[f"train.extra_runs=[{run.parent}]"])
    with pytest.raises(DraftkitError, match="train.mode=stored"):
        api.train(both, overrides=[f"train.extra_runs=[{other}]", "train.mode=online"])


def test_train_refuses_harvest_of_other_layer_ids(run):
    with pytest.raises(DraftkitError, match="aux layer ids"):
        api.train(run, overrides=["draft.aux_layer_ids=[1,3,5]", "train.max_steps=1"])


def test_feature_noise_changes_training_and_resumes_exactly(run):
    noise = ["train.feature_noise=0.1", "train.max_steps=4", "train.save_every=2"]
    plain = train_history(api.train(copy_run(run, "life-plain"), overrides=noise[1:]))
    full = api.train(copy_run(run, "life-noise"), overrides=noise)
    other = copy_run(run, "life-noise-resume")
    api.train(other, overrides=noise, stop_after=3)  # "crash" after step 3; checkpoint: step 2
    resumed = api.train(other, overrides=noise)
    losses = [h["loss"] for h in train_history(full)]
    assert losses == [h["loss"] for h in train_history(resumed)]  # the noise replays exactly
    assert losses[0] != plain[0]["loss"]  # and it was applied from the first step
    a = load_file(str(full / "best" / "model.safetensors"))
    b = load_file(str(resumed / "best" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_frozen_head_keeps_the_target_norm_and_rows_and_resumes_exactly(run):
    """draft.init_norm_from_target + train.freeze_head: the exported head's norm and lm_head
    are the target's final norm and its lm_head rows of the draft vocab, bit for bit, after
    training; the rest trains, and an interrupted run resumes to the same weights."""
    from draftkit.drafts.eagle_family.target_tensors import read_target_tensors
    from draftkit.targets.load import run_target_dir

    frozen = ["draft.init_norm_from_target=true", "train.freeze_head=true",
              "train.max_steps=4", "train.save_every=2"]
    full = api.train(copy_run(run, "life-frozen"), overrides=frozen)
    other = copy_run(run, "life-frozen-resume")
    api.train(other, overrides=frozen, stop_after=3)
    resumed = api.train(other, overrides=frozen)
    plain = api.train(copy_run(run, "life-unfrozen"), overrides=frozen[2:])
    a = load_file(str(full / "best" / "model.safetensors"))
    b = load_file(str(resumed / "best" / "model.safetensors"))
    c = load_file(str(plain / "best" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    _, norm, lm_head = read_target_tensors(run_target_dir(config.load(run).target))
    draft_ids = torch.arange(a["lm_head.weight"].shape[0])
    rows = draft_ids + a["d2t"] if "d2t" in a else draft_ids  # draft id -> target id
    assert torch.equal(a["norm.weight"], norm.float())
    assert torch.equal(a["lm_head.weight"], lm_head[rows].float())
    assert not torch.equal(c["norm.weight"], torch.ones_like(c["norm.weight"]))  # trained
    assert not torch.equal(a["fc.weight"], c["fc.weight"])  # the layer trained either way
    trainable = load_file(str(sorted((full / "checkpoints").glob("step-*"))[-1]
                              / "trainable.safetensors"))
    assert "lm_head.weight" not in trainable and "fc.weight" in trainable


def test_bench_misses_counts_what_the_acc_0_metric_counts(run):
    """benchmarks/learning/misses.py (scripts/bench_misses.py): its per-class counts add up to
    the model's own step-0 metric (n_0, correct_0 of the eval-mode forward) on every eval
    sequence."""
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.targets.load import load_target
    from draftkit.train.data import BatchBuilder, HarvestSource

    trained = copy_run(run, "life-misses")
    api.train(trained, overrides=["train.max_steps=4"])
    bench = misses.measure(trained, ["eval", "train"])
    target = load_target("tiny-llama", device="cpu", dtype="float32")
    model = Eagle3Draft.from_pretrained(trained / "train" / "best", target.model).eval()
    source = HarvestSource([open_harvest(artifacts.RunPaths(trained).harvest / "eval")])
    build = BatchBuilder(source, torch.float32)
    n = correct = 0
    with torch.no_grad():
        for i in range(len(source.lengths())):
            metrics = model(build([i]))[1]
            n, correct = n + metrics["n_0"], correct + metrics["correct_0"]
    counts = bench["splits"]["eval"].values()
    assert n > 0 and sum(c["n"] for c in counts) == n
    assert sum(c["correct"] for c in counts) == correct
    assert sum(c["n"] for c in bench["splits"]["train"].values()) > n
    md = misses.markdown(bench)
    assert "| eval | **all** |" in md and "| train | in prompt |" in md


def test_train_refuses_feature_noise_it_cannot_apply(tmp_path):
    head = api.init("tiny-llama", "math", name="head", runs_dir=tmp_path,
                    overrides=["data.source=local"])
    lm = api.init("tiny-llama", "math", kind="draft-lm", name="lm", runs_dir=tmp_path,
                  overrides=["data.source=local"])
    with pytest.raises(DraftkitError, match="feature_noise=0 for draft.kind=draft-lm"):
        api.train(lm, overrides=["train.feature_noise=0.1"])
    with pytest.raises(DraftkitError, match="like 0.05"):
        api.train(head, overrides=["train.feature_noise=-0.1"])
    with pytest.raises(DraftkitError, match="freeze_head=false for draft.kind=draft-lm"):
        api.train(lm, overrides=["train.freeze_head=true"])


def test_export_without_checkpoint_is_a_clear_error(tmp_path):
    empty = api.init("tiny-llama", "math", name="empty", runs_dir=tmp_path,
                          overrides=["data.source=local"])
    with pytest.raises(DraftkitError, match="draftkit train"):
        api.export(empty, overrides=["export.check=false"])


def _reference_al(run, target, k: int, max_new_tokens: int) -> float:
    """Greedy AL of the trained head (train/best, not the export) in the torch reference
    decoder on the run's eval prompts, with vLLM's EOS and token budget."""
    import datasets

    from draftkit.drafts.eagle_family.drafter import Eagle3Drafter
    from draftkit.drafts.eagle_family.model import Eagle3Draft
    from draftkit.eval.spec_decode import HFTarget, speculative_decode
    from draftkit.serving.counters import SpecCounters

    draft = Eagle3Draft.from_pretrained(artifacts.RunPaths(run).train / "best",
                                        target_model=target.model).eval()
    hf = HFTarget(target.model, aux_layer_ids=draft.spec.aux_layer_ids)
    prompts = datasets.load_from_disk(str(artifacts.RunPaths(run).data / "eval"))["prompt_ids"]
    total = SpecCounters(accepted_per_pos=[0] * k)
    for prompt in prompts[:8]:
        c = speculative_decode(hf, Eagle3Drafter(draft, hf), list(prompt), k, max_new_tokens,
                               eos_id=target.tokenizer.eos_token_id).counters
        total.drafts += c.drafts
        total.accepted += c.accepted
    return total.acceptance_length


@pytest.mark.vllm
def test_export_is_served_by_vllm_with_matching_al(run, tiny_target):
    """The export check serves the head in vLLM on the 8 eval prompts (fp32, T=0, k=3). vLLM's
    AL equals the trained head's AL in the torch reference decoder on the same prompts, and
    stays near the AL simulated at training time. Measured on the AVX-512 EPYC: vLLM 1.185,
    reference 1.216, simulated 1.365 after 8 steps (after 40 steps at lr 3e-3: 1.272, 1.299,
    1.532). vLLM and the reference differ by a few accepted tokens in ~150 drafts (this weak
    head has near-tied logits, and vLLM's CPU linears round differently); the simulation scores
    every answer position, vLLM only those it drafts at, and accepted runs skip the easy ones,
    so vLLM sits below the simulation. An export whose aux ids are off by one (the layer-output
    convention) serves at 1.135: 0.081 from the reference, which the 0.05 tolerance catches."""
    if not (artifacts.RunPaths(run).train / "best").exists():
        api.train(run)
    out = api.export(run, overrides=["export.check=true"])
    spec = json.loads((out / "speculative_config.json").read_text())
    assert spec == {"method": "eagle3", "model": ".", "num_speculative_tokens": 3,
                    "draft_sample_method": "probabilistic"}  # relocatable
    cfg = json.loads((out / "config.json").read_text())
    assert "model_type" not in cfg and cfg["speculators_model_type"] == "eagle3"
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert flag in cfg
    check = json.loads((out / "check.json").read_text())
    m = _eval_metrics(artifacts.RunPaths(run).train)
    a0, a1, a2 = (m[f"cond_acc_{j}"] for j in range(3))
    assert check["sim_al"] == pytest.approx(1 + a0 + a0 * a1 + a0 * a1 * a2)
    assert check["prompts"] == 8 and check["spec"]["drafts"] > 0
    assert check["sim_al"] > 1.2 and check["vllm_al"] > 1.1  # accepted: a random head ~1.0
    ref = _reference_al(run, tiny_target, 3, check["max_new_tokens"])
    print(f"lifecycle: vLLM AL {check['vllm_al']:.3f}, reference {ref:.3f}, simulated "
          f"{check['sim_al']:.3f}")
    assert check["vllm_al"] == pytest.approx(ref, abs=0.05)
    assert check["vllm_al"] == pytest.approx(check["sim_al"], abs=0.25)
    assert check["warning"] is None
    assert config.load(run).draft.num_speculative_tokens == 3


def test_train_step_profile_covers_every_phase_and_counts_padding(run, tmp_path):
    bench = train_step
    cfg = config.load(run)
    with one_thread():
        model, build, plan = bench.setup(run, cfg)
        prof = bench.profile(model, build, plan, cfg, warmup=1, steps=2, top=5)
    lengths = build.source.lengths()
    assert plan == epoch_plan(lengths, cfg.train.batch_tokens, cfg.train.seed, 0,
                              cfg.train.pad_multiple)  # the batches `draftkit train` sees first
    pad = bench.padding(build, plan)
    slots = sum(len(b) * build(b)["input_ids"].shape[1] for b in plan)  # collated shapes
    assert (pad["slots"], pad["tokens"]) == (slots, sum(lengths))
    assert set(prof["phases_s"]) == set(bench.PHASES) and all(prof["phases_s"].values())
    assert len(prof["ops"]) == 5 and prof["loss_tokens_per_step"] > 0
    md = bench.markdown({"source": str(run), "target": cfg.target.name, "hardware": {},
                         "batch_tokens": 1024, "pad_multiple": 64, "ttt_steps": 3,
                         "draft_vocab_size": 256, "padding": pad, **prof})
    assert f"{pad['pad_share']:.1%}" in md
