"""Bad input through the real command line (`python -m mcx`): exit code 2, one clear message, no
traceback, and nothing written into the project (no .mcx/, no mlruns/)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
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
VERB_MODULES = {"show": "mcx.ops.records", "reproduce": "mcx.ops.reproduce", "compare": "mcx.ops.compare",
                "explain": "mcx.ops.explain", "baseline": "mcx.ops.records", "pull": "mcx.ops.pull"}


def _ready(verb: str) -> bool:
    return importlib.util.find_spec(VERB_MODULES[verb]) is not None


@pytest.mark.parametrize("run_id", BAD_IDS)
def test_explain_refuses_a_malformed_run_id(project, run_id):
    err = one_paragraph(bad_input(project, "explain", run_id, "tiny.toml"))
    assert f"{run_id!r} is neither a spec file nor a run ID" in err
    assert "12-character run ID" in err
    assert not (project / "PWNED").exists() and not (project.parent / "PWNED").exists()


@pytest.mark.parametrize("verb", ["show", "reproduce", "compare", "baseline", "pull"])
def test_run_id_verbs_refuse_malformed_ids(project, verb):
    if not _ready(verb):
        pytest.skip(f"{VERB_MODULES[verb]} not written yet")
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
    verb = args[0]
    if not _ready(verb):
        pytest.skip(f"{VERB_MODULES[verb]} not written yet")
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
    if not _ready(verb):
        pytest.skip(f"{VERB_MODULES[verb]} not written yet")
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
