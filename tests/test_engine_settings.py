"""Engine settings (core/engine_settings.py): the run config's `engine` section resolved on the
hardware (tensor parallel from the GPUs' memory, CUDA graphs on CUDA, eager and vLLM's thread
binding on a CPU until measured otherwise), and every engine draftkit starts gets them through
serving/vllm_engine.py: the values reach `vllm.LLM(...)` (a recording stand-in) and the
binding reaches the environment the engine process starts with."""

from __future__ import annotations

import dataclasses
import os

import pytest

from draftkit.core import config, engine_settings, hardware
from draftkit.env_report import render, report
from draftkit.init.stage import init_run

CPU = hardware.Hardware(device="cpu", cpu_model="test cpu", cpu_flags=("avx2",),
                        torch_cpu_capability="AVX2", torch_cpu_bf16=False)
GPU = dataclasses.replace(CPU, device="cuda", cuda_name="test gpu", cuda_bf16=True)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_HOME", str(tmp_path / "home"))  # no recorded measurements


def gpus(monkeypatch, count: int, gib: int) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (gib << 30, gib << 30))


def qwen3_8b(*overrides: str) -> config.RunConfig:
    from draftkit.init.stage import resolve

    return resolve("Qwen3-8B", "math", overrides=list(overrides))


def test_gpu_auto_tensor_parallel_and_cuda_graphs(monkeypatch):
    cfg = qwen3_8b()
    gpus(monkeypatch, 8, 80)  # Qwen3-8B in bf16 (16 GB) fits one 80 GB GPU
    s = engine_settings.for_run(cfg, hw=GPU)
    assert (s.tensor_parallel_size, s.enforce_eager, s.cpu_threads_bind) == (1, False, None)
    assert s.llm_kwargs() == {"tensor_parallel_size": 1, "enforce_eager": False}
    gpus(monkeypatch, 4, 16)  # 16 GiB GPUs: two share the weights
    assert engine_settings.for_run(cfg, hw=GPU).tensor_parallel_size == 2
    gpus(monkeypatch, 4, 4)  # never more ranks than GPUs
    assert engine_settings.for_run(cfg, hw=GPU).tensor_parallel_size == 4
    s = engine_settings.for_run(qwen3_8b("engine.tensor_parallel_size=2",
                                         "engine.gpu_memory_utilization=0.8",
                                         "engine.data_parallel_size=2"), hw=GPU,
                                regeneration=True)
    assert s.llm_kwargs() == {"tensor_parallel_size": 2, "enforce_eager": False,
                              "data_parallel_size": 2, "gpu_memory_utilization": 0.8}
    assert "data_parallel_size" not in engine_settings.for_run(
        qwen3_8b("engine.data_parallel_size=2"), hw=GPU).llm_kwargs()  # regeneration only


def test_cpu_defaults_are_todays_until_a_measurement_is_recorded():
    cfg = config.from_dict({})
    s = engine_settings.for_run(cfg, hw=CPU)
    assert (s.tensor_parallel_size, s.enforce_eager, s.env()) == (1, True, {})
    assert "not yet measured" in s.why["cpu_threads_bind"]
    engine_settings.record("cpu_threads_bind", "all", {"vllm|eager=True": 100.0}, hw=CPU)
    engine_settings.record("cpu_enforce_eager", False, {}, hw=CPU)
    s = engine_settings.for_run(cfg, hw=CPU)
    assert s.env() == {"VLLM_CPU_OMP_THREADS_BIND": engine_settings.all_cores_mask()}
    assert s.enforce_eager is False and "measured" in s.why["enforce_eager"]
    pinned = config.from_dict({"engine": {"cpu_threads_bind": "vllm", "enforce_eager": True}})
    s = engine_settings.for_run(pinned, hw=CPU)  # an explicit setting beats the measurement
    assert (s.env(), s.enforce_eager) == ({}, True)
    mask = config.from_dict({"engine": {"cpu_threads_bind": "0"}})
    assert engine_settings.for_run(mask, hw=CPU).env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}


