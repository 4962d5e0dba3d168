"""The mcx command line: parse argv, call one ops function, print, map errors to exit codes.

Nothing here decides anything; every verb is one call into ``mcx.ops``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from mcx.cli.output import children_to_stderr, show_progress
from mcx.errors import McxError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one paragraph, exit 2, no usage dump
        sys.stderr.write(f"mcx: error: {message}. Run '{self.prog} --help' for the options.\n")
        raise SystemExit(2)


def _console(stderr: bool = False):
    """Results go to stdout, progress and logs to stderr; off a terminal nothing is wrapped or coloured."""
    from mcx.cli.output import console

    return console(stderr=stderr)


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="experiment spec (TOML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a spec value (repeatable), e.g. --set train.lr=3e-4")


def _output_option(p: argparse.ArgumentParser, *flags: str, kind: str, help: str, required: bool = False) -> None:
    """An option naming a path mcx writes (``kind``: "file" or "dir"). main() checks every one before the
    command starts (mcx.ops.outputs), and tests/test_fuzz.py finds them all through ``OUTPUTS``."""
    action = p.add_argument(*flags, help=help, metavar="FILE" if kind == "file" else "DIR", required=required)
    p.set_defaults(**{OUTPUTS: [*(p.get_default(OUTPUTS) or []), (action.dest, flags[0], kind)]})


OUTPUTS = "_output_options"  # the parser default listing (dest, flag, kind) of each output option


def _check_outputs(args: argparse.Namespace) -> None:
    from mcx.ops.outputs import check_output_dir, check_output_file

    for dest, flag, kind in getattr(args, OUTPUTS, None) or []:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if kind == "file":
            check_output_file(value, flag)
        else:  # relative to the project, as the command reads it
            check_output_dir(value, flag, base=_project(args))


def _project(args: argparse.Namespace) -> Path:
    from mcx.ops.project import find_project

    return find_project(getattr(args, "project", None))


# -- verbs -------------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    from mcx.ops.plan import plan_spec

    result = plan_spec(args.spec, args.overrides, project=_project(args))
    if args.json:
        _emit_json(result.as_json())
    else:
        from mcx.report.plan_view import render_plan

        _console().print(render_plan(result.plan_dict, result.run_id or "ID unknown here (its data is not on this machine)"))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from mcx.ops.explain import explain

    expl = explain(args.a, args.b, project=_project(args), overrides=args.overrides)
    if args.json:
        from mcx.fingerprint.explain import explanation_to_dict

        _emit_json(explanation_to_dict(expl))
    else:
        from mcx.fingerprint.explain import render_explanation

        _console().print(render_explanation(expl))
    return 0


def _ask(question: str) -> bool:
    """The budget gate's question on the terminal; anything but y/yes (or end of input) is no."""
    sys.stderr.write(f"mcx: {question}\nRun it anyway? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_run(args: argparse.Namespace) -> int:
    from mcx.ops.run import RunOptions, run

    interactive = sys.stdin.isatty() and sys.stderr.isatty() and not args.json
    opts = RunOptions(stage=args.stage, force=args.force, yes=args.yes, dry_run=args.dry_run,
                      skip_smoke=args.skip_smoke, output="json" if args.json else ("quiet" if args.quiet else "bar"),
                      wait=args.wait, confirm=_ask if interactive else None, verify_data=args.verify_data)
    project = _project(args)
    with children_to_stderr():  # the worker's lines (--json: its metrics as JSON lines) are progress
        result = run(args.spec, args.overrides, project=project, options=opts, progress=show_progress)
    _print_notes(result.notes)
    summary = result.summary
    if args.json:
        _emit_json(summary)
    else:
        from mcx.report.run_view import render_dry_run, render_run_result

        _console().print(render_dry_run(summary) if args.dry_run else render_run_result(summary))
    return int(summary.get("exit_code", 0))


def _print_notes(notes: Any) -> None:
    """A run's notes (cached, its error, records left to sync) on stderr, before its result on stdout."""
    from mcx.report.notes import render_note

    err = _console(stderr=True)
    for note in notes:
        err.print(render_note(note))


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from mcx.ops.data import prepare

    project = _project(args)
    with children_to_stderr():
        manifest = prepare(project=project, source=args.source, out=args.out, tokenizer=args.tokenizer,
                           tokenizer_kind=args.tokenizer_kind, merges=args.merges, vocab_size=args.vocab_size,
                           json_key=args.json_key, force=args.force, inside_tracked=args.inside_tracked)
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

    project = _project(args)
    with children_to_stderr():  # DVC's own output is progress
        result = pull(args.run_id, project=project, remote=args.remote)
    if args.json:
        _emit_json(result)
        return 0
    remote = result["remote"]
    source = f"remote {remote['name']!r} ({remote['url']})"
    out = _console()
    for ck in result["checkpoints"]:
        what = f"{ck['path']} ({ck['stage']} stage checkpoint, {ck['nfiles']} files, {_size(ck['size'])})"
        out.print(f"fetched {what} from {source}" if ck["fetched"] else f"already here: {what}", markup=False,
                  soft_wrap=True)
    for d in result["data"]:
        what = f"{d['spec']} = {d['path']}: version {d['md5']} of {d['output']}"
        out.print(f"fetched {what} from {source}" if d["fetched"] else f"already here: {d['path']} ({d['spec']}), "
                  "not fetched", markup=False, soft_wrap=True)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from mcx.ops.records import list_runs

    rows = list_runs(project=_project(args), experiment=args.experiment, all_runs=args.all)
    if args.json:
        _emit_json(rows)
        return 0
    from mcx.cli.output import is_terminal
    from mcx.report.records_view import render_runs

    if is_terminal(sys.stdout):
        _console().print(render_runs(rows))
    else:  # a pipe or a file: a header line, then one run a line, tab-separated (mcx ls | cut -f1)
        sys.stdout.write(render_runs(rows, plain=True))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from mcx.ops.records import show_run

    shown = show_run(args.run_id, project=_project(args))
    if args.json:
        _emit_json(shown)
    else:
        from mcx.report.records_view import render_run

        _console().print(render_run(shown))
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from mcx.ops.records import lineage

    chain = lineage(args.run_id, project=_project(args))
    if args.json:
        _emit_json(chain)
    else:
        from mcx.report.records_view import render_lineage

        _console().print(render_lineage(chain))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from mcx.ops.records import sync

    project = _project(args)
    with children_to_stderr():
        report = sync(project=project)
    if args.json:
        _emit_json(report)
    else:
        _console().print(report.get("summary", report), markup=False)
    return 0 if report.get("ok", True) else 1  # records still pending: not done, run it again later


def cmd_reproduce(args: argparse.Namespace) -> int:
    from mcx.ops.reproduce import reproduce

    project = _project(args)
    with children_to_stderr():  # the rerun's progress; the verdict is the result
        result = reproduce(args.run_id, project=project, output="json" if args.json else "bar",
                           progress=show_progress)
    if args.json:
        _emit_json(result)
    else:
        from mcx.report.run_view import render_verdict

        _console().print(render_verdict(result))
    if result.get("status") == "interrupted":
        return 130
    return 0 if result["verdict"] in ("bitwise", "equivalent") else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from mcx.ops.compare import compare

    text = compare(args.run_ids, project=_project(args), experiment=args.experiment, baseline=args.baseline,
                   fmt=args.format, out=args.output)
    if text is not None:
        if args.format == "table":
            _console().print(text)
        else:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from mcx.ops.records import baseline_list, baseline_set

    if args.baseline_cmd == "set":
        res = baseline_set(args.name, args.run_id, project=_project(args))
        _emit_json(res) if args.json else _console().print(f"baseline {args.name} -> {args.run_id}")
    else:
        rows = baseline_list(project=_project(args))
        if args.json:
            _emit_json(rows)
        else:
            for r in rows:
                _console().print(f"{r['name']}\t{r['run_id']}")
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

    result = import_hf(args.directory, _project(args), out=args.output, extends=args.extends, name=args.name,
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
    result = export_hf(args.run_id, _project(args), args.output, step=args.step, dtype=args.dtype,
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


def cmd_tune(args: argparse.Namespace) -> int:
    from mcx.ops.tune import tune

    project = _project(args)
    with children_to_stderr():
        result = tune(args.spec, args.overrides, project=project, out=args.output, max_mbs=args.max_micro_batch,
                      steps=args.steps, progress=show_progress)
    if args.json:
        _emit_json(result)
    else:
        from mcx.report.run_view import render_tune

        _console().print(render_tune(result))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from mcx.ops.gc import gc

    err = _console(stderr=True)
    project = _project(args)
    with children_to_stderr():
        result = gc(project, dry_run=args.dry_run, keep_final=args.keep_final,
                    progress=lambda msg: err.print(f"gc: {msg}", markup=False, soft_wrap=True))
    if args.json:
        _emit_json(result.to_dict())
    else:
        from mcx.report.gc_view import render_gc

        _console().print(render_gc(result, project))
    return 0


# -- parser --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from mcx import __version__

    p = _Parser(prog="mcx", description="Declarative, reproducible Megatron-Core experiments.")
    p.add_argument("--version", action="version", version=f"mcx {__version__}")
    p.add_argument("--project", help="project root (default: the enclosing git repository)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    s = sub.add_parser("plan", help="validate a spec; show layout, memory, FLOPs, cost and run ID")
    _spec_args(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("explain", help="why two specs or run IDs differ (which fingerprint parts, which keys)")
    s.add_argument("a", help="spec path or run ID")
    s.add_argument("b", help="spec path or run ID")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override applied to B when it is a spec")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_explain)

    s = sub.add_parser("run", help="train: smoke stage, then full stage; recorded in MLflow and DVC")
    _spec_args(s)
    s.add_argument("--stage", choices=["smoke", "full", "all"], default="all")
    s.add_argument("--skip-smoke", action="store_true", help="run the full stage without the smoke stage (recorded)")
    s.add_argument("--force", action="store_true", help="train again even if this run ID finished")
    s.add_argument("--yes", action="store_true",
                   help="confirm a job above the spec's GPU-hour budget (on a terminal mcx asks instead)")
    s.add_argument("--dry-run", action="store_true", help="show the plan and the launch scripts; run nothing")
    s.add_argument("--wait", action="store_true", help="if the run ID is training elsewhere, wait for it")
    s.add_argument("--verify-data", action="store_true",
                   help="read every data file again instead of trusting hashes kept for files whose inode, mtime "
                        "and size are unchanged")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true", help="last stdout line: one JSON summary")
    s.set_defaults(func=cmd_run)

    d = sub.add_parser("data", help="datasets: prepare")
    dsub = d.add_subparsers(dest="data_cmd", metavar="ACTION", parser_class=_Parser)
    dsub.required = True
    s = dsub.add_parser("prepare", help="text or JSONL -> tokenizer -> Megatron indexed dataset (.bin/.idx)")
    s.add_argument("source", nargs="?", help="text file, directory of text files, or JSONL; none: the bundled quickstart")
    _output_option(s, "--out", kind="dir", help="output dataset directory (default: data/quickstart for the quickstart)")
    s.add_argument("--tokenizer", help="tokenizer file: tokenizer.json, SentencePiece .model, or GPT-2 vocab.json")
    s.add_argument("--tokenizer-kind", choices=["bpe", "huggingface", "sentencepiece", "gpt2"], default=None)
    s.add_argument("--merges", help="GPT-2 merges.txt (with --tokenizer-kind gpt2)")
    s.add_argument("--vocab-size", type=int, default=None, help="vocabulary of a BPE trained on the corpus")
    s.add_argument("--json-key", default="text", help="JSONL field holding the text")
    s.add_argument("--force", action="store_true", help="replace an existing, different dataset")
    s.add_argument("--inside-tracked", action="store_true",
                   help="write --out inside another DVC-tracked output (then record its new version with dvc add)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_data_prepare)

    s = sub.add_parser("pull", help="fetch a run's final checkpoints (and its dataset version if missing) from DVC")
    s.add_argument("run_id")
    s.add_argument("--remote", help="DVC remote name, URL or path to fetch from (default: where the run pushed)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_pull)

    s = sub.add_parser("ls", help="list recorded runs")
    s.add_argument("--experiment")
    s.add_argument("--all", action="store_true", help="also runs only the tracking store knows (a shared server)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("show", help="one run's record")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)

    s = sub.add_parser("lineage", help="the runs a run started from ([init] from) and the runs started from it")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_lineage)

    s = sub.add_parser("sync", help="replay records spooled while the tracking server was unreachable")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sync)

    s = sub.add_parser("reproduce", help="rerun a recorded run from its ID and give a verdict")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true", help="last stdout line: one JSON verdict")
    s.set_defaults(func=cmd_reproduce)

    s = sub.add_parser("compare", help="compare runs: config and fingerprint diffs, metrics, loss curves")
    s.add_argument("run_ids", nargs="*")
    s.add_argument("--experiment", help="compare every finished run of this experiment")
    s.add_argument("--baseline", help="run ID or baseline name to compute deltas against")
    s.add_argument("--format", choices=["table", "md", "json", "html"], default="table")
    _output_option(s, "-o", "--output", kind="file", help="write the report here instead of stdout")
    s.set_defaults(func=cmd_compare)

    b = sub.add_parser("baseline", help="named baselines")
    bsub = b.add_subparsers(dest="baseline_cmd", metavar="ACTION", parser_class=_Parser)
    bsub.required = True
    s = bsub.add_parser("set", help="name a run as a baseline")
    s.add_argument("name")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_baseline)
    s = bsub.add_parser("ls", help="list baselines")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_baseline)

    s = sub.add_parser("import", help="Megatron-LM launch script -> spec")
    s.add_argument("script")
    _output_option(s, "-o", "--output", kind="file", help="write the spec here (default: stdout)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a spec value the script lacks or should not decide (repeatable), e.g. --set train.lr=3e-4")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("export", help="spec -> Megatron-LM pretrain_gpt.py launch script")
    _spec_args(s)
    s.add_argument("--megatron-args", action="store_true", help="only the pretrain_gpt.py arguments")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("import-hf", help="Hugging Face model directory -> spec that starts from its weights")
    s.add_argument("directory", help="config.json + *.safetensors (LlamaForCausalLM, MistralForCausalLM, "
                   "MixtralForCausalLM)")
    _output_option(s, "-o", "--output", kind="file", help="write the spec here (default: stdout)")
    s.add_argument("--extends", metavar="SPEC", help="take [train], [data] and the rest from this spec")
    s.add_argument("--name", help="the spec's name (default: the directory's)")
    s.add_argument("--seq-length", type=int, help="model.seq_length (default: the model's context, at most 4096)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="any other spec value (repeatable), e.g. --set train.lr=1e-5")
    s.set_defaults(func=cmd_import_hf)

    s = sub.add_parser("export-hf", help="a run's checkpoint -> Hugging Face model directory (config.json, "
                       "safetensors, tokenizer)")
    s.add_argument("run_id")
    _output_option(s, "-o", "--output", kind="dir", help="the directory to create (must not exist)", required=True)
    s.add_argument("--step", type=int, help="that step's checkpoint instead of the final one")
    s.add_argument("--dtype", choices=["bf16", "fp16", "fp32"],
                   help="the tensors' type (default: the run's parameters': fp32 for fp32 runs, else bf16 or fp16)")
    s.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB; e.g. 500MB)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_export_hf)

    s = sub.add_parser("gc", help="remove what mcx no longer needs from .mcx/ (intermediate checkpoints, archived "
                       "attempts, stale worktrees...); print what it frees")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    s.add_argument("--keep-final", action="store_true",
                   help="keep finished stages' final checkpoints even where the DVC remote holds them")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_gc)

    s = sub.add_parser("tune", help="micro-batch sweep on the real hardware; writes the best into a new spec")
    _spec_args(s)
    _output_option(s, "-o", "--output", kind="file", help="tuned spec path (default: <spec>.tuned.toml)")
    s.add_argument("--max-micro-batch", type=int, default=64)
    s.add_argument("--steps", type=int, default=6, help="measured steps per trial")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_tune)
    return p


def _print_error(err: McxError) -> None:
    sys.stderr.write(f"mcx: error: {err}\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_outputs(args)  # a path mcx cannot write is bad input, said before any work
        return args.func(args)
    except McxError as err:
        _print_error(err)
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("mcx: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
