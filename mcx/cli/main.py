"""The mcx command line: parse argv, call one ops function, print, map errors to exit codes.

Nothing here decides anything; every verb is one call into ``mcx.ops``.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from mcx.cli import verbs
from mcx.errors import McxError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one paragraph, exit 2, no usage dump
        sys.stderr.write(f"mcx: error: {message}. Run '{self.prog} --help' for the options.\n")
        raise SystemExit(2)


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
            check_output_dir(value, flag, base=verbs.project_root(args))


# -- parser --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from mcx import __version__

    p = _Parser(prog="mcx", description="Declarative, reproducible Megatron-Core experiments.")
    p.add_argument("--version", action="version", version=f"mcx {__version__}")
    p.add_argument("--project", help="project root (default: the enclosing git repository)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _training_verbs(sub)
    _record_verbs(sub)
    _live_verbs(sub)
    _report_verbs(sub)
    _interop_verbs(sub)
    _sweep_verbs(sub)
    _upkeep_verbs(sub)
    return p


def _training_verbs(sub: argparse._SubParsersAction) -> None:
    """Plan, explain, run, data prepare: a spec into a plan, a run ID and a trained run."""
    s = sub.add_parser("plan", help="validate a spec; show layout, memory, FLOPs, cost and run ID")
    _spec_args(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=verbs.cmd_plan)

    s = sub.add_parser("explain", help="why two specs or run IDs differ (which fingerprint parts, which keys)")
    s.add_argument("a", help="spec path or run ID")
    s.add_argument("b", help="spec path or run ID")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override applied to B when it is a spec")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_explain)

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
    s.add_argument("--detach", action="store_true",
                   help="return once the first stage is submitted (run ID and job on stdout); a supervisor process "
                        "runs the rest and records it (`mcx status`, `logs`, `cancel`)")
    s.add_argument("--profile", metavar="STEPS",
                   help="run these steps of the full stage under torch.profiler: a step (3) or an inclusive range "
                        "(5:8); each rank's trace and op table go to the run's full/profile/ (same run ID, same losses)")
    s.add_argument("--json", action="store_true", help="last stdout line: one JSON summary")
    s.set_defaults(func=verbs.cmd_run)

    d = sub.add_parser("data", help="datasets: prepare")
    dsub = d.add_subparsers(dest="data_cmd", metavar="ACTION", parser_class=_Parser)
    dsub.required = True
    s = dsub.add_parser("prepare", help="text, JSONL or Parquet shards -> tokenizer -> Megatron indexed dataset (.bin/.idx)")
    s.add_argument("source", nargs="*", help="a text file or directory of text files; or .jsonl, .jsonl.gz, .parquet "
                                             "shards: files, directories, quoted globs; none: the bundled quickstart")
    _output_option(s, "--out", kind="dir", help="output dataset directory (default: data/quickstart for the quickstart)")
    s.add_argument("--tokenizer", help="a Hugging Face model directory (its tokenizer.json) or a tokenizer file: "
                                       "tokenizer.json, SentencePiece .model, or GPT-2 vocab.json")
    s.add_argument("--tokenizer-kind", choices=["bpe", "huggingface", "sentencepiece", "gpt2"], default=None)
    s.add_argument("--merges", help="GPT-2 merges.txt (with --tokenizer-kind gpt2)")
    s.add_argument("--vocab-size", type=int, default=None, help="vocabulary of a BPE trained on the corpus")
    s.add_argument("--text-key", "--json-key", dest="text_key", default="text",
                   help="the JSON key or Parquet column holding the text (default: text)")
    s.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes tokenizing shards (any N gives the same bytes)")
    s.add_argument("--quiet", action="store_true", help="no progress")
    s.add_argument("--force", action="store_true", help="replace an existing, different dataset")
    s.add_argument("--inside-tracked", action="store_true",
                   help="write --out inside another DVC-tracked output (then record its new version with dvc add)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_data_prepare)


def _record_verbs(sub: argparse._SubParsersAction) -> None:
    """Pull, ls, show, lineage, sync, reproduce: the runs recorded."""
    s = sub.add_parser("pull", help="fetch a run's final checkpoints (and its dataset version if missing) from DVC")
    s.add_argument("run_id")
    s.add_argument("--remote", help="DVC remote name, URL or path to fetch from (default: where the run pushed)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_pull)

    s = sub.add_parser("ls", help="list recorded runs")
    s.add_argument("--experiment")
    s.add_argument("--all", action="store_true", help="also runs only the tracking store knows (a shared server)")
    s.add_argument("--columns", action="append", default=[], metavar="COL[,COL...]",
                   help="extra columns from each run's summary: a metric (valid_loss, mfu, ...), a score "
                        "eval/<task>/<metric>, or a glob (eval/*)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_ls)

    s = sub.add_parser("show", help="one run's record")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_show)

    s = sub.add_parser("lineage", help="the runs a run started from ([init] from) and the runs started from it")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_lineage)

    s = sub.add_parser("sync", help="replay records spooled while the tracking server was unreachable")
    s.add_argument("--to", metavar="URI", default=None,
                   help="send every run's records to this tracking server instead of the one it was recorded for")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_sync)

    s = sub.add_parser("reproduce", help="rerun a recorded run from its ID and give a verdict")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true", help="last stdout line: one JSON verdict")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="debug.KEY=VALUE",
                   help="inject a fault into the rerun (repeatable; [debug] keys only, docs/spec.md), "
                        "e.g. --set debug.perturb_params.step=11")
    s.add_argument("--locate", action="store_true",
                   help="then replay the run and its reproduction over the first step whose loss differs, with "
                        "tracing, and name the first operation that differs (docs/reproduce.md)")
    s.set_defaults(func=verbs.cmd_reproduce)

    s = sub.add_parser("locate", help="the first operation where two runs of one model and layout differ")
    s.add_argument("run_a", metavar="RUN_A", help="a run ID, or RUN_ID/rN for its reproduction N")
    s.add_argument("run_b", metavar="RUN_B")
    s.add_argument("--step", type=int, default=None,
                   help="the step to replay and trace (default: the first whose loss or gradient norm differs)")
    s.add_argument("--json", action="store_true", help="stdout: one JSON object")
    s.set_defaults(func=verbs.cmd_locate)


def _live_verbs(sub: argparse._SubParsersAction) -> None:
    """Status, logs, cancel: runs still training (`mcx run --detach`, or another terminal's `mcx run`)."""
    s = sub.add_parser("status", help="a run's queue state, stage, step, loss, tokens/s, ETA and last checkpoint "
                       "(no RUN_ID: every running or queued run)")
    s.add_argument("run_id", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_status)

    s = sub.add_parser("logs", help="a run's worker log, every rank's lines (-f: follow until the run ends)")
    s.add_argument("run_id")
    s.add_argument("-f", "--follow", action="store_true", help="keep reading until the run is no longer active")
    s.add_argument("--rank", type=int, help="this rank's lines only")
    s.add_argument("--stage", choices=["smoke", "full"], help="this stage's log only (default: each stage's in turn)")
    s.add_argument("--json", action="store_true", help="one JSON object a line: stage, rank, line")
    s.set_defaults(func=verbs.cmd_logs)

    s = sub.add_parser("cancel", help="stop a running or queued run: its job cancelled, a checkpoint kept; "
                       "`mcx run` of its spec resumes it")
    s.add_argument("run_id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_cancel)


def _report_verbs(sub: argparse._SubParsersAction) -> None:
    """Compare, baseline: runs against each other."""
    s = sub.add_parser("compare", help="compare runs: config and fingerprint diffs, metrics, loss curves")
    s.add_argument("run_ids", nargs="*")
    s.add_argument("--experiment", help="compare every finished run of this experiment")
    s.add_argument("--sweep", metavar="NAME", help="compare a sweep's best trials, with its objective against each "
                   "parameter and every trial")
    s.add_argument("--baseline", help="run ID or baseline name to compute deltas against")
    s.add_argument("--format", choices=["table", "md", "json", "html"], default="table")
    _output_option(s, "-o", "--output", kind="file", help="write the report here instead of stdout")
    s.set_defaults(func=verbs.cmd_compare)

    b = sub.add_parser("baseline", help="named baselines")
    bsub = b.add_subparsers(dest="baseline_cmd", metavar="ACTION", parser_class=_Parser)
    bsub.required = True
    s = bsub.add_parser("set", help="name a run as a baseline")
    s.add_argument("name")
    s.add_argument("run_id", help="a run ID, or sweep:NAME for a sweep's best trial")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_baseline)
    s = bsub.add_parser("ls", help="list baselines")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_baseline)


