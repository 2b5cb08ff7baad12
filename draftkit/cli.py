"""`draftkit` command line: a thin layer over the Python API, one verb per lifecycle stage.

Every verb after `init` takes a run dir and optional `key=value` config overrides, e.g.
`draftkit train runs/demo train.max_steps=50`. Defaults live in config.py, never here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from draftkit import __version__
from draftkit.core import config, registry
from draftkit.core.errors import DraftkitError
from draftkit.step_projection import project_step
from draftkit.step_projection import render as render_step

# the lifecycle verbs that take a run dir and key=value overrides: verb -> help (each calls the
# api.py function of its name, `eval` api.evaluate: `_stage`)
STAGES = {
    "prepare": "template, regenerate with the target, mask, count",
    "harvest": "capture the target's hidden states to shards",
    "train": "train the run's draft, any kind (train.mode stored | online)",
    "export": "write the vLLM/speculators draft dir (+ vLLM check; copies eval's serving pick)",
    "eval": "measure AL and speedup (reference and/or vLLM); picks the method and k to serve",
}


def _csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x != ""]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="draftkit", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"draftkit {__version__}",
                   help="print draftkit's version and exit")
    sub = p.add_subparsers(dest="verb", required=True)

    q = sub.add_parser("init", help="scaffold runs/<name>/draftkit.yaml")
    q.add_argument("--target", required=True, help="registry name, hub id or local HF dir")
    q.add_argument("--data", default=None, help="data recipe name (data_recipes/*.yaml); "
                   "optional with --from-draft")
    q.add_argument("--draft", default=None,
                   help="draft kind: eagle3 | draft-lm | peagle | pard | dflash (drafts/); "
                        f"default {config.DEFAULT_KIND}, with --from-draft the draft's own kind")
    q.add_argument("--k", type=int, default=None, help="speculative tokens per step")
    q.add_argument("--name", default=None,
                   help="run name, the dir under --dir (default <target>-<data>-<draft>)")
    q.add_argument("--dir", default="runs", help="parent directory of run dirs")
    q.add_argument("--force", action="store_true", help="overwrite an existing run config")
    q.add_argument("--from-draft", default=None, metavar="SRC",
                   help="start from a trained draft: a local dir or a Hugging Face hub id "
                        "(speculators EAGLE-3/P-EAGLE, SpecForge EAGLE-3); see "
                        "docs/coming-from-speculators.md")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")

    q = sub.add_parser("config", help="inspect a run config")
    q.add_argument("action", choices=["show"], help="show: print the resolved config")
    q.add_argument("run", help="run dir (or its draftkit.yaml)")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")

    q = sub.add_parser("plan", help="what a run takes on this machine: tokens, disk, memory, "
                                    "time per stage (estimates)")
    q.add_argument("run", help="run dir (or its draftkit.yaml)")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")
    q.add_argument("--hardware", default="", help="plan for a stored hardware profile (h200, "
                   "h100, a measured CPU kind) instead of this machine")

    q = sub.add_parser("targets", help="list the registered targets")

    q = sub.add_parser("env", help="hardware, versions, vLLM plugin, what dtype auto resolves to")
    q.add_argument("run", nargs="?", default=None, help="a run dir (default: config defaults)")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")

    for verb, help_ in STAGES.items():
        q = sub.add_parser(verb, help=help_)
        q.add_argument("run", help="run dir (or its draftkit.yaml)")
        q.add_argument("overrides", nargs="*", help="key=value config overrides")
        if verb == "export":
            q.add_argument("--out", default=None, help="export dir (default <run>/export)")
            q.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                           help="load the export in vLLM and compare AL (default: config)")
        if verb == "eval":
            q.add_argument("--engine", choices=["reference", "vllm", "both"], default=None,
                           help="vllm: speed and AL in vLLM; reference: the torch decoder's AL; "
                                "both (default: eval.engine)")
            q.add_argument("--k", type=_csv(int), default=None, help="e.g. 1,2,3,4,5")
            q.add_argument("--temperature", type=_csv(float), default=None, help="e.g. 0,1")
            q.add_argument("--batch", type=_csv(int), default=None, help="e.g. 1,8")

    _add_rl_verbs(sub)

    q = sub.add_parser("status", help="where a run's draft stands: current version and its "
                                      "lineage, what each engine serves (asked live), the last "
                                      "refresh and swap, failed versions")
    q.add_argument("run", help="run dir (or its draftkit.yaml)")
    q.add_argument("--json", action="store_true", help="print JSON instead of text")
    q.add_argument("--timeout", type=float, default=None,
                   help="seconds each engine may take to answer (refresh.status_timeout_s)")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")

    q = sub.add_parser("diagnose", help="why the draft accepts what it does: causes ranked, "
                                        "each with its figure and fix (Markdown, PNG, JSON)")
    q.add_argument("run", help="run dir (or its draftkit.yaml)")
    q.add_argument("--rollouts", nargs="+", default=None,
                   help="JSONL files or dirs (default: the run's held-out split)")
    q.add_argument("--policy", default=None, help="policy checkpoint that wrote the rollouts "
                                                  "(default: the run's target)")
    q.add_argument("overrides", nargs="*", help="key=value config overrides")

    q = sub.add_parser("swap", help="swap a draft into running rollout servers (vllm serve), "
                                    "checked and rolled back per engine")
    q.add_argument("urls", nargs="+", help="server URLs, e.g. http://10.0.0.5:8000")
    q.add_argument("--draft", required=True, help="runs/NAME/drafts/current (or vNNNN, export)")
    q.set_defaults(overrides=[])  # key=value overrides of the run's config (refresh.*)

    q = sub.add_parser("project", help="project the RL step speedup from a rollout speedup")
    q.add_argument("--rollout-speedup", type=float, required=True,
                   help="generation speedup with speculation, e.g. draftkit eval's tok/s ratio")
    q.add_argument("--generation-s", type=float, required=True, help="generation time per step")
    q.add_argument("--step-s", type=float, required=True, help="whole RL step time")
    q.add_argument("--mode", choices=["sync", "async"], default="sync",
                   help="sync: generation and training alternate; async: they overlap")
    q.add_argument("--other-delta-s", type=float, default=0.0,
                   help="change of the non-generation step time with speculation (see step_projection.py)")
    return p


def _add_rl_verbs(sub) -> None:
    """drift / refresh / watch (draftkit/rl/): flags are shorthands for refresh.* keys."""
    for verb, help_ in (("drift", "estimate the current draft's AL against a policy on rollouts"),
                        ("refresh", "fine-tune the draft on a new policy's rollouts; publish "
                                    "drafts/vNNNN if better"),
                        ("watch", "daemon: refresh from an RL run's checkpoint/rollout dirs")):
        q = sub.add_parser(verb, help=help_)
        q.add_argument("run", help="run dir (or its draftkit.yaml)")
        if verb == "watch":
            q.add_argument("--checkpoints", required=True, help="dir of policy checkpoints")
            q.add_argument("--rollouts", required=True, help="dir of rollout *.jsonl")
            q.add_argument("--every", type=int, default=None, help="refresh every N steps")
            q.add_argument("--al-drop", type=float, default=None,
                           help="refresh when AL falls below (1 - X) x AL at publish")
            q.add_argument("--once", action="store_true", help="one scan, then exit")
            q.add_argument("--engines", type=_csv(str), default=None,
                           help="rollout servers to push every published draft to: URL,URL")
        else:
            q.add_argument("--policy", required=True, help="policy checkpoint (HF dir)")
            q.add_argument("--rollouts", required=True, nargs="+", help="JSONL files or dirs")
        if verb == "refresh":
            q.add_argument("--replay", type=int, default=None, help="older rollout rows to mix in")
            q.add_argument("--policy-step", type=int, default=None,
                           help="RL step of the checkpoint (default: from the rollouts)")
            budget = q.add_mutually_exclusive_group()
            budget.add_argument("--budget-steps", type=int, default=None,
                                help="optimizer steps of the fine-tune (refresh.budget_steps)")
            budget.add_argument("--budget-s", type=float, default=None,
                                help="wall-clock seconds of the fine-tune (refresh.budget_s)")
        q.add_argument("overrides", nargs="*", help="key=value config overrides")


def _run_rl(api, args: argparse.Namespace) -> None:
    over = list(args.overrides)
    if args.verb != "watch":  # `--rollouts a.jsonl b.jsonl key=value`: nargs takes the override
        paths = args.rollouts
        args.rollouts = [p for p in paths if "=" not in p or Path(p).exists()]
        over = [p for p in paths if p not in args.rollouts] + over
    if args.verb == "refresh":
        for attr, key in (("replay", "replay"), ("budget_steps", "budget_steps"),
                          ("budget_s", "budget_s")):
            if getattr(args, attr) is not None:
                over.append(f"refresh.{key}={getattr(args, attr)}")
        if args.budget_s is not None:
            over.append("refresh.budget_steps=0")  # the time budget alone decides
        if args.budget_steps is not None:
            over.append("refresh.budget_s=0")
    if args.verb == "drift":
        api.drift(Path(args.run), Path(args.policy), args.rollouts, over)
    elif args.verb == "refresh":
        api.refresh(Path(args.run), Path(args.policy), args.rollouts, over,
                    policy_step=args.policy_step)
    else:
        api.watch(Path(args.run), args.checkpoints, args.rollouts, over, args.every,
                  args.al_drop, args.once, engines=args.engines)


def _api_verb(args: argparse.Namespace) -> None:
    """A verb that calls api.py (and prints what it returns, where it returns a report)."""
    from draftkit import api, env_report  # on use: loads torch (fast start)
    from draftkit.init import plan, stage  # on use, as api
    from draftkit.rl import status  # on use, as api

    if args.verb == "init":
        run_dir = api.init(args.target, args.data, args.draft, args.k, args.name, args.dir,
                           args.force, args.overrides, from_draft=args.from_draft)
        print(stage.next_steps(run_dir, config.load(run_dir)))
    elif args.verb == "plan":
        print(plan.render(api.plan(Path(args.run), args.overrides, hardware_name=args.hardware)))
    elif args.verb == "env":
        if args.run and "=" in args.run and not Path(args.run).exists():  # `env key=value`
            args.run, args.overrides = None, [args.run, *args.overrides]
        print(env_report.render(env_report.report(args.run, args.overrides)))
    elif args.verb == "swap":
        urls = [u for u in args.urls if "=" not in u]  # `swap URL key=value`: an override
        api.swap(urls, args.draft, [*(u for u in args.urls if "=" in u), *args.overrides])
    elif args.verb == "status":
        over = [*args.overrides, *([f"refresh.status_timeout_s={args.timeout}"]
                                   if args.timeout is not None else [])]
        s = api.status(Path(args.run), over)
        print(json.dumps(s, indent=2, default=str) if args.json else status.render(s))
    elif args.verb == "diagnose":
        paths = args.rollouts or []  # `--rollouts a.jsonl key=value`: nargs takes the override
        rollouts = [p for p in paths if "=" not in p or Path(p).exists()]
        api.diagnose(Path(args.run), [*(p for p in paths if p not in rollouts), *args.overrides],
                     rollouts=rollouts or None, policy=args.policy)
    elif args.verb in ("drift", "refresh", "watch"):
        _run_rl(api, args)
    else:
        _stage(api, args)


def _stage(api, args: argparse.Namespace) -> None:
    """A lifecycle verb: its api.py function on the run dir, flags as config overrides."""
    fn = {"prepare": api.prepare, "harvest": api.harvest, "train": api.train,
          "export": api.export, "eval": api.evaluate}[args.verb]
    fn(Path(args.run), overrides=[*args.overrides, *_flags_to_overrides(args)])


def _flags_to_overrides(args: argparse.Namespace) -> list[str]:
    """CLI flags that are shorthands for config keys (the config keeps the default)."""
    out = []
    pairs = {"out": "export.out", "check": "export.check", "engine": "eval.engine",
             "k": "eval.k_values", "temperature": "eval.temperatures", "batch": "eval.batch_sizes"}
    for attr, key in pairs.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # key=value overrides may come before or after a verb's options (`eval RUN --k 3 a=b`).
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.verb == "config":
        print(config.dump(config.load(args.run, args.overrides)), end="")
    elif args.verb == "targets":
        for info in map(registry.lookup, registry.names()):
            print(f"{info.name:24s} {info.hub_id or '(in-process)':40s} layers={info.num_hidden_layers}"
                  f" hidden={info.hidden_size} vocab={info.vocab_size}")
    elif args.verb == "project":
        print(render_step(project_step(args.generation_s, args.step_s, args.rollout_speedup,
                                  args.mode, args.other_delta_s)))
    else:
        _api_verb(args)
    return 0


def exit_process(code: int) -> NoReturn:
    """Exit with `code`; a rank of a finished multi-process run exits without teardown.

    DDP keeps gloo's process group, and its worker threads, alive past
    `destroy_process_group()` (checked: after it and a gc the threads still run). A process
    that then runs interpreter and C++ teardown with them alive now and then aborts there
    ("terminate called without an active exception", pytorch/pytorch#65231), and `accelerate
    launch` fails a run whose work had finished. So after success every rank waits for the
    others, flushes and leaves by os._exit: whatever a stage writes is already renamed into
    place. After an error it exits normally, without the barrier: other ranks may be stuck
    inside a collective. A single process, even one holding a group of one, exits normally.
    """
    dist = sys.modules.get("torch.distributed")  # never imported: no process group
    if (code == 0 and dist is not None and dist.is_available() and dist.is_initialized()
            and dist.get_world_size() > 1):
        dist.barrier()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        code = run(argv)
    except DraftkitError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        code = 130
    exit_process(code)


if __name__ == "__main__":
    main()
