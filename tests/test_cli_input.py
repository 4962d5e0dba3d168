"""Bad input through the real command line (`python -m mcx`): exit code 2, one clear message, no
traceback, and nothing written into the project (no .mcx/, no mlruns/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parent.parent
TINY = tomllib.loads((ROOT / "experiments" / "tiny.toml").read_text())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project two levels below tmp_path (so ../../ stays inside it): DVC-tracked data, not pulled."""
    root = tmp_path / "home" / "project"
    (root / ".dvc").mkdir(parents=True)
    shutil.copyfile(ROOT / "data.dvc", root / "data.dvc")
    shutil.copyfile(ROOT / "experiments" / "tiny.toml", root / "tiny.toml")
    return root


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def mcx(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcx", *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "MCX_PROJECT": str(project)}, timeout=300)


def bad_input(project: Path, *args: str) -> str:
    """Run mcx on bad input; assert exit 2, no traceback, nothing written; return stderr."""
    before = tree(project)
    proc = mcx(project, *args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert proc.stderr.startswith("mcx: error: "), proc.stderr
    assert proc.stdout == ""
    assert tree(project) == before, "bad input wrote into the project"
    assert not (project / ".mcx").exists() and not (project / "mlruns").exists()
    return proc.stderr


def one_paragraph(stderr: str) -> str:
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    return stderr


def write(project: Path, name: str, data: dict | str) -> str:
    (project / name).write_text(data if isinstance(data, str) else tomli_w.dumps(data), encoding="utf-8")
    return name


def tiny(**sections) -> dict:
    data = json.loads(json.dumps(TINY))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


# --- the harness can pass ------------------------------------------------------------------------


def test_a_good_spec_plans_and_writes_nothing(project):
    before = tree(project)
    proc = mcx(project, "plan", "tiny.toml", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(json.loads(proc.stdout.splitlines()[-1])["run_id"]) == 12
    assert tree(project) == before


# --- specs ----------------------------------------------------------------------------------------


def test_missing_spec_file(project):
    err = bad_input(project, "plan", "experiments/nope.toml")
    assert "file not found" in err and str(project / "experiments" / "nope.toml") in err and "check the path" in err


def test_malformed_toml_shows_line_and_column(project):
    write(project, "bad.toml", 'name = "x"\n\n[model\nnum_layers = 2\n')
    err = bad_input(project, "plan", "bad.toml")
    assert err.startswith("mcx: error: 1 problem in ") and "bad.toml:\n" in err
    assert "malformed TOML" in err and "(at line 3, column 7)" in err and "fix the syntax" in err


def test_extends_cycle_names_the_chain(project):
    write(project, "a.toml", {"extends": "b.toml", **tiny(name="a")})
    write(project, "b.toml", {"extends": "a.toml"})
    err = bad_input(project, "plan", "a.toml")
    assert "extends: cycle: a.toml -> b.toml -> a.toml; remove one of these extends" in err


def test_impossible_layout_names_the_key_and_the_valid_values(project):
    write(project, "tp3.toml", tiny(model={"hidden_size": 1024, "num_attention_heads": 32, "num_query_groups": 8},
                                    hardware={"gpus_per_node": 8}, parallel={"tensor": 3, "pipeline": 1, "context": 1}))
    err = bad_input(project, "plan", "tp3.toml")
    assert "parallel.tensor: 3 does not divide model.num_attention_heads = 32; use 1, 2, 4 or 8" in err
    # every layout problem at once: 3 does not divide the 8 GPUs either
    assert "parallel: tensor x pipeline x context = 3 x 1 x 1 = 3 does not divide the world size 8" in err
    assert err.startswith("mcx: error: 2 problems")


def test_cuda_graphs_where_no_gpu_will_train_are_refused(project):
    """train.cuda_graphs (D75) on a machine without a GPU: the spec's "any" would train on CPU."""
    err = bad_input(project, "plan", "tiny.toml", "--set", "train.cuda_graphs=true")
    assert "train.cuda_graphs: true needs a GPU (CUDA graphs), and this machine has none visible" in err
    err = bad_input(project, "plan", "tiny.toml", "--set", "train.cuda_graphs=true", "--set", 'hardware.gpu="cpu"')
    assert 'train.cuda_graphs: true needs a GPU (CUDA graphs); hardware.gpu = "cpu"; set it to false' in err


def test_unknown_keys_suggest_the_nearest(project):
    write(project, "typo.toml", tiny(model={"num_layer": 4}, launch={"slurm": {"partion": "gpu"}}))
    err = bad_input(project, "plan", "typo.toml", "--set", "train.seeds=1")
    assert "model.num_layer: unknown key; did you mean 'num_layers'?" in err
    assert "launch.slurm.partion: unknown key; did you mean 'partition'?" in err
    assert "train.seeds: unknown key; did you mean 'seed'?" in err
    assert err.startswith("mcx: error: 3 problems in typo.toml:")


def test_wrong_types_are_not_coerced(project):
    write(project, "types.toml", tiny(train={"lr": "3e-4", "train_iters": 2.5, "deterministic": 1}))
    err = bad_input(project, "plan", "types.toml")
    assert 'train.lr: expected a number, got str "3e-4"' in err
    assert "train.train_iters: expected an integer, got float 2.5" in err
    assert "train.deterministic: expected true or false, got int 1" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_input_errors(project, value):
    write(project, "nan.toml", re.sub(r"^lr = .*$", f"lr = {value}", tomli_w.dumps(tiny()), count=1, flags=re.M))
    err = bad_input(project, "plan", "nan.toml")
    assert "train.lr" in err and "finite" in err


@pytest.mark.parametrize("item,shown", [
    ("train.lr", "--set: 'train.lr' is not KEY=VALUE; write e.g. --set train.lr=3e-4"),
    ("train.lr=fast", 'train.lr: expected a number, got str "fast"'),
    ("train..lr=1", "--set: 'train..lr' is not a dotted key"),
])
def test_bad_set(project, item, shown):
    assert shown in bad_input(project, "plan", "tiny.toml", "--set", item)


# --- run IDs --------------------------------------------------------------------------------------

# A run ID argument must never reach a path or a shell: each of these is refused before either.
BAD_IDS = ["../../etc/passwd", "abc;rm -rf /", "$(reboot)", "`touch PWNED`", "abc;touch PWNED", "$(touch PWNED)",
           "0123456789AB", "0123456789ab/../x", "-", "~"]


@pytest.mark.parametrize("run_id", BAD_IDS)
def test_explain_refuses_a_malformed_run_id(project, run_id):
    err = one_paragraph(bad_input(project, "explain", run_id, "tiny.toml"))
    assert f"{run_id!r} is neither a spec file nor a run ID" in err
    assert "12-character run ID" in err
    assert not (project / "PWNED").exists() and not (project.parent / "PWNED").exists()


@pytest.mark.parametrize("verb", ["show", "reproduce", "compare", "baseline", "pull", "status", "logs", "cancel"])
def test_run_id_verbs_refuse_malformed_ids(project, verb):
    for run_id in ["../../etc/passwd", "abc;rm -rf /", "$(touch PWNED)", "0123456789AB"]:
        args = ["baseline", "set", "main", run_id] if verb == "baseline" else [verb, run_id]
        err = one_paragraph(bad_input(project, *args))
        assert repr(run_id) in err and "is not a run ID" in err and "12 lowercase hex digits" in err
        assert not (project / "PWNED").exists()


@pytest.mark.parametrize("ref", ["", ".", "..", "../.."])
def test_explain_of_a_directory_is_not_a_spec(project, ref):
    err = bad_input(project, "explain", ref, "tiny.toml")
    assert "cannot read" in err and "IsADirectoryError; give a UTF-8 TOML file" in err


@pytest.mark.parametrize("args", [
    pytest.param(["show", "0123456789ab"], id="show"),
    pytest.param(["baseline", "set", "main", "0123456789ab"], id="baseline-set"),
    pytest.param(["reproduce", "0123456789ab"], id="reproduce"),
    pytest.param(["compare", "0123456789ab"], id="compare"),
    pytest.param(["compare", "--baseline", "fedcba987654", "0123456789ab"], id="compare-baseline"),
    pytest.param(["explain", "0123456789ab", "fedcba987654"], id="explain"),
    pytest.param(["pull", "0123456789ab"], id="pull"),
])
def test_unknown_run_id_writes_nothing(project, args):
    err = one_paragraph(bad_input(project, *args))
    assert "0123456789ab" in err and "mcx ls" in err


def test_traversal_to_a_real_file_reads_it_as_a_spec_and_fails_cleanly(project):
    """explain takes a spec path too: a path that climbs out to a file that is not a spec is malformed TOML."""
    etc = project.parent.parent / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    err = bad_input(project, "explain", "../../etc/passwd", "tiny.toml")
    assert "passwd" in err and "malformed TOML" in err and "line 1, column" in err


def test_well_formed_unknown_run_id(project):
    err = one_paragraph(bad_input(project, "explain", "0123456789ab", "tiny.toml"))
    assert "unknown run ID 0123456789ab" in err and "mcx ls" in err


@pytest.mark.parametrize("args", [["plan", "x" * 300], ["plan", "long_extends.toml"], ["explain", "x" * 300, "tiny.toml"],
                                  ["--project", "p" * 300, "plan", "tiny.toml"], ["data", "prepare", "x" * 300, "--out", "o"]],
                         ids=["plan", "extends", "explain", "project", "data-prepare"])
def test_overlong_names(project, args):
    write(project, "long_extends.toml", {"extends": "y" * 300, **tiny()})
    assert "too long" in bad_input(project, *args)


@pytest.mark.parametrize("verb", ["show", "reproduce", "compare", "pull"])
def test_an_overlong_run_id_is_refused(project, verb):
    assert "is not a run ID" in one_paragraph(bad_input(project, verb, "a" * 300))


# --- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,shown", [
    ([], "the following arguments are required: COMMAND"),
    (["nope"], "argument COMMAND: invalid choice: 'nope'"),
    (["plan"], "the following arguments are required: spec"),
    (["plan", "tiny.toml", "--bogus"], "unrecognized arguments: --bogus"),
    (["explain", "tiny.toml"], "the following arguments are required: b"),
    (["compare", "--format", "pdf"], "argument --format: invalid choice: 'pdf'"),
    (["run", "tiny.toml", "--stage", "half"], "argument --stage: invalid choice: 'half'"),
    (["data", "prepare", "--vocab-size", "many"], "argument --vocab-size: invalid int value: 'many'"),
])
def test_usage_errors_are_one_paragraph(project, args, shown):
    err = one_paragraph(bad_input(project, *args))
    assert shown in err and "--help' for the options." in err


@pytest.mark.parametrize("args, shown", [
    (["--profile", "201"], "--profile 201 reaches past the full stage's last step (train.train_iters = 200); "
                           "profile steps between 1 and 200"),
    (["--profile", "5:3"], "--profile '5:3' is not a step range; give a step (--profile 3) or an inclusive range"),
    (["--profile", "3", "--stage", "smoke"], "--profile 3 profiles steps of the full stage, which this command does "
                                             "not run"),
])
def test_run_refuses_a_profile_outside_the_full_stage_s_steps(project, args, shown):
    """`mcx run --profile` (D73): a range the full stage does not train is bad input, said before anything runs."""
    assert shown in one_paragraph(bad_input(project, "run", "tiny.toml", "--dry-run", *args))


def test_profile_steps_are_one_step_or_an_inclusive_range_counted_from_one():
    from mcx.contract.profile import ProfileSteps, parse_profile_steps
    from mcx.errors import InputError

    assert parse_profile_steps("3") == ProfileSteps(3, 3) and parse_profile_steps(" 5:8 ") == ProfileSteps(5, 8)
    assert [s in ProfileSteps(5, 8) for s in (4, 5, 8, 9)] == [False, True, True, False]
    assert ProfileSteps(5, 8).text() == "5:8" and ProfileSteps(3, 3).text() == "3"
    for bad in ("0", "0:2", "5:3", "3:", ":3", "x", "1-3", "2.5", ""):
        with pytest.raises(InputError, match="is not a step range"):
            parse_profile_steps(bad)


def test_a_project_that_does_not_exist(project):
    err = one_paragraph(bad_input(project, "--project", str(project / "nowhere"), "plan", "tiny.toml"))
    assert "project directory" in err and "does not exist" in err and "--project" in err


def test_prepare_inside_a_dvc_tracked_output_is_refused(project):
    """data.dvc tracks all of data/: a new dataset there would change its hash, and every quickstart
    spec would then exit 2; mcx data prepare says so and writes nothing (D38)."""
    write(project, "corpus.jsonl", '{"text": "a document"}\n')
    err = one_paragraph(bad_input(project, "data", "prepare", "corpus.jsonl", "--out", "data/mine"))
    assert "--out data/mine is inside data/, which DVC tracks as one output in data.dvc" in err
    assert "e.g. --out datasets/mine, then `dvc add datasets/mine`" in err
    assert "pass --inside-tracked" in err and "`dvc add data` (and commit data.dvc)" in err
    assert err.rstrip().endswith("Nothing was written.")


# --- mcx import -------------------------------------------------------------------------------------

_SCRIPT = """#!/bin/bash
# Mixtral 8x7B-shaped, without --lr and --train-iters
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 \\
    --normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights \\
    --disable-bias-linear --hidden-dropout 0.0 --attention-dropout 0.0 --num-experts 8 --moe-router-topk 2 \\
    --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 --tensor-model-parallel-size 2 \\
    --expert-model-parallel-size 4 --sequence-parallel --micro-batch-size 1 --global-batch-size 256 --bf16 \\
    --data-path /data/slimpajama_text_document --tokenizer-type Llama2Tokenizer --tokenizer-model /t/tok.model{extra}
"""


def test_import_names_every_missing_value_with_its_set(project):
    write(project, "mixtral.sh", _SCRIPT.format(extra=""))
    err = one_paragraph(bad_input(project, "import", "mixtral.sh", "-o", "mixtral.toml"))
    assert err == ("mcx: error: mixtral.sh does not give --train-iters (or --train-samples) and --lr, which "
                   "Megatron-LM and mcx both need; add --set train.train_iters=VALUE --set train.lr=VALUE to the "
                   "mcx import command.\n")
    err = one_paragraph(bad_input(project, "import", "mixtral.sh", "--set", "train.train_iters=10"))
    assert "does not give --lr, which" in err and "add --set train.lr=VALUE to" in err
    proc = mcx(project, "import", "mixtral.sh", "-o", "mixtral.toml", "--set", "train.lr=1e-4",
               "--set", "train.train_iters=1000", "--set", "model.vocab_size=32000")
    assert proc.returncode == 0 and proc.stdout == "" and "mapped" in proc.stderr, proc.stderr
    spec = tomllib.loads((project / "mixtral.toml").read_text())
    assert (spec["train"]["lr"], spec["train"]["train_iters"], spec["model"]["vocab_size"]) == (1e-4, 1000, 32000)


def test_import_set_is_read_as_plan_reads_it(project):
    write(project, "mixtral.sh", _SCRIPT.format(extra=" --lr 1e-4 --train-iters 10"))
    assert 'train.lr: expected a number, got str "fast"' in bad_input(
        project, "import", "mixtral.sh", "-o", "m.toml", "--set", "train.lr=fast")
    assert "--set: 'train.lr' is not KEY=VALUE" in bad_input(project, "import", "mixtral.sh", "--set", "train.lr")


def test_import_refuses_an_argument_megatron_does_not_know(project):
    write(project, "bogus.sh", _SCRIPT.format(extra=" --lr 1e-4 --train-iters 10 --bogus-flag 3 --seqlen 5"))
    err = one_paragraph(bad_input(project, "import", "bogus.sh", "-o", "bogus.toml"))
    assert err == ("mcx: error: line 3 of bogus.sh passes --bogus-flag (no argument is close) and --seqlen (did you "
                   "mean --seq-length, --seed or --mscale?), which Megatron-LM's pretrain_gpt.py does not know, so it "
                   "would refuse the command; correct or remove them in the script, then import again.\n")


# --- where output goes: results on stdout, progress on stderr; a pipe gets plain, whole lines -------


RUN_IDS = ["0123456789ab", "fedcba987654"]
LONG_NAME = "a name long enough to wrap " * 3


def recorded_runs(project: Path) -> list[str]:
    """Two run directories as `mcx run` leaves them (run.json with a summary)."""
    for i, rid in enumerate(RUN_IDS):
        rdir = project / ".mcx" / "runs" / rid
        rdir.mkdir(parents=True)
        (rdir / "run.json").write_text(json.dumps({
            "run_id": rid, "name": LONG_NAME, "status": "finished", "started": 1e9 - i,
            "summary": {"stages": {"smoke": {"status": "finished"}, "full": {"status": "finished"}},
                        "final": {"train_loss": 2.5, "valid_loss": 2.75}}}))
        (rdir / "spec.toml").write_text(f'name = "{LONG_NAME}"\n')
    return RUN_IDS


def test_ls_on_a_pipe_is_tab_separated_with_a_header(project):
    ids = recorded_runs(project)
    proc = subprocess.run(f"{sys.executable} -m mcx ls | cut -f1", shell=True, cwd=project, capture_output=True,
                          text=True, env={**os.environ, "MCX_PROJECT": str(project)}, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "run_id" and sorted(lines[1:]) == sorted(ids)  # the header, then one run a line
    full = mcx(project, "ls").stdout.splitlines()
    assert full[0].split("\t")[:3] == ["run_id", "name", "status"] and len(full) == 3
    row = full[1].split("\t")
    assert len(row) == 9 and row[2] == "finished", row
    assert row[1] == " ".join(LONG_NAME.split())  # whole: no wrapping, no "…"
    assert "\x1b[" not in "\n".join(full)


def test_tables_on_a_pipe_are_neither_wrapped_nor_coloured(project):
    proc = mcx(project, "plan", "tiny.toml")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "\x1b[" not in proc.stderr
    smoke = next(line for line in proc.stdout.splitlines() if line.startswith("Smoke stage: "))
    assert len(smoke) > 80 and smoke.rstrip().endswith("DP 1"), smoke  # one line, not wrapped at 80 columns
    forced = subprocess.run([sys.executable, "-m", "mcx", "plan", "tiny.toml"], cwd=project, capture_output=True,
                            text=True, env={**os.environ, "MCX_PROJECT": str(project), "COLUMNS": "40",
                                            "NO_COLOR": "1"}, timeout=120)
    assert forced.stdout == proc.stdout  # COLUMNS does not wrap a pipe either


def test_sync_exits_1_while_records_are_still_pending(tmp_path):
    """A run recorded while its tracking server was down leaves records spooled; `mcx sync` that cannot
    reach the server either says so and exits 1, its --json object still alone on stdout."""
    from mcx.spec import dump_spec, load_spec
    from mcx.track.recorder import RunRecorder

    project = tmp_path / "p"
    rdir = project / ".mcx" / "runs" / RUN_IDS[0]
    rdir.mkdir(parents=True)
    (rdir / "run.json").write_text(json.dumps({"run_id": RUN_IDS[0], "name": "tiny", "status": "finished"}))
    (rdir / "spec.toml").write_text(dump_spec(load_spec(ROOT / "experiments" / "tiny.toml")))
    (rdir / "fingerprint.json").write_text(json.dumps({"run_id": RUN_IDS[0]}))
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rec = RunRecorder.for_run(project, rdir, tracking_uri=f"http://127.0.0.1:{port}")
    rec.start(launcher="local")
    rec.finish("finished")
    assert rec.close().state == "pending"
    proc = mcx(project, "sync", "--json")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert doc["ok"] is False and [r["state"] for r in doc["runs"]] == ["pending"]
    text = mcx(project, "sync")
    assert text.returncode == 1 and "still pending" in text.stdout, (text.stdout, text.stderr)


# --- mcx tune: refused at once where its trials cannot run ------------------------------------------


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU: the trials could run")
def test_tune_refuses_a_gpu_spec_on_a_machine_without_one_at_once(project):
    """Refused from the plan alone: torch and Megatron-Core are never imported, so no trial and no model
    (``-X importtime`` lists every module the command imports, on stderr)."""
    shutil.copyfile(ROOT / "experiments" / "h200_1gpu.toml", project / "h200.toml")
    before = tree(project)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mcx", "tune", "h200.toml"], cwd=project,
                          capture_output=True, text=True, env={**os.environ, "MCX_PROJECT": str(project)}, timeout=300)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    err = "".join(line + "\n" for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    assert proc.returncode == 2 and err.startswith("mcx: error: ") and proc.stdout == "", (proc.returncode, err)
    assert "mcx.ops.tune" in imported and not {"torch", "megatron", "megatron.core"} & imported
    assert tree(project) == before and not (project / ".mcx").exists()
    assert "mcx tune: its trials cannot run here" in err
    assert 'train.precision: "bf16" needs a CUDA GPU' in err and "--set train.precision=fp32" in err
    assert 'hardware.gpu: "H200", but this machine shows no GPU' in err
    assert "worker.log" not in err


def test_tune_carries_the_failing_trial_s_log_into_its_error(tmp_path):
    """A trial that stops for another reason: its directory goes with tune's, so the log's last lines
    are in the error (never a path to a deleted worker.log)."""
    from mcx.ops import tune as tune_mod

    (tmp_path / "worker.log").write_text("".join(f"line {i}\n" for i in range(40)) + "RuntimeError: boom\n")
    tail = tune_mod._log_tail(tmp_path)
    assert tail.splitlines()[-1] == "    RuntimeError: boom" and "line 25" not in tail and "line 26" in tail
    assert "no log" in tune_mod._log_tail(tmp_path / "empty")
