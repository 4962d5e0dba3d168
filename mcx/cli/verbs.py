"""The verbs: each parses nothing, calls one ops function, and prints what it returns (results on stdout,
progress on stderr). mcx/cli/main.py declares their arguments and maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcx.cli.output import children_to_stderr, show_progress
from mcx.contract.status import Status

if TYPE_CHECKING:
    from mcx.track.baseline import Baseline


def _console(stderr: bool = False):
    """Results go to stdout, progress and logs to stderr; off a terminal nothing is wrapped or coloured."""
    from mcx.cli.output import console

    return console(stderr=stderr)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def _baseline_json(b: Baseline) -> dict[str, Any]:
    return {"name": b.name, "run_id": b.run_id, "set_at": b.set_at}


def project_root(args: argparse.Namespace) -> Path:
    from mcx.ops.project import find_project

    return find_project(getattr(args, "project", None))


# -- verbs -------------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    from mcx.ops.plan import plan_spec

    result = plan_spec(args.spec, args.overrides, project=project_root(args))
    if args.json:
        _emit_json(result.as_json())
    else:
        from mcx.report.plan_view import render_plan

        _console().print(render_plan(result.shown, result.run_id or "ID unknown here (its data is not on this machine)"))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from mcx.ops.explain import explain

    expl = explain(args.a, args.b, project=project_root(args), overrides=args.overrides)
    if args.json:
        from mcx.fingerprint.diff import explanation_to_dict

        _emit_json(explanation_to_dict(expl))
    else:
        from mcx.report.explain_view import render_explanation

        _console().print(render_explanation(expl))
    return 0


def _ask(question: str) -> bool:
    """The budget gate's question on the terminal; anything but y/yes (or end of input) is no."""
    sys.stderr.write(f"mcx: {question}\nRun it anyway? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_run(args: argparse.Namespace) -> int:
    from mcx.ops.interrupts import term_interrupts
    from mcx.contract.profile import parse_profile_steps
    from mcx.ops.run import RunOptions, run

    interactive = sys.stdin.isatty() and sys.stderr.isatty() and not args.json
    opts = RunOptions(stage=args.stage, force=args.force, yes=args.yes, dry_run=args.dry_run,
                      skip_smoke=args.skip_smoke, output="json" if args.json else ("quiet" if args.quiet else "bar"),
                      wait=args.wait, confirm=_ask if interactive else None, verify_data=args.verify_data,
                      detach=args.detach, profile=None if args.profile is None else parse_profile_steps(args.profile))
    project = project_root(args)
    # SIGTERM stops it as Ctrl-C does (exit 130, resumable): forwarded to the workers while a stage trains
    with children_to_stderr(), term_interrupts():  # the worker's lines (--json: its metrics as JSON lines) are progress
        result = run(args.spec, args.overrides, project=project, options=opts, progress=show_progress)
    _print_notes(result.notes)
    summary = result.summary
    if args.json:
        _emit_json(summary.to_dict())
    else:
        from mcx.ops.detach import Detached
        from mcx.plan.shown import DryRun

        if isinstance(summary, Detached):
            from mcx.cli.status_view import detached_text

            sys.stdout.write(detached_text(summary))
            return summary.exit_code
        from mcx.report.run_view import render_dry_run, render_run_result

        _console().print(render_dry_run(summary) if isinstance(summary, DryRun) else render_run_result(summary))
    return summary.exit_code


def _print_notes(notes: Any) -> None:
    """A run's notes (cached, its error, records left to sync) on stderr, before its result on stdout."""
    from mcx.report.notes_view import render_note

    err = _console(stderr=True)
    for note in notes:
        err.print(render_note(note))


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from mcx.cli.prepare_progress import PrepareBar
    from mcx.ops.data import prepare
    from mcx.ops.interrupts import term_interrupts

    project = project_root(args)
    bar = None if args.quiet else PrepareBar()
    # SIGTERM stops it as Ctrl-C does (exit 130); the shards finished so far are kept for the next prepare
    with children_to_stderr(), term_interrupts():
        try:
            manifest = prepare(project=project, source=args.source, out=args.out, tokenizer=args.tokenizer,
                               tokenizer_kind=args.tokenizer_kind, merges=args.merges, vocab_size=args.vocab_size,
                               text_key=args.text_key, force=args.force, inside_tracked=args.inside_tracked,
                               workers=args.workers, progress=bar)
        finally:
            if bar is not None:
                bar.close()
    if args.json:
        _emit_json(manifest)
    else:
        _console().print(f"prepared {manifest['out_dir']}: {manifest['documents']} documents, "
                         f"{manifest['tokens']} tokens, vocab {manifest['vocab_size']}")
        if manifest.get("dvc_add"):
            _console().print(manifest["dvc_add"], markup=False, soft_wrap=True)  # a command to copy: never wrapped
    return 0


def _size(n: int | None) -> str:
    return "size unknown" if n is None else f"{n / 2**20:.1f} MiB"


def cmd_pull(args: argparse.Namespace) -> int:
    from mcx.ops.pull import pull

    project = project_root(args)
    with children_to_stderr():  # DVC's own output is progress
        result = pull(args.run_id, project=project, remote=args.remote)
    if args.json:
        _emit_json(result.to_dict())
        return 0
    source = f"remote {result.remote_name!r} ({result.remote_url})"
    out = _console()
    for ck in result.checkpoints:
        what = f"{ck.path} ({ck.stage} stage checkpoint, {ck.nfiles} files, {_size(ck.size)})"
        out.print(f"fetched {what} from {source}" if ck.fetched else f"already here: {what}", markup=False,
                  soft_wrap=True)
    for d in result.data:
        what = f"{d.spec} = {d.path}: version {d.md5} of {d.output}"
        out.print(f"fetched {what} from {source}" if d.fetched else f"already here: {d.path} ({d.spec}), "
                  "not fetched", markup=False, soft_wrap=True)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from mcx.ops.progress import Note
    from mcx.ops.records import column_cells, list_runs, run_columns

    rows = list_runs(project=project_root(args), experiment=args.experiment, all_runs=args.all)
    columns = run_columns(rows, args.columns) if args.columns else ()
    for row in rows:  # listed as "damaged"; each named on stderr, so the rest of the list stays usable
        if row.damaged:
            show_progress(Note(level="warning", lead=f"run {row.run_id}",
                               text=f": its record is damaged ({'; '.join(row.damaged)}); `mcx show "
                                    f"{row.run_id}` says how to mend it"))
    if args.json:  # --columns: each run's asked values under "columns" (the rest as without it)
        _emit_json([{**row.to_dict(), **({"columns": {k: c.to_dict() for k, c in column_cells(row, columns).items()}}
                                         if columns else {})} for row in rows])
        return 0
    from mcx.cli.output import is_terminal
    from mcx.report.records_view import render_runs, runs_text

    if is_terminal(sys.stdout):
        _console().print(render_runs(rows, columns))
    else:  # a pipe or a file: a header line, then one run a line, tab-separated (mcx ls | cut -f1)
        sys.stdout.write(runs_text(rows, columns))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from mcx.ops.status import run_status

    runs = run_status(project_root(args), args.run_id)
    if args.json:
        _emit_json(runs[0].to_dict() if args.run_id else [r.to_dict() for r in runs])
        return 0
    from mcx.cli.status_view import status_text

    sys.stdout.write(status_text(runs, one=args.run_id is not None))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from mcx.ops.logs import run_logs

    for line in run_logs(project_root(args), args.run_id, stage=args.stage, rank=args.rank, follow=args.follow):
        sys.stdout.write(json.dumps(line.to_dict()) + "\n" if args.json else line.text + "\n")
        sys.stdout.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from mcx.ops.cancel import cancel_run

    done = cancel_run(project_root(args), args.run_id)
    if args.json:
        _emit_json(done.to_dict())
    else:
        from mcx.cli.status_view import cancelled_text

        sys.stdout.write(cancelled_text(done))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from mcx.ops.records import show_run

    shown = show_run(args.run_id, project=project_root(args))
    if args.json:
        _emit_json(shown.to_dict())
    else:
        from mcx.report.records_view import render_run

        _console().print(render_run(shown))
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from mcx.ops.records import lineage

    chain = lineage(args.run_id, project=project_root(args))
    if args.json:
        _emit_json(chain.to_dict())
    else:
        from mcx.report.records_view import render_lineage

        _console().print(render_lineage(chain))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from mcx.ops.records import sync

    project = project_root(args)
    with children_to_stderr():
        report = sync(project=project, to=args.to)
    if args.json:
        _emit_json(report.to_dict())
    else:
        _console().print(report.summary, markup=False)
    if report.error:
        sys.stderr.write(f"mcx: error: {report.error}\n")
    return 0 if report.ok else 1  # records still pending: not done, run it again later


def cmd_reproduce(args: argparse.Namespace) -> int:
    from mcx.ops.interrupts import term_interrupts
    from mcx.ops.reproduce import reproduce

    project = project_root(args)
    with children_to_stderr(), term_interrupts():  # the rerun's progress; the verdict is the result
        result = reproduce(args.run_id, project=project, output="json" if args.json else "bar",
                           progress=show_progress, debug=tuple(args.overrides))
        located = None
        if args.locate and result.status != Status.INTERRUPTED:
            from mcx.ops.locate import locate_reproduction

            located = locate_reproduction(result.run_id, result.reproduction, result.kind == "diverged",
                                          project=project, progress=show_progress)
    if args.json:
        _emit_json({**result.to_dict(), **({"locate": located.to_dict()} if located else {})})
    else:
        from mcx.report.run_view import render_verdict

        _console().print(render_verdict(result))
        if located is not None:
            from mcx.report.locate_view import render_any

            _console().print(render_any(located))
    if result.status == Status.INTERRUPTED:
        return 130
    return 0 if result.kind in ("bitwise", "equivalent") else 1


def cmd_locate(args: argparse.Namespace) -> int:
    from mcx.ops.interrupts import term_interrupts
    from mcx.ops.locate import locate

    with children_to_stderr(), term_interrupts():  # the replays' progress; the located operation is the result
        result = locate(args.run_a, args.run_b, project=project_root(args), step=args.step, progress=show_progress)
    if args.json:
        _emit_json(result.to_dict())
    else:
        from mcx.report.locate_view import render_any

        _console().print(render_any(result))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from mcx.ops.compare import compare

    text = compare(args.run_ids, project=project_root(args), experiment=args.experiment, baseline=args.baseline,
                   fmt=args.format, out=args.output, sweep=args.sweep)
    if text is not None:
        if args.format != "table" and isinstance(text, str):  # Markdown, JSON, HTML: the text as it is
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        else:
            _console().print(text)
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from mcx.ops.records import baseline_list, baseline_set

    if args.baseline_cmd == "set":
        res = baseline_set(args.name, args.run_id, project=project_root(args))
        _emit_json(_baseline_json(res)) if args.json else _console().print(f"baseline {args.name} -> {res.run_id}")
    else:
        rows = baseline_list(project=project_root(args))
        if args.json:
            _emit_json([_baseline_json(r) for r in rows])
        else:
            for r in rows:
                _console().print(f"{r.name}\t{r.run_id}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from mcx.ops.interop import import_script

    text, report = import_script(args.script, out=args.output, overrides=args.overrides)
    if args.output:
        _console(stderr=True).print(report)
    else:
        sys.stdout.write(text)
        _console(stderr=True).print(report)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from mcx.ops.interop import export_spec

    sys.stdout.write(export_spec(args.spec, args.overrides, script=not args.megatron_args))
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from mcx.ops.hf import import_hf

    result = import_hf(args.directory, project_root(args), out=args.output, extends=args.extends, name=args.name,
                       seq_length=args.seq_length, overrides=args.overrides)
    err = _console(stderr=True)
    if not args.output:
        sys.stdout.write(result.text)
    else:
        err.print(f"wrote {args.output}", markup=False, soft_wrap=True)
    for note in result.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    from mcx.ops.hf import export_hf

    err = _console(stderr=True)
    result = export_hf(args.run_id, project_root(args), args.output, step=args.step, dtype=args.dtype,
                       max_shard_size=args.max_shard_size,
                       progress=lambda msg: err.print(f"export-hf: {msg}", markup=False, soft_wrap=True))
    if args.json:
        _emit_json(result)
    else:
        _console().print(f"{result['out']}: {result['architecture']} from run {result['run_id']} step {result['step']}, "
                         f"{result['tensors']} tensors in {result['shards']} safetensors file(s), {result['dtype']}, "
                         f"{_size(result['bytes'])}; tokenizer: {', '.join(result['tokenizer']) or 'none (dataset not here)'}",
                         markup=False, soft_wrap=True)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from mcx.errors import McxError
    from mcx.ops.evaluate import EvalOverrides, evaluate
    from mcx.report.eval_view import evaluation_lines

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks is not None else None
    overrides = EvalOverrides(tasks=tasks, num_fewshot=args.num_fewshot, limit=args.limit, batch_size=args.batch_size,
                              every=args.every, fresh=args.fresh)
    with children_to_stderr():
        result = evaluate(args.target, project_root(args), overrides=overrides, progress=show_progress)
    if args.json:
        _emit_json(result.to_dict())
    else:
        out = _console()
        for line in evaluation_lines(result.target, result.evaluation):
            out.print(line, markup=False, soft_wrap=True)
    if result.steps_error is not None:  # the final scores are printed and recorded; the rest is retried
        raise McxError(result.steps_error, f"`mcx eval {result.target}` evaluates the remaining checkpoints "
                       "(those done come from the cache).")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from mcx.ops import sweep as sweeps

    project = project_root(args)
    if args.spec in ("show", "ls"):
        if args.spec == "ls":
            names = sweeps.list_sweeps(project)
            _emit_json(names) if args.json else sys.stdout.write("".join(n + "\n" for n in names))
            return 0
        if not args.name:
            from mcx.errors import InputError

            raise InputError("mcx sweep show needs the sweep's name;", "`mcx sweep ls` lists them.")
        result = sweeps.show(args.name, project)
    else:
        from mcx.ops.sweep_plan import SweepOptions

        interactive = sys.stdin.isatty() and sys.stderr.isatty() and not args.json
        options = SweepOptions(yes=args.yes, dry_run=args.dry_run, verify_data=args.verify_data,
                               output="json" if args.json else "bar", confirm=_ask if interactive else None)
        with children_to_stderr():
            result = sweeps.sweep(args.spec, args.overrides, project=project, options=options, progress=show_progress)
        _print_notes(result.notes)
    if args.json:
        _emit_json(result.to_json())
    else:
        from mcx.report.sweep_view import render_sweep

        _console().print(render_sweep(result.to_json()))
    return result.exit_code


def cmd_tune(args: argparse.Namespace) -> int:
    from mcx.ops.tune import tune

    project = project_root(args)
    confirm = _ask if sys.stdin.isatty() and sys.stderr.isatty() and not args.json else None
    if args.layouts:
        from mcx.ops.tune_layouts import tune_layouts
        from mcx.report.run_view import render_tune_layouts

        with children_to_stderr():
            result = tune_layouts(args.spec, args.overrides, project=project, out=args.output, top=args.top,
                                  show=args.show, steps=args.steps, measure=not args.no_measure, progress=show_progress,
                                  yes=args.yes, confirm=confirm)
        _emit_json(result.to_dict()) if args.json else _console().print(render_tune_layouts(result))
        return 0
    if args.no_measure or args.top != 3 or args.show != 10:
        from mcx.errors import InputError

        raise InputError("--top, --show and --no-measure go with --layouts;", "add --layouts, or leave them out.")
    with children_to_stderr():
        tuned = tune(args.spec, args.overrides, project=project, out=args.output, max_mbs=args.max_micro_batch,
                     steps=args.steps, progress=show_progress, yes=args.yes, confirm=confirm)
    if args.json:
        _emit_json(tuned.to_dict())
    else:
        from mcx.report.run_view import render_tune

        _console().print(render_tune(tuned))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from mcx.ops.gc import gc

    err = _console(stderr=True)
    project = project_root(args)
    with children_to_stderr():
        result = gc(project, dry_run=args.dry_run, keep_final=args.keep_final,
                    progress=lambda msg: err.print(f"gc: {msg}", markup=False, soft_wrap=True))
    if args.json:
        _emit_json(result.to_dict())
    else:
        from mcx.report.gc_view import render_gc

        _console().print(render_gc(result, project))
    return 0
