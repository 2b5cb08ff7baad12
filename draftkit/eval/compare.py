"""Other runs' drafts measured beside this run's export (`eval.compare_runs`), and which of an
eval's rows this run can serve.

A compared run's export is checked against this run's target like the run's own (check_export)
and served under its kind's method, so its method must differ from every other row's: no
speculation, the free methods (FREE) and this run's own draft. Its rows are reported, never
chosen for serving: `candidates` keeps the rows the serving choice and cost projections read.
"""

from __future__ import annotations

from pathlib import Path

from draftkit.core import artifacts, config
from draftkit.core.config import Run
from draftkit.core.errors import DraftkitError
from draftkit.drafts import kind as kinds

FREE = ("ngram", "suffix")  # speculation without a trained draft, measured beside the export


def check_export(run: Run) -> Path:
    """The export dir (export.out, default <run>/export), checked against the run's target."""
    cfg, paths = run.cfg, run.paths
    d = run.export_dir
    cmd = f"draftkit export {paths.root}"
    if not (d / "config.json").is_file():
        raise DraftkitError(f"run {paths.root} has no exported draft ({d}/config.json is "
                            f"missing); run `{cmd}` first")
    conf = artifacts.read_json(d / "config.json")
    t = cfg.target
    try:
        shapes = kinds.of(cfg).export_shapes(conf, cfg)  # {field: (found, wanted)}
    except (DraftkitError, KeyError, TypeError, ValueError) as e:
        raise DraftkitError(f"{d}/config.json is not a loadable {cfg.draft.kind} export "
                            f"({type(e).__name__}: {e}); re-export with `{cmd}`") from e
    bad = [f"{key} {got} != {wanted}" for key, (got, wanted) in shapes.items() if got != wanted]
    if bad:
        raise DraftkitError(f"the draft at {d} does not fit the run's target {t.name}: "
                            f"{'; '.join(bad)}. It was trained for another target: re-export "
                            f"this run's draft with `{cmd}` (after `draftkit train`).")
    return d


def compared_drafts(cfg) -> dict[str, tuple]:
    """eval.compare_runs as {method: (kind, export dir)}: each run's export, checked against
    this run's target; its method must differ from this run's and from the free methods."""
    own = kinds.of(cfg).method
    out: dict[str, tuple] = {}
    for other in cfg.eval.compare_runs:
        try:
            run = config.open_run(other)
        except (DraftkitError, OSError) as e:
            raise DraftkitError(f"eval.compare_runs: {other} is not a draftkit run ({e}); "
                                "name run dirs that hold draftkit.yaml and an export") from e
        if run.cfg.target.name != cfg.target.name:
            raise DraftkitError(f"eval.compare_runs: {other} drafts for {run.cfg.target.name}, "
                                f"this run's target is {cfg.target.name}; compare runs of the "
                                "same target")
        kind = kinds.of(run.cfg)
        if kind.method in (own, "none", *FREE, *out):
            raise DraftkitError(f"eval.compare_runs: {other} is a {kind.name} draft, served as "
                                f"method {kind.method!r} like another row of this eval; compare "
                                "drafts of another kind (evaluate same-kind runs one by one)")
        out[kind.method] = (kind, check_export(run))
    return out


def candidates(rows: list[dict], cfg) -> list[dict]:
    """The rows this run can serve (no speculation, the free methods, its own export): the
    serving choice and the cost projections read these; eval.compare_runs' rows are reported."""
    serve = {"none", *FREE, kinds.of(cfg).method}
    return [r for r in rows if r["method"] in serve]