def _interop_verbs(sub: argparse._SubParsersAction) -> None:
    """Import, export, import-hf, export-hf: Megatron-LM scripts and Hugging Face models."""
    s = sub.add_parser("import", help="Megatron-LM launch script -> spec")
    s.add_argument("script")
    _output_option(s, "-o", "--output", kind="file", help="write the spec here (default: stdout)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a spec value the script lacks or should not decide (repeatable), e.g. --set train.lr=3e-4")
    s.set_defaults(func=verbs.cmd_import)

    s = sub.add_parser("export", help="spec -> Megatron-LM pretrain_gpt.py launch script")
    _spec_args(s)
    s.add_argument("--megatron-args", action="store_true", help="only the pretrain_gpt.py arguments")
    s.set_defaults(func=verbs.cmd_export)

    s = sub.add_parser("import-hf", help="Hugging Face model directory -> spec that starts from its weights")
    s.add_argument("directory", help="config.json + *.safetensors (LlamaForCausalLM, MistralForCausalLM, "
                   "MixtralForCausalLM)")
    _output_option(s, "-o", "--output", kind="file", help="write the spec here (default: stdout)")
    s.add_argument("--extends", metavar="SPEC", help="take [train], [data] and the rest from this spec")
    s.add_argument("--name", help="the spec's name (default: the directory's)")
    s.add_argument("--seq-length", type=int, help="model.seq_length (default: the model's context, at most 4096)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="any other spec value (repeatable), e.g. --set train.lr=1e-5")
    s.set_defaults(func=verbs.cmd_import_hf)

    s = sub.add_parser("export-hf", help="a run's checkpoint -> Hugging Face model directory (config.json, "
                       "safetensors, tokenizer)")
    s.add_argument("run_id")
    _output_option(s, "-o", "--output", kind="dir", help="the directory to create (must not exist)", required=True)
    s.add_argument("--step", type=int, help="that step's checkpoint instead of the final one")
    s.add_argument("--dtype", choices=["bf16", "fp16", "fp32"],
                   help="the tensors' type (default: the run's parameters': fp32 for fp32 runs, else bf16 or fp16)")
    s.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB; e.g. 500MB)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=verbs.cmd_export_hf)

    s = sub.add_parser("eval", help="lm-evaluation-harness on a run's weights or a Hugging Face model directory "
                       "(content-addressed: a repeated evaluation is read from its cache)")
    s.add_argument("target", help="a run ID (its final checkpoint, exported once) or hf:DIR")
    s.add_argument("--tasks", help="comma-separated registry names or task directories (default: the run's [eval] "
                   "tasks), e.g. evals/quickstart_next_line")
    s.add_argument("--num-fewshot", type=int, help="examples before each item (default: [eval]'s, else 0)")
    s.add_argument("--limit", type=int, help="items per task (default: [eval]'s, else every item)")
    s.add_argument("--batch-size", type=int, help="requests per forward pass (default: [eval]'s, else 8)")
    s.add_argument("--every", type=int, metavar="N", help="also the run's checkpoints at multiples of N steps "
                   "(default: [eval]'s every; 0: the final weights only)")
    s.add_argument("--fresh", action="store_true", help="compute again even when the cache holds this evaluation")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=verbs.cmd_eval)


