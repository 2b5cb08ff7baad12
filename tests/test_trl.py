"""draftkit.integrations.trl without an engine: the TRL version check at import names the fix,
the config refuses what it cannot serve, and the engine's speculative config is the export's
(serving.json's one-engine schedule where it serves the draft's method); the draft's taps
copied out of TRL's own loss forward (TrainerTaps, on TRL's GRPOTrainer without vLLM) equal the
features a refresh computes itself, and a refresh given them runs no policy pass over their rows.
The trainer end to end: tests/test_trl_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from draftkit.core.errors import DraftkitError


def _import_with_trl(stub_dir) -> subprocess.CompletedProcess:
    code = "import sys; sys.path.insert(0, sys.argv[1]); import draftkit.integrations.trl"
    return subprocess.run([sys.executable, "-c", code, str(stub_dir)], capture_output=True,
                          text=True, timeout=300)


def test_import_refuses_another_trl_version_and_names_the_fix(tmp_path):
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    out = _import_with_trl(tmp_path)
    assert out.returncode != 0
    assert "tested with trl==1.16.0" in out.stderr and "trl==0.0.1" in out.stderr
    assert "pip install 'draftkit[trl]'" in out.stderr


def _export_with_serving(tmp_path):
    """A run dir whose export serves eagle3 k=3 and whose serving.json picked the draft (k 2) at
    batch 1-7 and no speculation from batch 8, measured at T 0 and 1 by one engine on this
    machine (its conditions: serving/conditions.py)."""
    from draftkit.core import hardware
    from draftkit.serving import conditions

    export = tmp_path / "run" / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    own = {"method": "eagle3", "model": ".", "num_speculative_tokens": 3}
    (export / "speculative_config.json").write_text(json.dumps(own))
    t = {"0.0": {"speedup": 1.1}, "1.0": {"speedup": 1.05}}
    (export / "serving.json").write_text(json.dumps({
        "schedule": None, "measured": {"temperatures": [0.0, 1.0], "engine": conditions.engine(
            1, 1, hardware.resolve("auto"))}, "ranges": [
            {"batch_from": 1, "batch_to": 7, "method": "eagle3", "k": 2, "by_temperature": t,
             "speculative_config": {**own, "num_speculative_tokens": 2}},
            {"batch_from": 8, "batch_to": None, "method": "none", "k": None,
             "by_temperature": t, "speculative_config": None}]}))
    return tmp_path / "run", export


def test_the_config_refuses_what_it_cannot_serve():
    from draftkit.integrations.trl import DraftkitConfig

    with pytest.raises(DraftkitError, match="needs run="):
        DraftkitConfig()
    with pytest.raises(DraftkitError, match="needs run="):
        DraftkitConfig(method="auto")
    with pytest.raises(DraftkitError, match="one of"):
        DraftkitConfig(method="medusa")


def test_auto_serves_serving_jsons_pick_for_the_generation_batch_and_temperature(tmp_path):
    """method="auto" at batch 4: the draft at the range's k (refreshes go on); at batch 16: no
    speculation (the draft is not served); method="draft" at batch 16 serves the draft and
    says what serving.json picked there; an unmeasured T is named."""
    from draftkit.rl.in_loop import DraftkitConfig, SpeculativeRollouts

    run, export = _export_with_serving(tmp_path)
    small = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto"))
    small.choose(4)
    assert small.speculative["num_speculative_tokens"] == 2 and small.serves_draft
    assert small.events[-1]["served"] == "eagle3"
    big = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto"))
    big.choose(16)
    assert big.speculative is None and not big.serves_draft
    assert "weight_transfer_config" not in big.engine_kwargs()  # no swappable drafter
    draft = SpeculativeRollouts(DraftkitConfig(run=str(run)))
    draft.temperature = 0.7
    draft.choose(16)
    assert draft.speculative["method"] == "eagle3" and draft.serves_draft
    event = draft.events[-1]
    assert "measured none fastest at batch 8-" in event["advice"]
    assert "DraftkitConfig(method='auto')" in event["advice"]
    assert "not T=0.7" in event["note"]



def test_auto_with_an_explicit_k_serves_the_pick_at_that_k(tmp_path):
    """method="auto" with k: serving.json's pick for the batch still decides the method (no
    speculation at batch 16, where the draft measured slower), k only sets its length."""
    from draftkit.rl.in_loop import DraftkitConfig, SpeculativeRollouts

    run, _ = _export_with_serving(tmp_path)
    big = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto", k=3))
    big.choose(16)
    assert big.speculative is None and not big.serves_draft
    assert big.events[-1]["served"] == "none"
    small = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto", k=1))
    small.choose(4)
    assert small.speculative["method"] == "eagle3" and small.serves_draft
    assert small.speculative["num_speculative_tokens"] == 1
    assert "num_speculative_tokens_per_batch_size" not in small.speculative

def test_auto_serves_no_speculation_where_serving_json_measured_other_conditions(
        tmp_path, monkeypatch):
    """method="auto": serving.json measured its pick with one engine on this node; a loop of 2
    trainer processes (TRL's external launcher, LOCAL_WORLD_SIZE=2) gives each worker half the
    cores, a TP 2 engine or a serving.json with no conditions (an older draftkit) differ, and
    auto serves no speculation with an event naming the difference and the eval that measures
    under the loop's conditions. The loop's own conditions: the pick."""
    from draftkit.rl.in_loop import DraftkitConfig, SpeculativeRollouts
    from draftkit.serving import conditions

    run, export = _export_with_serving(tmp_path)
    trl_kwargs = {"distributed_executor_backend": "external_launcher",
                  "tensor_parallel_size": 1}
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    same = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto"))
    same.choose(4, trl_kwargs)
    assert same.speculative["method"] == "eagle3" and same.serves_draft
    assert "why" not in same.events[-1]
    here = conditions.engine(1, 1, "float32")
    cases = [({"LOCAL_WORLD_SIZE": "2"}, trl_kwargs, "cpu_cores_per_worker: measured "),
             ({}, {"tensor_parallel_size": 2}, "tensor_parallel_size: measured 1, here 2")]
    if here["cpu_cores_per_worker"] < 2:  # one core: 2 workers cannot halve it
        cases = cases[1:]
    for env, kwargs, want in cases:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        loop = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto"))
        loop.choose(4, kwargs)
        assert loop.speculative is None and not loop.serves_draft
        event = loop.events[-1]
        assert event["served"] == "none" and want in event["why"]
        assert "`draftkit eval RUN engine.tensor_parallel_size=" in event["why"]
    serving = json.loads((export / "serving.json").read_text())
    del serving["measured"]["engine"]
    (export / "serving.json").write_text(json.dumps(serving))
    old = SpeculativeRollouts(DraftkitConfig(run=str(run), method="auto"))
    old.choose(4)
    assert old.speculative is None and "older draftkit" in old.events[-1]["why"]


def test_engine_conditions_count_the_cores_of_a_mask_and_name_the_fix():
    from draftkit.serving import conditions

    assert [conditions.cores_in_mask(m) for m in ("0", "0-1", "0,2-3", "auto", None)] == \
        [1, 2, 3, None, None]
    assert conditions.cores_in_mask("0|1-3", local_rank=1) == 3
    one = conditions.engine(1, 1, "float32", bind="0")
    assert one["cpu_cores_per_worker"] == 1 or one["device"] == "cuda"
    assert conditions.differences(one, dict(one)) == []
    assert conditions.differences({**one, "dtype": "bfloat16"}, one) == [
        "dtype: measured bfloat16, here float32"]
    if one["device"] == "cpu":
        assert "engine.cpu_threads_bind=0`" in conditions.fix(one)
        assert "engine.cpu_threads_bind=0-2`" in conditions.fix({**one, "cpu_cores_per_worker": 3})


# ------------------------------------------------------------------ taps from TRL's loss forward

TAPPED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


@pytest.fixture(scope="module")
def tapped(tmp_path_factory, tiny_target):
    """One step of TRL's own GRPOTrainer (transformers generates: no vLLM) on tiny-llama at
    lr 0, so the weights after the step are the ones the loss forward ran, with TrainerTaps on
    its compute_loss; the batches compute_loss got come along (TRL left-pads the prompts)."""
    from _rl_helpers import AUX, make_run, save_policy
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from draftkit.integrations.trl import TrainerTaps

    tmp = tmp_path_factory.mktemp("taps")
    policy_dir = save_policy(tiny_target, tmp / "policy")
    words = "apples books cookies students dollars hours".split()
    questions = [f"{words[i % 6]} {i * 7}" + " per day" * (i % 3) + f", how many {words[i % 5]}?"
                 for i in range(4)]  # prompts of different lengths: TRL left-pads them

    def zero_reward(completions, **kwargs):
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp / "out"), use_vllm=False, use_cpu=True, bf16=False,
                      per_device_train_batch_size=8, num_generations=2, max_completion_length=8,
                      max_steps=1, learning_rate=0.0, logging_steps=1, report_to="none",
                      save_strategy="no", disable_tqdm=True, seed=0)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=args,
                          processing_class=AutoTokenizer.from_pretrained(policy_dir),
                          train_dataset=Dataset.from_dict(
                              {"prompt": [[{"role": "user", "content": q}] for q in questions]}))
    seen, loss = [], trainer.compute_loss

    def recording(model, inputs, *a, **kw):
        seen.append({k: inputs[k].clone() for k in TAPPED})
        return loss(model, inputs, *a, **kw)

    trainer.compute_loss = recording
    taps = TrainerTaps(trainer, AUX)
    trainer.train()
    rows = [(b["prompt_ids"][i][b["prompt_mask"][i].bool()].tolist(),
             b["completion_ids"][i][b["completion_mask"][i].bool()].tolist())
            for b in seen for i in range(len(b["prompt_ids"]))]
    return {"taps": taps, "rows": rows, "model": model, "tokenizer": trainer.processing_class,
            "tmp": tmp, "target": tiny_target, "run": make_run(tmp / "runs", tiny_target)}


def _rollouts(rows) -> list:
    from draftkit.rl.rollouts import Rollout

    return [Rollout(p + c, [0] * len(p) + [1] * len(c), len(p), f"trl:{i}")
            for i, (p, c) in enumerate(rows)]


def test_taps_from_trls_loss_forward_equal_the_refresh_capture(tapped):
    """The states TrainerTaps copied out of TRL's compute_loss (left-padded prompts, right-padded
    completions, gradients on) are the features rl/capture.py computes with its own pass, to
    fp32 rounding (1e-5 of each tensor's largest value)."""
    from _rl_helpers import AUX

    from draftkit.core import config
    from draftkit.drafts import kind as kinds
    from draftkit.rl import capture
    from draftkit.rl.policy import from_model
    from draftkit.rl.publish import DraftStore

    taps, rows, run = tapped["taps"], tapped["rows"], tapped["run"]
    assert len(rows) == 8 and len({len(p) for p, _ in rows}) > 1  # TRL left-padded prompts
    assert set(taps.taps.rows) == {tuple(p + c) for p, c in rows}
    n = len(tapped["model"].model.layers)
    assert taps.layer_ids == sorted({*AUX, n})
    cfg = config.load(run)
    kind = kinds.get(cfg.draft.kind)
    policy = from_model(tapped["model"], tapped["tokenizer"])
    store = DraftStore(run)
    draft = kind.load(store.current_dir(), policy.model, cfg.draft.num_speculative_tokens)
    own = capture.capture(kind, draft, policy, _rollouts(rows), cfg, store, "own")  # online
    compared = 0
    for batch in own.batches:
        for b, length in enumerate(batch["attention_mask"].sum(-1).tolist()):
            states = taps.taps.rows[tuple(batch["input_ids"][b, :length].tolist())]
            aux = torch.cat([states[i] for i in AUX], dim=-1)  # [T, 3*H]
            for own_f, tap in ((batch["aux"][b, :length], aux),
                               (batch["last"][b, :length], states[n])):
                # fp32 rounding: TRL's left padding moves the positions RoPE turns
                scale = float(tap.abs().max())
                torch.testing.assert_close(own_f, tap, atol=1e-5 * scale, rtol=1e-5)
            compared += 1
    assert compared == len(rows)


def test_tapped_kind_computes_only_the_rows_the_taps_miss(tapped):
    from _rl_helpers import AUX

    from draftkit.drafts import kind as kinds
    from draftkit.rl import capture
    from draftkit.rl.drift import pad_rows
    from draftkit.rl.publish import DraftStore

    kind, model = kinds.get("eagle3"), tapped["model"]
    draft = kind.load(DraftStore(tapped["run"]).current_dir(), model, 3)
    rows = _rollouts(tapped["rows"][:4])
    batch = pad_rows(rows)
    some = capture.Taps({k: v for k, v in tapped["taps"].taps.rows.items()
                         if k != tuple(rows[2].input_ids)})
    tk = capture.TappedKind(kind, some)
    got = tk.features(draft, model, batch["input_ids"], batch["attention_mask"])
    want = kind.features(draft, model, batch["input_ids"], batch["attention_mask"])
    valid = batch["attention_mask"].bool()
    for name in ("aux", "last"):
        torch.testing.assert_close(got[name][valid], want[name][valid], atol=1e-5, rtol=1e-5)
    assert tk.stats["computed_rows"] == 1 and tk.stats["forwards"] == 1
    assert tk.stats["rows"] == 3 and got["aux"].shape[-1] == len(AUX) * want["last"].shape[-1]


def _forwarded(model) -> tuple[list, object]:
    """Rows (token ids) the policy's decoder runs over, recorded by a pre-hook."""
    seen = []

    def record(_m, _args, kwargs):
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None or mask is None:
            raise AssertionError("the policy's decoder ran without input_ids/attention_mask")
        seen.extend(tuple(ids[b, :n].tolist()) for b, n in enumerate(mask.sum(-1).tolist()))

    return seen, model.model.register_forward_pre_hook(record, with_kwargs=True)


def test_a_refresh_given_the_taps_runs_no_policy_pass_over_their_rows(tapped):
    """The same refresh with and without the taps: without, the policy runs over the train rows
    (capture) and the held-out rows (the AL gate); with them, over the held-out rows only, the
    lineage counts every train row as read from the taps, and the fine-tune starts from the same
    loss."""
    from _rl_helpers import make_run

    from draftkit.rl.job import refresh
    from draftkit.rl.policy import from_model

    rows, tmp = tapped["rows"], tapped["tmp"]
    path = tmp / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": c, "policy_step": 0}) +
                            "\n" for p, c in rows))
    overrides = ["refresh.budget_steps=2", "refresh.gate=false", "refresh.lr=1e-5"]
    policy = from_model(tapped["model"], tapped["tokenizer"], step=1)
    out = {}
    for name, taps in (("own", None), ("tapped", tapped["taps"].taps)):
        run = make_run(tmp / "runs", tapped["target"], name=f"refresh-{name}")
        seen, hook = _forwarded(tapped["model"])
        try:
            res = refresh(run, policy, [path], overrides, taps=taps)
        finally:
            hook.remove()
        assert res["status"] == "published"
        out[name] = (res["lineage"], set(seen))
    own, (lineage, seen) = out["own"], out["tapped"]
    train = own[1] - seen  # rows only the refresh without taps ran the policy over
    assert train and lineage["rows"]["train"] == len(train)
    assert not train & seen and seen  # with the taps: the held-out rows only (the AL gate)
    taps = lineage["capture"]["taps"]
    assert (taps["rows"], taps["computed_rows"], taps["forwards"]) == (len(train), 0, 0)
    assert lineage["loss"]["first"] == pytest.approx(own[0]["loss"]["first"], rel=1e-4)


def test_trl_serve_command_is_trls_with_draftkits_flags(tmp_path):
    """integrations/trl_serve.py: TRL's own `vllm serve` command line (NCCL weight transfer,
    logprobs settings, the user's TRL arguments) through vLLM's server module, plus the draft
    and draftkit's swap flags; the server end to end: tests/test_trl_serve_vllm.py."""
    from draftkit.integrations import trl_serve

    _, export = _export_with_serving(tmp_path)
    argv = trl_serve.command(str(export), ["--model", "/m", "--port", "8001",
                                           "--data_parallel_size", "2"], k=2)
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert argv[argv.index("--port") + 1] == "8001"
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": str(export), "num_speculative_tokens": 2}
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert argv[argv.index("--worker-extension-cls") + 1].endswith("DrafterSwap")
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
