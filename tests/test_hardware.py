"""dtype `auto` from the hardware (core/hardware.py) with the CPU flags mocked: AVX2-only -> fp32
for every compute dtype, AVX512-BF16 -> bf16 (when measured faster), CUDA -> bf16; explicit
dtypes win with a warning when emulated; meta.json and `draftkit env` say what ran where."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from draftkit.core import artifacts, hardware, provenance
from draftkit.core.config import ConfigError, TrainConfig
from draftkit.init.stage import resolve

AVX2 = "fpu sse sse2 ssse3 sse4_1 sse4_2 fma f16c avx avx2"
AVX512_BF16 = AVX2 + " avx512f avx512bw avx512_vnni avx512_bf16"


@pytest.fixture
def machine(monkeypatch):
    """Detect a mocked machine: machine(flags, cuda=False, speedup=2.0) -> Hardware."""
    monkeypatch.delenv("DRAFTKIT_CPU_BF16", raising=False)

    def make(flags: str, cuda: bool = False, speedup: float = 2.0) -> hardware.Hardware:
        monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("Mock EPYC", set(flags.split())))
        monkeypatch.setattr(hardware, "_torch_cpu", lambda: ("AVX2", False))
        monkeypatch.setattr(hardware, "_cached_bf16_speedup", lambda hw: speedup)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Mock GPU")
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
        hardware.detect.cache_clear()
        return hardware.detect()

    yield make
    hardware.detect.cache_clear()


CONFIGS = [("smollm2-135m", []), ("tiny-llama", []), ("Qwen3-8B", [])]


@pytest.mark.parametrize("target,overrides", CONFIGS)
def test_avx2_only_resolves_every_compute_dtype_to_fp32(machine, target, overrides):
    hw = machine(AVX2)
    assert not hw.cpu_native_bf16 and hw.bf16_speedup is None  # no probe without native bf16
    cfg = resolve(target, "math", overrides=overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default config never asks for an emulated dtype
        got = hardware.compute_dtypes(cfg)
    assert got == dict.fromkeys(["target.dtype", "train.dtype", "data.regen_dtype",
                                 "eval.dtype"], "float32")
    assert isinstance(hardware.torch_dtype("auto"), torch.dtype)
    assert hardware.torch_dtype("auto") == torch.float32
    from draftkit.train.loop import autocast

    assert isinstance(autocast(cfg.train, torch.device("cpu")), contextlib.nullcontext)


@pytest.mark.parametrize("target,overrides", CONFIGS)
def test_native_bf16_cpu_resolves_to_bf16_when_faster(machine, target, overrides):
    cfg = resolve(target, "math", overrides=overrides)
    hw = machine(AVX512_BF16, speedup=2.1)
    assert hw.cpu_native_bf16 and hw.bf16_speedup == 2.1
    assert set(hardware.compute_dtypes(cfg).values()) == {"bfloat16"}
    from draftkit.train.loop import autocast

    ctx = autocast(cfg.train, torch.device("cpu"))
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16
    machine(AVX512_BF16, speedup=0.9)  # native but measured slower: fp32
    assert set(hardware.compute_dtypes(cfg).values()) == {"float32"}
    machine("avx2 amx_tile amx_bf16", speedup=3.0)  # AMX counts as native bf16
    assert hardware.resolve("auto") == "bfloat16"


def test_cuda_resolves_to_bf16(machine):
    hw = machine(AVX2, cuda=True)
    assert hw.device == "cuda" and hw.cuda_name == "Mock GPU"
    cfg = resolve("Qwen3-8B", "math")
    assert set(hardware.compute_dtypes(cfg).values()) == {"bfloat16"}
    assert hardware.resolve("auto", "cpu") == "float32"  # the CPU of a GPU box is still AVX2


def test_explicit_dtype_wins_and_warns_when_emulated(machine):
    machine(AVX2)
    with pytest.warns(hardware.DtypeWarning, match="train.dtype=bfloat16 .* emulated"):
        assert hardware.resolve("bf16", key="train.dtype") == "bfloat16"
    with pytest.warns(hardware.DtypeWarning, match="float16"):
        assert hardware.resolve("fp16") == "float16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.resolve("fp32") == "float32"
        machine(AVX512_BF16)
        assert hardware.resolve("bfloat16", key="eval.dtype") == "bfloat16"  # native: no warning
        assert hardware.resolve("bfloat16", "cuda") == "bfloat16"
    with pytest.raises(ConfigError, match="train.dtype='int8' is not a dtype"):
        hardware.resolve("int8", key="train.dtype")
    with pytest.warns(hardware.DtypeWarning):
        machine(AVX2)
        from draftkit.train.loop import autocast

        autocast(TrainConfig(dtype="bfloat16"), torch.device("cpu"))


def test_env_switch_hides_native_bf16(machine, monkeypatch):
    machine(AVX512_BF16)
    monkeypatch.setenv("DRAFTKIT_CPU_BF16", "0")
    hardware.detect.cache_clear()
    hw = hardware.detect()
    assert not hw.cpu_native_bf16 and "avx512_bf16" not in hw.cpu_flags
    assert hardware.resolve("auto") == "float32"


def test_cpuinfo_parsing_and_meta_records_the_machine(machine, tmp_path):
    hw = machine(AVX512_BF16 + " sse4a")
    assert hw.cpu_model == "Mock EPYC"
    assert hw.cpu_flags == ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni")
    cfg = resolve("tiny-llama", "math", overrides=["eval.dtype=float32"])
    meta = provenance.write_meta(tmp_path, "test", cfg.to_dict())
    saved = artifacts.read_json(tmp_path / "meta.json")
    assert saved["hardware"] == meta["hardware"]
    assert saved["hardware"]["cpu_model"] == "Mock EPYC"
    assert "avx512_bf16" in saved["hardware"]["cpu_flags"]
    assert saved["hardware"]["cpu_bf16_matmul_speedup"] == 2.0
    assert saved["resolved_dtypes"]["eval.dtype"] == "float32"
    assert saved["resolved_dtypes"]["train.dtype"] == "bfloat16"


def test_cpuinfo_file_is_parsed(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                    f"flags\t\t: {AVX2}\n\nprocessor\t: 1\nmodel name\t: other\n"
                    "flags\t\t: avx512_bf16\n")
    assert hardware._cpuinfo(str(info)) == ("AMD EPYC 7B13", set(AVX2.split()))
    model, flags = hardware._cpuinfo(str(tmp_path / "missing"))  # not Linux: platform's name
    assert model and flags == set()


def test_draftkit_env_prints_device_flags_versions_plugin_and_auto(machine, capsys):
    machine(AVX2)
    from draftkit.cli import run

    with pytest.warns(hardware.DtypeWarning):
        assert run(["env", "train.dtype=bf16"]) == 0
    out = capsys.readouterr().out
    assert "cpu           Mock EPYC" in out and "avx2" in out and "avx512_bf16" not in out
    assert "torch         " + torch.__version__ in out
    assert "vLLM plugin   registered=" in out
    assert "target.dtype     auto      -> float32" in out
    assert "train.dtype      bf16      -> bfloat16" in out