def _sweep_verbs(sub: argparse._SubParsersAction) -> None:
    """Sweep: many runs as one experiment."""
    s = sub.add_parser("sweep", help="run a spec's [sweep]: plan every trial and the GPU-hours, then train each "
                       "(`mcx sweep show NAME`: its trials; `mcx sweep ls`: the sweeps)")
    s.add_argument("spec", help="the spec with a [sweep] table; or show, ls")
    s.add_argument("name", nargs="?", help="with show: the sweep's name")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a spec value (repeatable), e.g. --set sweep.max_trials=4")
    s.add_argument("--yes", action="store_true",
                   help="confirm a sweep above the spec's GPU-hour budget (on a terminal mcx asks instead)")
    s.add_argument("--dry-run", action="store_true", help="plan every trial and the whole sweep; train nothing")
    s.add_argument("--verify-data", action="store_true", help="read every data file again (as mcx run --verify-data)")
    s.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    s.set_defaults(func=verbs.cmd_sweep)


def _upkeep_verbs(sub: argparse._SubParsersAction) -> None:
    """Gc, tune: the project's space and a spec's speed."""
    s = sub.add_parser("gc", help="remove what mcx no longer needs from .mcx/ (intermediate checkpoints, archived "
                       "attempts, stale worktrees...); print what it frees")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    s.add_argument("--keep-final", action="store_true",
                   help="keep finished stages' final checkpoints even where the DVC remote holds them")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=verbs.cmd_gc)

    s = sub.add_parser("tune", help="micro-batch sweep on the real hardware, or (--layouts) the parallel layouts "
                       "ranked by the step-time model with the top ones measured; writes the best into a new spec")
    _spec_args(s)
    _output_option(s, "-o", "--output", kind="file", help="tuned spec path (default: <spec>.tuned.toml)")
    s.add_argument("--max-micro-batch", type=int, default=64)
    s.add_argument("--steps", type=int, default=6, help="measured steps per trial")
    s.add_argument("--layouts", action="store_true",
                   help="rank every layout that fits (TP, PP, VPP, CP, EP, micro-batch, recomputation) by predicted "
                        "throughput; where the spec's GPUs are here (or on Slurm), measure the top ones")
    s.add_argument("--top", type=int, default=3, help="with --layouts: how many of the ranking to measure")
    s.add_argument("--show", type=int, default=10, help="with --layouts: how many of the ranking to print")
    s.add_argument("--no-measure", action="store_true", help="with --layouts: print the ranking only")
    s.add_argument("--yes", action="store_true",
                   help="confirm trials above the spec's GPU-hour budget (on a terminal mcx asks instead)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=verbs.cmd_tune)

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