def test_all_cores_mask_names_this_process_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 5})
    assert engine_settings.all_cores_mask() == "0-2,5"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert engine_settings.all_cores_mask() == "0-1"


class RecordingLLM:
    """Stands in for vllm.LLM: records its keywords and the thread binding its engine process
    would start with; generates nothing."""
    calls: list[tuple[dict, str | None]] = []

    def __init__(self, **kwargs):
        RecordingLLM.calls.append((kwargs, os.environ.get("VLLM_CPU_OMP_THREADS_BIND")))

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[])]) for _ in prompts]


@pytest.fixture
def recorder(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    RecordingLLM.calls.clear()
    return RecordingLLM.calls


ENGINE = ["engine.tensor_parallel_size=2", "engine.enforce_eager=false",
          "engine.cpu_threads_bind=all", "engine.data_parallel_size=2"]


def test_run_settings_reach_the_llm_call_of_eval_and_regeneration(tmp_path, recorder,
                                                                  tiny_target):
    from draftkit.prepare import regen
    from draftkit.serving import speculative, vllm_engine
    from draftkit.targets.load import target_dir

    run = init_run("tiny-llama", "math", runs_dir=tmp_path,
                   overrides=[*ENGINE, "data.regen_batch_size=32"])
    cfg = config.load(run)
    # eval and export's parity check: run_engine_spec
    vllm_engine.start(vllm_engine.run_engine_spec(cfg, speculative.ngram_config(3), [[1, 2, 3]]))
    kwargs, bind = recorder[-1]
    assert (kwargs["tensor_parallel_size"], kwargs["enforce_eager"]) == (2, False)
    assert "data_parallel_size" not in kwargs  # regeneration only
    assert kwargs["speculative_config"]["method"] == "ngram"
    assert bind == engine_settings.all_cores_mask()  # set while the engine process spawns...
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # ...and not after
    # prepare's regeneration
    gen = regen.Generator(cfg, tiny_target.tokenizer, target_dir("tiny-llama"))
    gen.generate([regen.Request([1, 2, 3], 4, 0.0, 1.0, 0)])
    kwargs, bind = recorder[-1]
    assert (kwargs["tensor_parallel_size"], kwargs["data_parallel_size"],
            kwargs["enforce_eager"], kwargs["max_num_seqs"]) == (2, 2, False, 32)
    assert bind == engine_settings.all_cores_mask()


def test_an_engine_without_a_run_gets_this_machines_defaults_and_extra_wins(recorder):
    from draftkit.serving import vllm_engine
    from draftkit.targets.load import target_dir

    model = str(target_dir("tiny-llama"))
    vllm_engine.start(vllm_engine.EngineSpec(model=model, dtype="float32"))
    kwargs, bind = recorder[-1]
    assert (kwargs["tensor_parallel_size"], kwargs["enforce_eager"], bind) == (1, True, None)
    assert kwargs["disable_log_stats"] is False and kwargs["max_num_seqs"] == 64
    vllm_engine.start(vllm_engine.EngineSpec(model=model, enforce_eager=False,
                                             extra={"tensor_parallel_size": 4}))
    kwargs, _ = recorder[-1]
    assert (kwargs["tensor_parallel_size"], kwargs["enforce_eager"]) == (4, False)


def test_draftkit_env_shows_what_the_engines_get():
    rep = report(None, ["engine.cpu_threads_bind=all", "engine.tensor_parallel_size=1"])
    bind = rep["engine"]["engines"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert bind["value"] == engine_settings.all_cores_mask() and "every core" in bind["why"]
    assert rep["engine"]["regeneration"]["max_num_seqs"]["value"] == 64
    text = render(rep)
    assert "vLLM engines" in text and "tensor_parallel_size      1" in text
