"""draftkit.integrations.trl without an engine: the TRL version check at import names the fix,
the config refuses what it cannot serve, and the engine's speculative config is the export's
(serving.json's one-engine schedule where it serves the draft's method). The trainer end to end:
tests/test_trl_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


def test_config_and_the_engine_speculative_config(tmp_path):
    from draftkit.integrations.trl import DraftkitConfig, draft_speculative_config

    with pytest.raises(DraftkitError, match="needs run="):
        DraftkitConfig()
    with pytest.raises(DraftkitError, match="one of"):
        DraftkitConfig(method="medusa")
    export = tmp_path / "export"
    export.mkdir()
    own = {"method": "eagle3", "model": ".", "num_speculative_tokens": 3}
    (export / "speculative_config.json").write_text(json.dumps(own))
    assert draft_speculative_config(export) == {**own, "model": str(export.resolve())}
    assert draft_speculative_config(export, k=2)["num_speculative_tokens"] == 2
    sched = {**own, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, None, 1]]}
    (export / "serving.json").write_text(json.dumps({"schedule": {"speculative_config": sched}}))
    assert draft_speculative_config(export) == {**sched, "model": str(export.resolve())}
    fixed = draft_speculative_config(export, k=1)  # an explicit k replaces the schedule
    assert "num_speculative_tokens_per_batch_size" not in fixed
    assert fixed["num_speculative_tokens"] == 1
    other = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    (export / "serving.json").write_text(json.dumps({"schedule": other}))
    assert draft_speculative_config(export)["method"] == "eagle3"  # a schedule of another method
