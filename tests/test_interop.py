"""Megatron-LM interop against the real components: bash runs the scripts (with recording stand-ins
for torchrun/srun), Megatron-LM's own argument parser (megatron-core 0.19.2) reads the exported
arguments and checks the flag table, torch's torchrun parser checks the launcher table."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import stat
import subprocess
import textwrap
import warnings
from functools import cache
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcx.errors import InputError, SpecError
from mcx.interop import export_args, export_script, import_file, import_script, summary, to_toml
from mcx.interop import flags as F
from mcx.interop.docgen import DOC, update
from mcx.interop.importer import ImportResult
from mcx.spec.keys import flatten, spec_keys
from mcx.interop.launcher import slurm_time
from mcx.interop.script import Launch, Unknown, read_script
from mcx.interop.unmapped import DROPPED, HANDLED, TORCHRUN_HANDLED, TORCHRUN_MAPPED, TORCHRUN_SWITCHES
from mcx.spec import load_spec, loads_spec
from mcx.spec.schema import ExperimentSpec

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "fixtures" / "megatron_scripts"
FIXTURES = sorted(p.name for p in SCRIPTS.glob("*.sh"))
# The positional arguments each fixture is run with (the published examples': as their READMEs show).
SCRIPT_ARGS = {
    "train_gpt3_1.3b.sh": ["/data/gpt3/pile_text_document"],
    "published_llama3_8b_h100_fp8.sh": ["checkpoints/llama3_8b_fp8", "tensorboard_logs/llama3_8b_fp8",
                                        "/workspace/tokenizer_model", "/workspace/data_dir/mydata_prefix"],
    "published_mixtral_8x7b_distributed.sh": ["checkpoints/mixtral_8x7b", "/workspace/tokenizers/tokenizer.model",
                                              "/workspace/data/mixtral_text_document"],
}
# The environment a fixture reads: the Mixtral example takes its node count from Slurm (4 nodes: its
# TP 1 x PP 4 x EP 8 needs 32 GPUs).
SCRIPT_ENV = {"published_mixtral_8x7b_distributed.sh": {"SLURM_NNODES": "4"}}
# What Slurm would set for the sbatch fixture when bash runs it.
SLURM_ENV = {"SLURM_NNODES": "4", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[001-004]",
             "SLURM_JOB_NAME": "llama3-8b-fp8"}


@cache
def imported(name: str) -> ImportResult:
    return import_file(SCRIPTS / name, env=SCRIPT_ENV.get(name), args=SCRIPT_ARGS.get(name, ()))[1]


def fixture_launch(name: str) -> Launch:
    launch = read_script((SCRIPTS / name).read_text(), env=SCRIPT_ENV.get(name), args=SCRIPT_ARGS.get(name, ())).launch
    assert launch is not None
    return launch


# ---- real bash, with torchrun / python / srun replaced by a recorder of their argv


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("shims")
    rec = d / "record"
    rec.write_text('#!/bin/bash\nprintf \'%s\\0\' "$(basename "$0")" "$@" > "$ARGV_OUT"\n')
    rec.chmod(rec.stat().st_mode | stat.S_IEXEC)
    for name in ("torchrun", "python", "python3", "srun"):
        (d / name).symlink_to(rec)
    scontrol = d / "scontrol"
    scontrol.write_text("#!/bin/sh\necho node001\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    return d


def bash_argv(text: str, shims: Path, tmp: Path, args: list[str] = (), env: dict | None = None) -> list[str]:
    """The argv of the first torchrun/python/srun the script runs, as bash runs it: in a stand-in
    Megatron-LM checkout (an empty pretrain_gpt.py) under ``tmp``, where what the script writes lands."""
    script, out, work = tmp / "script.sh", tmp / "argv.bin", tmp / "megatron-lm"
    script.write_text(text)
    out.unlink(missing_ok=True)
    work.mkdir(exist_ok=True)
    (work / "pretrain_gpt.py").touch()
    run_env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp), "ARGV_OUT": str(out), **(env or {})}
    proc = subprocess.run(["bash", str(script), *args], env=run_env, cwd=work, capture_output=True, text=True,
                          timeout=30)
    assert out.exists(), f"bash launched nothing (rc {proc.returncode}): {proc.stderr}"
    return out.read_bytes().decode().split("\0")[:-1]


def same_words(words, argv: list[str]) -> bool:
    """Reader's words vs bash's argv; an Unknown word stands for whatever bash had there."""
    if len(words) != len(argv):
        return False
    return all(isinstance(w, Unknown) or w == a or (i == 0 and w.rsplit("/", 1)[-1] == a)
               for i, (w, a) in enumerate(zip(words, argv, strict=True)))


@pytest.mark.parametrize("name", FIXTURES)
def test_reader_sees_the_command_bash_runs(name: str, shims: Path, tmp_path: Path) -> None:
    text = (SCRIPTS / name).read_text()
    argv = bash_argv(text, shims, tmp_path, SCRIPT_ARGS.get(name, []), {**SLURM_ENV, **SCRIPT_ENV.get(name, {})})
    launch = fixture_launch(name)
    assert launch is not None and same_words(launch.words, argv), (launch.words if launch else None, argv)


SNIPPETS = {
    "quoting": """A="two words"; B='$A'
        torchrun pretrain_gpt.py $A "$A" '$A' $B "x${A}y" \\$A a\\ b "" $'tab\\tnew'""",
    "arrays": """ARR=(--a 1 "--b two" --c)   # a comment, not an element
        ARR+=(--d "4 4")
        EMPTY=()
        python pretrain_gpt.py ${ARR[@]} "${ARR[@]}" "${EMPTY[@]}" ${#ARR[@]} ${ARR[2]} "${ARR[*]}" $ARR""",
    "string of args": """GPT_ARGS="--num-layers 2
            --hidden-size 64"
        OTHER='--x 1'
        torchrun --nproc_per_node 2 pretrain_gpt.py $GPT_ARGS "$OTHER" ${UNSET_BUT_DEFAULT:-}""",
    "defaults": """X=${NOT_SET:-"d e"}; Y=${X:+set}; Z=${EMPTY-}; EMPTY=""; W=${EMPTY:-w} V=${EMPTY-v}
        : ${ASSIGNED:=given}
        torchrun pretrain_gpt.py "$X" $Y "$Z" $W "$V" $ASSIGNED ${1:-first} "${2:-second arg}" """,
    "arithmetic": """N=8; M=3
        torchrun pretrain_gpt.py $((N*M)) $(( (N + 1) / 2 )) $((-7 / 2)) $((-7 % 3)) $((N ** 2)) $((N<<2)) $((M))""",
    "conditions": """DTYPE=fp8; N=4; ARGS=()
        if [[ "$DTYPE" == fp* && $N -gt 2 ]]; then ARGS+=(--fp8-format hybrid); elif [ -z "$N" ]; then ARGS+=(--no); else ARGS+=(--else); fi
        if [ "$DTYPE" = bf16 ] || [ $N -eq 4 ]; then ARGS+=(--or); fi
        [ "$N" -lt 2 ] && ARGS+=(--and) || ARGS+=(--or-else)
        ! [[ $DTYPE =~ ^bf ]] && ARGS+=(--regex)
        case "$DTYPE" in bf16) ARGS+=(--bf16) ;; fp8|fp16) ARGS+=(--fp) ;; *) ARGS+=(--other) ;; esac
        torchrun pretrain_gpt.py ${ARGS[@]}""",
    "functions and continuations": """launch() {
            local extra="--seed $1"
            torchrun --nnodes=1 pretrain_gpt.py \\
                --lr 1e-4 \\
                $extra "$@"   # trailing comment \\
        }
        cat <<EOF > /dev/null
        torchrun pretrain_gpt.py --not-this-one
        EOF
        launch 42 --last""",
    "bash -c under srun": """export PORT=6001
        srun -N 2 --ntasks-per-node=1 bash -c "torchrun --master_port $PORT pretrain_gpt.py --lr 2e-4" | tee log""",
    "python -m torch.distributed.run": """python -u -m torch.distributed.run --nproc-per-node=4 pretrain_gpt.py --lr=1e-3 2>&1""",
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_reader_agrees_with_bash_on_shell_features(name: str, shims: Path, tmp_path: Path) -> None:
    text = "#!/bin/bash\n" + textwrap.dedent("        " + SNIPPETS[name])
    argv = bash_argv(text, shims, tmp_path)
    script = read_script(text)
    assert script.launch is not None
    words = list(script.launch.words)
    if name == "bash -c under srun":  # bash records srun's argv; the reader looks inside the bash -c string
        assert argv[:5] == ["srun", "-N", "2", "--ntasks-per-node=1", "bash"]
        inner = read_script(argv[-1], env={"PORT": "6001"}).launch
        assert inner is not None and list(inner.words) == words
        assert script.launch.srun == (("-N", "2"), ("--ntasks-per-node", "1"))
        return
    assert all(isinstance(w, str) for w in words), words
    assert same_words(words, argv), (words, argv)


def test_reader_marks_what_only_running_could_tell() -> None:
    script = read_script(textwrap.dedent("""\
        MASTER_ADDR=$(hostname)
        CKPT=$CHECKPOINT_DIR/run
        if [ -f /etc/cluster ]; then DATA=/fast/data; fi
        if command -v nvidia-smi; then torchrun pretrain_gpt.py --lr 1; fi
        for i in 1 2; do EXTRA=--seed; done
        torchrun --master_addr $MASTER_ADDR pretrain_gpt.py --save $CKPT --data-path $DATA $EXTRA --lr 2
        """))
    launch = script.launch
    assert launch is not None and launch.line == 6
    unknown = {w.reason.split(" ")[0] for w in launch.words if isinstance(w, Unknown)}
    assert unknown == {"$(hostname)", "$CHECKPOINT_DIR", "DATA", "EXTRA"}  # EXTRA: assigned in a loop body
    assert launch.words[-2:] == ("--lr", "2")
    text = "\n".join(script.problems)
    assert "line 4: a launch command inside the `if` at line 4 is not imported" in text


def test_reader_runs_nothing(tmp_path: Path) -> None:
    marks = [tmp_path / f"m{i}" for i in range(4)]
    read_script(f"touch {marks[0]}\nX=$(touch {marks[1]})\nY=`touch {marks[2]}`\n"
                f"bash -c 'touch {marks[3]}'\ntorchrun pretrain_gpt.py --lr 1\n")
    assert not any(m.exists() for m in marks)


def test_syntax_errors_name_the_line() -> None:
    with pytest.raises(InputError, match="line 3: unterminated double quote"):
        read_script('A=1\nB=2\nC="oops\n')
    with pytest.raises(InputError, match="'if' is never closed"):
        import_script("if true; then\n torchrun pretrain_gpt.py\n", name="x")


def test_arithmetic_matches_bash(shims: Path, tmp_path: Path) -> None:
    exprs = ["1+2*3", "(1+2)*3", "17/5", "-17/5", "17%-5", "-17%5", "2**10", "1<<4|1", "7^2&3", "~5", "X*Y-1"]
    text = "X=6; Y=7\ntorchrun pretrain_gpt.py " + " ".join(f"$(({e}))" for e in exprs)
    assert list(read_script(text).launch.args) == bash_argv(text, shims, tmp_path)[2:]
    assert isinstance(read_script("torchrun pretrain_gpt.py $((1/0)) $((x++))").launch.args[0], Unknown)


def test_sbatch_header() -> None:
    script = read_script("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --partition=gpu -t 90\n#SBATCH --exclusive # whole nodes\n"
                         "echo hi\n#SBATCH --nodes=9\nsrun torchrun --nnodes $SLURM_NNODES pretrain_gpt.py\n")
    assert script.sbatch == (("--nodes", "2"), ("--partition", "gpu"), ("--time", "90"), ("--exclusive", None))
    assert script.launch.torchrun == (("--nnodes", "2"),)
    assert any("ignored by sbatch" in p for p in script.problems)
    assert [slurm_time(t) for t in ("90", "90:30", "1:02:03", "2-0", "1-12:30", "UNLIMITED")] == [
        "01:30:00", "01:30:30", "01:02:03", "2-00:00:00", "1-12:30:00", None]


# ---- the flag table


def test_every_schema_key_has_exactly_one_row() -> None:
    rows = [row.key for row in F.FLAGS]
    assert len(rows) == len(set(rows))
    assert set(rows) == set(spec_keys())


def test_rows_are_well_formed() -> None:
    for row in F.FLAGS:
        assert row.doc.strip(), row.key
        if row.kind == "mcx":
            assert not row.args and row.note.strip(), f"{row.key}: mcx-only rows give the reason"
        else:
            assert row.args, row.key
        if row.kind in ("value", "switch", "negated"):
            assert len(row.args) == 1 and row.args[0].startswith("--"), row.key
        if row.kind in ("switch", "negated"):
            assert spec_keys()[row.key].base is bool, row.key
        assert row.when is None or row.when in F.WHEN, row.key
    assert set(F.BY_ARG).isdisjoint(HANDLED) and set(F.BY_ARG).isdisjoint(DROPPED)
    assert set(HANDLED).isdisjoint(DROPPED)


@pytest.fixture(scope="module")
def megatron() -> argparse.ArgumentParser:
    """Megatron-LM's own pretrain_gpt.py argument parser (megatron-core 0.19.2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    return parser


def test_every_argument_in_the_tables_exists_in_megatron(megatron: argparse.ArgumentParser) -> None:
    options = megatron._option_string_actions
    pretrain = [a for row in F.FLAGS if row.kind not in ("launcher", "mcx") for a in row.args]
    missing = [a for a in [*pretrain, *HANDLED, *DROPPED] if a not in options]
    assert not missing


# Where the table's "absent" differs from the parser's default on purpose:
_ABSENT_EXCEPTIONS = {
    "data.split": "Megatron-LM's validate_args sets '969, 30, 1' when --split is absent",
    "model.max_position_embeddings": "required by validate_args; the parser has no default",
}


def test_absent_values_are_megatrons_defaults(megatron: argparse.ArgumentParser) -> None:
    options = megatron._option_string_actions
    for row in F.FLAGS:
        if row.kind not in ("value", "switch", "negated") or row.key in _ABSENT_EXCEPTIONS:
            continue
        default = options[row.args[0]].default
        if row.absent in (F.REQUIRED, F.DERIVED, F.UNMATCHED):
            assert default is None, (row.key, default)
        else:
            assert default == row.absent and type(default) is type(row.absent), (row.key, default, row.absent)
    assert not options["--bf16"].default and not options["--fp16"].default  # train.precision: fp32
    assert options["--position-embedding-type"].default == F.BY_KEY["model.position_embedding_type"].absent
    assert options["--transformer-impl"].default == "transformer_engine"  # imported as "auto": see the row's note
    for flag in ("--num-layers-per-virtual-pipeline-stage", "--recompute-granularity", "--save-interval",
                 "--train-iters", "--lr-decay-iters", "--tokenizer-type", "--data-path", "--save"):
        assert options[flag].default is None, flag
    assert options["--lr-warmup-iters"].default == 0 and options["--async-save"].default is False


def test_spec_choices_are_megatron_choices(megatron: argparse.ArgumentParser) -> None:
    options = megatron._option_string_actions
    passed_through = {"model.position_embedding_type", "model.transformer_impl", "train.recompute_granularity"}
    for row in F.FLAGS:
        choices = spec_keys()[row.key].choices
        if (row.kind == "value" or row.key in passed_through) and choices and options[row.args[0]].choices:
            extra = set(choices) - set(options[row.args[0]].choices) - {"auto", "none"}
            assert not extra, (row.key, extra)


def test_torchrun_tables_match_torch() -> None:
    from torch.distributed.run import get_args_parser

    actions = get_args_parser()._actions
    options = {"--" + o[2:].replace("_", "-") if o.startswith("--") else o for a in actions for o in a.option_strings}
    assert set(TORCHRUN_MAPPED) | set(TORCHRUN_HANDLED) <= options
    switches = {o for a in actions if a.nargs == 0 for o in a.option_strings} - {"-h", "--help"}
    assert {"--" + s[2:].replace("_", "-") if s.startswith("--") else s for s in switches} == set(TORCHRUN_SWITCHES)


# ---- importing the fixtures


def test_llama3_70b_3d_parallel() -> None:
    r = imported("train_llama3_70b_3d.sh")
    s = r.spec
    assert s.model.preset == "llama3-70b" and r.spec_dict["model"]["preset"] == "llama3-70b"
    assert (s.model.num_layers, s.model.hidden_size, s.model.num_query_groups, s.model.ffn_hidden_size) == (80, 8192, 8, 28672)
    p = s.parallel
    assert (p.tensor, p.pipeline, p.virtual_pipeline, p.context) == (8, 4, 4, 1)
    assert p.sequence_parallel and p.distributed_optimizer and p.overlap_grad_reduce and p.overlap_param_gather
    assert (s.train.precision, s.train.recompute_granularity, s.train.global_batch_size) == ("bf16", "selective", 1024)
    assert s.data.path == "/lustre/data/dclm" and s.data.prefix == "dclm_text_document"
    assert s.data.tokenizer.kind == "huggingface"
    assert s.data.tokenizer.path == "/lustre/tokenizers/Meta-Llama-3-70B/tokenizer.json"
    assert (s.checkpoint.dir, s.checkpoint.interval, s.checkpoint.async_save) == ("/lustre/checkpoints/llama3-70b", 1000, True)
    assert (s.hardware.nodes, s.hardware.gpus_per_node, s.launch.kind, s.launch.master_port) == (8, 8, "torchrun", 6000)
    reasons = dict(r.unsupported)
    assert "SDPA" in reasons["--use-flash-attn"] and reasons["--use-mcore-models"] == "always Megatron-Core models"
    assert "MLflow" in reasons["--tensorboard-dir"] and "torchrun --master-addr" in reasons
    assert r.problems == []


def test_mixtral_8x7b_moe() -> None:
    r = imported("train_mixtral_8x7b_ep.sh")
    m, p = r.spec.model, r.spec.parallel
    assert (m.num_experts, m.moe_router_topk, m.moe_router_load_balancing_type, m.moe_aux_loss_coeff) == (8, 2, "aux_loss", 0.01)
    assert (m.moe_token_dispatcher_type, m.moe_grouped_gemm, m.moe_ffn_hidden_size) == ("alltoall", True, None)
    assert (p.tensor, p.pipeline, p.expert, p.sequence_parallel) == (2, 4, 8, True)
    assert p.virtual_pipeline == 1  # pipelined without --num-layers-per-virtual-pipeline-stage: no interleaving
    assert (m.rotary_base, m.max_position_embeddings, m.init_method_std) == (1000000, 32768, 0.01)
    assert r.spec.data.tokenizer.kind == "sentencepiece"
    assert r.spec.train.adam_beta2 == 0.999  # the script leaves --adam-beta2 out: Megatron-LM's default, not mcx's 0.95
    assert r.spec.train.lr_decay_iters == 320000
    assert dict(r.unsupported)["--no-position-embedding"] == "no effect with rotary embeddings"
    assert len(r.problems) == 1 and "may add to LOGGING_ARGS" in r.problems[0]


def test_gpt3_style_gelu_layernorm_gpt2_tokenizer() -> None:
    r = imported("train_gpt3_1.3b.sh")
    m = r.spec.model
    assert (m.normalization, m.swiglu, m.position_embedding_type) == ("LayerNorm", False, "learned_absolute")
    assert (m.untie_embeddings_and_output_weights, m.add_bias_linear, m.ffn_hidden_size) == (False, True, None)
    assert (m.hidden_dropout, m.attention_dropout) == (0.1, 0.1)
    tok = r.spec.data.tokenizer
    assert (tok.kind, tok.path, tok.merges) == ("gpt2", "data/gpt2-vocab.json", "data/gpt2-merges.txt")
    t = r.spec.train
    assert (t.precision, t.lr_warmup_iters, t.lr_decay_iters, t.micro_batch_size) == ("fp16", 2600, 260000, 4)
    assert (r.spec.parallel.distributed_optimizer, r.spec.launch.kind) == (False, "torchrun")
    assert dict(r.unsupported)["--rampup-batch-size"] == "mcx trains with a constant train.global_batch_size"
    warmup = next(x for x in r.mapped if x.key == "train.lr_warmup_iters")
    assert (warmup.flag, warmup.origin) == ("--lr-warmup-fraction", "derived: 0.01 x 260000 decay steps")


def test_a_value_known_only_at_run_time_is_named_with_its_set() -> None:
    with pytest.raises(InputError) as err:
        import_file(SCRIPTS / "train_gpt3_1.3b.sh")  # without DATA_PATH, its $1
    assert not isinstance(err.value, SpecError) and "\n" not in str(err.value)
    assert str(err.value) == (
        "train_gpt3_1.3b.sh does not give --data-path (its value cannot be read: $1 is the script's argument 1, and "
        "none was given to mcx import), which Megatron-LM and mcx both need; add --set data.path=DIR "
        "--set data.prefix=PREFIX to the mcx import command.")
    sets = ["data.path=/data/gpt3", "data.prefix=pile_text_document"]
    r = import_file(SCRIPTS / "train_gpt3_1.3b.sh", overrides=sets)[1]
    assert (r.spec.data.path, r.spec.data.prefix) == ("/data/gpt3", "pile_text_document")
    assert r.spec == imported("train_gpt3_1.3b.sh").spec


def test_slurm_sbatch_fp8() -> None:
    r = imported("sbatch_llama3_8b_fp8.sh")
    s = r.spec
    sl = s.launch.slurm
    assert (s.launch.kind, s.hardware.nodes, s.hardware.gpus_per_node) == ("slurm", 4, 8)
    assert (sl.partition, sl.account, sl.qos, sl.time) == ("gpu", "llm-pretrain", "high", "2-00:00:00")
    assert (sl.signal_grace_seconds, sl.requeue, sl.extra_sbatch) == (300, True, ("--cpus-per-task=96", "--exclusive"))
    t = s.train
    assert (t.precision, t.fp8_recipe, t.fp8_amax_history_len, t.fp8_amax_compute_algo) == ("fp8-hybrid", "delayed", 1024, "max")
    assert (t.recompute_granularity, t.recompute_method, t.recompute_num_layers) == ("full", "uniform", 1)
    assert (t.train_iters, t.lr_decay_iters, t.lr_warmup_iters, t.grad_reduce_in_bf16) == (15259, 15228, 30, True)
    assert (s.parallel.tensor, s.parallel.context, s.parallel.pipeline, s.parallel.virtual_pipeline) == (2, 2, 1, None)
    assert s.checkpoint.dir == "/shared/checkpoints/llama3-8b-fp8"  # $SLURM_JOB_NAME from #SBATCH --job-name
    assert s.launch.master_port is None  # the rendezvous endpoint holds $(scontrol ...): unknown without running
    reasons = dict(r.unsupported)
    assert "#SBATCH --output" in reasons and "torchrun --rdzv-endpoint" in reasons and "--exit-signal" in reasons
    assert r.problems == []


def test_published_llama3_8b_fp8() -> None:
    """Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh (core_v0.19.0), with a tokenizer and a dataset."""
    r = imported("published_llama3_8b_h100_fp8.sh")
    m, p, t = r.spec.model, r.spec.parallel, r.spec.train
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.kv_channels, m.ffn_hidden_size) == (32, 4096, 8, 128, 14336)
    assert (m.rotary_base, m.init_method_std, m.vocab_size, m.normalization) == (1000000, 0.0134, 128256, "RMSNorm")
    assert (t.precision, t.fp8_amax_history_len, t.fp8_amax_compute_algo, t.grad_reduce_in_bf16) == ("fp8-hybrid", 1024,
                                                                                                  "max", True)
    assert (t.global_batch_size, t.train_iters, t.lr_warmup_iters, t.lr_decay_iters) == (128, 15258789, 30517, 15228271)
    assert (p.tensor, p.context, p.pipeline, p.distributed_optimizer, p.overlap_param_gather) == (1, 1, 1, True, True)
    assert r.spec.data.split == "99,1,0"  # the script passes '99,1,0' with its quotes; Megatron-LM reads the numbers
    assert (r.spec.data.path, r.spec.data.prefix) == ("/workspace/data_dir", "mydata_prefix")
    assert r.spec.data.tokenizer.path == "/workspace/tokenizer_model/tokenizer.json"
    assert (r.spec.checkpoint.dir, r.spec.checkpoint.interval) == ("checkpoints/llama3_8b_fp8", 1000)
    reasons = dict(r.unsupported)
    for flag in ("--decoupled-lr", "--apply-layernorm-1p", "--calculate-per-token-loss", "--fp8-param-gather",
                 "--data-cache-path", "--profile", "--ckpt-format"):
        assert flag in reasons, flag
    assert len(r.problems) == 3 and all("is not a multiple of the global batch 128" in x for x in r.problems)
    with pytest.raises(InputError, match="does not give --data-path, which Megatron-LM and mcx both need; add --set "
                       "data.path=DIR --set data.prefix=PREFIX"):  # its default branch trains on MOCK data
        import_file(SCRIPTS / "published_llama3_8b_h100_fp8.sh")


def test_published_mixtral_8x7b() -> None:
    """Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh (core_v0.19.0) on 4 Slurm nodes."""
    r = imported("published_mixtral_8x7b_distributed.sh")
    m, p = r.spec.model, r.spec.parallel
    assert (m.num_experts, m.moe_router_topk, m.moe_aux_loss_coeff, m.moe_grouped_gemm) == (8, 2, 0.01, True)
    assert (p.tensor, p.pipeline, p.expert, p.virtual_pipeline) == (1, 4, 8, 1)
    assert (r.spec.hardware.nodes, r.spec.hardware.gpus_per_node, r.spec.launch.master_port) == (4, 8, 29500)
    assert r.spec.data.tokenizer.kind == "sentencepiece" and r.spec.model.vocab_size is None
    assert (r.spec.train.adam_beta2, r.spec.train.lr_decay_iters) == (0.999, 320000)
    reasons = dict(r.unsupported)
    assert reasons["--no-load-optim"].startswith("mcx resumes only its own checkpoints") and "--no-load-rng" in reasons
    assert len(r.problems) == 1 and "may add to LOG_ARGS" in r.problems[0]
    assert import_file(SCRIPTS / "published_mixtral_8x7b_distributed.sh",
                       args=SCRIPT_ARGS["published_mixtral_8x7b_distributed.sh"])[1].spec.hardware.nodes == 1


# A SentencePiece tokenizer's vocabulary lives in its file, which is on the cluster, not here: the import's
# note asks for it, and a user supplies it as below (Mixtral's tokenizer has 32,000 pieces).
VOCAB_FROM_USER = {"train_mixtral_8x7b_ep.sh": 32000, "published_mixtral_8x7b_distributed.sh": 32000}


@pytest.mark.parametrize("name", FIXTURES)
def test_imported_fixture_plans(name: str) -> None:
    from mcx.plan.planner import make_plan

    r = imported(name)
    if name in VOCAB_FROM_USER:
        assert any("--set model.vocab_size=" in note for note in r.notes), r.notes
        with pytest.raises(SpecError, match="model.vocab_size: unset"):
            make_plan(r.spec, te_available=None)
        r = import_file(SCRIPTS / name, env=SCRIPT_ENV.get(name), args=SCRIPT_ARGS.get(name, ()),
                        overrides=[f"model.vocab_size={VOCAB_FROM_USER[name]}"])[1]
    make_plan(r.spec, te_available=None)


@pytest.mark.parametrize("name", FIXTURES)
def test_every_argument_is_mapped_or_reported(name: str) -> None:
    r = imported(name)
    launch = fixture_launch(name)
    flags = {w.split("=")[0] for w in launch.args if isinstance(w, str) and w.startswith("--")}
    reported = {flag for flag, _ in r.unsupported}
    assert flags <= set(F.BY_ARG) | reported
    assert not (flags & reported) - set(HANDLED) - set(DROPPED) - {"--no-position-embedding"}


@pytest.mark.parametrize("name", FIXTURES)
def test_imported_toml_loads_with_mcx_spec(name: str, tmp_path: Path) -> None:
    text, result = import_file(SCRIPTS / name, env=SCRIPT_ENV.get(name), args=SCRIPT_ARGS.get(name, ()))
    path = tmp_path / "spec.toml"
    path.write_text(text)
    assert load_spec(path) == result.spec
    assert text.startswith(f"# Imported from {name} by `mcx import`.")


# ---- round trip and export


@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip_import_export_import(name: str) -> None:
    first = imported(name)
    script = export_script(first.spec)
    again = import_script(script, name=first.spec.name, description=first.spec.description)
    assert again.spec == first.spec
    assert again.problems == []
    assert export_args(again.spec) == export_args(first.spec)


@pytest.mark.parametrize("name", FIXTURES)
def test_exported_script_runs_the_exported_args(name: str, shims: Path, tmp_path: Path) -> None:
    spec = imported(name).spec
    assert subprocess.run(["bash", "-n"], input=export_script(spec), text=True).returncode == 0
    argv = bash_argv(export_script(spec), shims, tmp_path, env={**SLURM_ENV, "NODE_RANK": "0", "MASTER_ADDR": "n0"})
    args = export_args(spec)
    if spec.launch.kind == "slurm":
        assert argv[:2] == ["srun", "torchrun"] and argv[-1] == "--exit-signal-handler"
        argv = argv[1:-1]
    start = argv.index("pretrain_gpt.py") + 1
    assert argv[start:] == args
    dist = dict(zip(argv[1:start - 1:2], argv[2:start - 1:2], strict=True))
    assert dist["--nproc_per_node"] == str(spec.hardware.gpus_per_node)
    assert dist["--nnodes"] == str(spec.hardware.nodes)


@pytest.mark.parametrize("name", FIXTURES)
def test_megatron_reads_the_exported_args_as_the_spec(name: str, megatron: argparse.ArgumentParser) -> None:
    spec = imported(name).spec
    ns = megatron.parse_args(export_args(spec))
    values = {f"{a.name}": getattr(spec, a.name) for a in attrs.fields(ExperimentSpec)}
    options = megatron._option_string_actions
    args = export_args(spec)
    for row in F.FLAGS:
        section, _, field = row.key.partition(".")
        if row.kind not in ("value", "switch", "negated") or "." in field or not set(row.args) & set(args):
            continue
        want = getattr(values[section], field)
        got = getattr(ns, options[row.args[0]].dest)
        got = got[0] if isinstance(got, list) and len(got) == 1 else got  # nargs="+" (per layer type)
        assert got == want, (row.key, got, want)
    for row in F.FLAGS:  # what the export leaves out, Megatron-LM's default makes equal (or it does not matter)
        section, _, field = row.key.partition(".")
        if row.kind in ("switch", "negated") and "." not in field and not set(row.args) & set(args):
            got = getattr(ns, options[row.args[0]].dest)
            assert got == getattr(values[section], field) or not F.matters(row, flatten(spec)), row.key
    m, p, t = spec.model, spec.parallel, spec.train
    assert ns.bf16 == (t.precision in ("bf16", "fp8-hybrid", "fp8-e4m3")) and ns.fp16 == (t.precision == "fp16")
    assert ns.fp8 == {"fp8-hybrid": "hybrid", "fp8-e4m3": "e4m3"}.get(t.precision)
    assert ns.position_embedding_type == m.position_embedding_type
    assert ns.group_query_attention == (m.num_query_groups is not None)
    if p.virtual_pipeline and p.virtual_pipeline > 1:
        assert ns.num_layers_per_virtual_pipeline_stage * p.pipeline * p.virtual_pipeline == m.num_layers
    assert ns.data_path == [f"{spec.data.path}/{spec.data.prefix}"]
    assert ns.recompute_granularity == (None if t.recompute_granularity == "none" else t.recompute_granularity)
    assert (ns.save, ns.load, ns.async_save) == (spec.checkpoint.dir, spec.checkpoint.dir, spec.checkpoint.async_save)
    assert ns.train_iters == t.train_iters and ns.lr_warmup_iters == t.lr_warmup_iters
    assert ns.tokenizer_type == {"gpt2": "GPT2BPETokenizer", "huggingface": "HuggingFaceTokenizer",
                                 "sentencepiece": "GPTSentencePieceTokenizer"}[spec.data.tokenizer.kind]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_are_valid_megatron_commands(name: str, megatron: argparse.ArgumentParser) -> None:
    launch = fixture_launch(name)
    megatron.parse_args([str(w) for w in launch.args])


def _spec(text: str) -> ExperimentSpec:
    return loads_spec(textwrap.dedent(text))


_BASE = """
    name = "t"
    [model]
    num_layers = 4
    hidden_size = 256
    num_attention_heads = 4
    seq_length = 128
    [train]
    global_batch_size = 8
    train_iters = 10
    lr = 1e-3
    [data]
    path = "data/my data"
    prefix = "it's $HOME"
"""


def test_export_needs_the_layout_for_open_degrees() -> None:
    spec = _spec(_BASE)
    with pytest.raises(InputError, match="parallel.tensor, parallel.pipeline, parallel.context are unset"):
        export_args(spec)
    args = export_args(spec, {"tp": 2, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 4, "world_size": 8,
                              "sequence_parallel": True})
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2" and "--sequence-parallel" in args
    ffn = args.index("--ffn-hidden-size")  # mcx's unset ffn is 4 x hidden; with --swiglu Megatron-LM would pick 8/3
    assert args[ffn + 1] == "1024" and "--swiglu" in args
    tok = args.index("--tokenizer-type")  # a BPE from mcx data prepare: its tokenizer.json is in the dataset directory
    assert args[tok:tok + 4] == ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "data/my data"]


_ONE_GPU = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1, "world_size": 1, "sequence_parallel": False}


def test_fused_cross_entropy_exports_where_mcx_runs_it() -> None:
    layout = _ONE_GPU
    for precision, fused in (("bf16", True), ("fp8-hybrid", True), ("fp16", False), ("fp32", False)):
        spec = _spec(_BASE)
        spec = attrs.evolve(spec, train=attrs.evolve(spec.train, precision=precision))
        args = export_args(spec, layout)
        assert ("--cross-entropy-loss-fusion" in args) is fused, precision  # Megatron's fused backward is bf16
        assert "--no-gradient-accumulation-fusion" not in args
    spec = _spec(_BASE)
    assert "--no-rope-fusion" not in export_args(spec, layout)
    off = attrs.evolve(spec, train=attrs.evolve(spec.train, cross_entropy_fusion=False, gradient_accumulation_fusion=False,
                                                rope_fusion=False))
    args = export_args(off, layout)
    assert "--cross-entropy-loss-fusion" not in args and "--no-gradient-accumulation-fusion" in args
    assert "--no-rope-fusion" in args


def test_fp8_attention_is_not_exported(megatron: argparse.ArgumentParser) -> None:
    """Megatron-LM 0.19.2 has no flag for TransformerConfig.fp8_dot_product_attention: the arguments say
    nothing of it (and stay a command Megatron-LM parses); the script's `# mcx:` line carries it, and is
    left out once an edit takes fp8 away."""
    spec, layout = _spec(_BASE), _ONE_GPU
    fp8 = attrs.evolve(spec, train=attrs.evolve(spec.train, precision="fp8-hybrid", fp8_attention=True))
    args = export_args(fp8, layout)
    assert not [a for a in args if "dot-product" in a] and args[args.index("--fp8-format") + 1] == "hybrid"
    megatron.parse_args(args)
    script = export_script(fp8, layout)
    assert "\n# mcx: train.fp8_attention = true\n" in script
    again = import_script(script, name=spec.name).spec.train
    assert again.precision == "fp8-hybrid" and again.fp8_attention is True
    edited = import_script(script.replace(" --fp8-format hybrid", ""), name=spec.name)
    assert edited.spec.train.precision == "bf16" and edited.spec.train.fp8_attention is False
    assert any("`# mcx: train.fp8_attention` line is not applied" in p for p in edited.problems)


def test_export_takes_the_planners_layout() -> None:
    from mcx.plan.planner import make_plan

    spec = load_spec(ROOT / "experiments" / "tiny.toml")
    layout = make_plan(spec, te_available=False).layout
    args = export_args(spec, layout)
    assert args[args.index("--tensor-model-parallel-size") + 1] == str(layout.tp)
    assert args[args.index("--pipeline-model-parallel-size") + 1] == str(layout.pp)
    assert ("--use-distributed-optimizer" in args) == layout.distributed_optimizer
    script = export_script(spec, layout)
    plain = import_script(_without_carried(script), name=spec.name).spec  # the command alone
    assert (plain.parallel.tensor, plain.parallel.pipeline, plain.parallel.context) == (layout.tp, layout.pp, layout.cp)
    assert (plain.model, plain.train) == (spec.model, spec.train)
    assert plain.data.tokenizer.kind == "huggingface"  # the BPE mcx trained, as a tokenizer.json in the dataset
    again = import_script(script, name=spec.name, description=spec.description).spec
    assert again == spec  # with the `# mcx:` lines: the spec itself


def _without_carried(script: str) -> str:
    return "".join(line for line in script.splitlines(keepends=True) if not line.startswith("# mcx:"))


def test_export_script_quotes_every_value(shims: Path, tmp_path: Path) -> None:
    spec = _spec(_BASE + '[parallel]\ntensor = 1\npipeline = 1\ncontext = 1\n[checkpoint]\ndir = "ck pts/it\'s $HOME"\n')
    script = export_script(spec)
    argv = bash_argv(script, shims, tmp_path)
    assert argv[argv.index("--data-path") + 1] == "data/my data/it's $HOME"
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == "ck pts/it's $HOME"
    assert import_script(script, name="t").spec.checkpoint.dir == "ck pts/it's $HOME"


def test_export_rejects_uneven_virtual_pipeline() -> None:
    spec = _spec(_BASE + "[parallel]\ntensor = 1\npipeline = 2\nvirtual_pipeline = 3\ncontext = 1\n")
    with pytest.raises(InputError, match="parallel.virtual_pipeline=3"):
        export_args(spec)


# ---- checkpoints and `# mcx:` lines: spec -> export -> import keeps the run ID

EXPERIMENTS = sorted(p.name for p in (ROOT / "experiments").glob("*.toml"))


def _exported(name: str) -> tuple[ExperimentSpec, str]:
    """A shipped spec and its exported script, with the plan's layout (as `mcx export` does)."""
    from mcx.plan.planner import make_plan

    spec = load_spec(ROOT / "experiments" / name)
    return spec, export_script(spec, make_plan(spec, te_available=None).layout)


def _carried_keys(script: str) -> set[str]:
    keys = {line.split()[2] for line in script.splitlines() if line.startswith("# mcx:")}
    return keys - {"arguments"}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_export_import_keeps_the_config_fingerprint(name: str) -> None:
    from mcx.fingerprint.config import canonical_config

    spec, script = _exported(name)
    again = import_script(script, name="exported")  # the name a file import would give: not hashed
    assert canonical_config(again.spec) == canonical_config(spec)
    assert again.problems == []
    # a launch script is one run: a sweep spec exports as its base point
    assert attrs.evolve(again.spec, name=spec.name, description=spec.description) == attrs.evolve(spec, sweep=None)
    assert loads_spec(to_toml(again, "exported.sh")) == again.spec
    # The `# mcx:` lines name exactly the keys the command alone would bring back otherwise.
    plain = flatten(import_script(_without_carried(script), name=spec.name, description=spec.description).spec)
    assert _carried_keys(script) == {k for k, v in flatten(attrs.evolve(spec, sweep=None)).items() if plain[k] != v}


def test_export_import_keeps_the_run_id() -> None:
    from mcx.fingerprint.record import collect, run_id

    spec, script = _exported("tiny.toml")
    assert {"parallel.tensor", "data.tokenizer.kind", "smoke.hidden_size"} <= _carried_keys(script)

    def rid(s: ExperimentSpec) -> str:
        return run_id(collect(s, ROOT, probe_hardware=False, require_data=False))

    assert rid(import_script(script, name="tiny-exported").spec) == rid(spec)
    assert rid(import_script(_without_carried(script), name="tiny").spec) != rid(spec)  # the lines are needed


def test_export_always_checkpoints(megatron: argparse.ArgumentParser, shims: Path, tmp_path: Path) -> None:
    """An unset checkpoint.dir (mcx's run directory) exports as checkpoints/<name>; the script takes
    $CHECKPOINT_DIR instead when set; checkpoint.interval 0 (only the final save) as train_iters."""
    spec = _spec(_BASE + "[checkpoint]\nasync_save = true\n")
    args = export_args(spec, _ONE_GPU)
    ns = megatron.parse_args(args)
    assert (ns.save, ns.load, ns.save_interval) == ("checkpoints/t", "checkpoints/t", 10)
    assert ns.async_save and ns.use_persistent_ckpt_worker
    script = export_script(spec, _ONE_GPU)
    argv = bash_argv(script, shims, tmp_path)
    assert argv[argv.index("--save") + 1] == "checkpoints/t" and argv[argv.index("--save-interval") + 1] == "10"
    argv = bash_argv(script, shims, tmp_path, env={"CHECKPOINT_DIR": "/fast/ckpt"})
    assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1] == "/fast/ckpt"
    assert import_script(script, name="t").spec.checkpoint == spec.checkpoint  # dir unset again: `# mcx:` line
    moved = import_script(script, name="t", env={"CHECKPOINT_DIR": "/fast/ckpt"})  # another command: its --save wins
    assert moved.spec.checkpoint.dir == "/fast/ckpt"
    every = attrs.evolve(spec, checkpoint=attrs.evolve(spec.checkpoint, interval=4, async_save=False))
    args = export_args(every, _ONE_GPU)
    assert args[args.index("--save-interval") + 1] == "4" and "--async-save" not in args


def test_an_edited_argument_wins_over_its_mcx_line() -> None:
    """Once the command differs from the exported one, lines for keys the command sets are left out
    (and named); mcx-only lines (smoke.*, hardware.gpu) still apply."""
    spec, script = _exported("tiny.toml")
    assert "# mcx: parallel.tensor = null\n" in script and '# mcx: data.tokenizer.kind = "bpe"\n' in script
    edited = (script.replace("GPUS_PER_NODE=1", "GPUS_PER_NODE=2")
              .replace("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2")
              .replace("--tokenizer-model data/quickstart", "--tokenizer-model /models/llama3"))
    r = import_script(edited, name="tiny")
    assert (r.spec.parallel.tensor, r.spec.hardware.gpus_per_node) == (2, 2)
    tok = r.spec.data.tokenizer
    assert (tok.kind, tok.path) == ("huggingface", "/models/llama3/tokenizer.json")
    assert (r.spec.smoke, r.spec.hardware.gpu, r.spec.budget) == (spec.smoke, spec.hardware.gpu, spec.budget)
    note = next(p for p in r.problems if "not the one `mcx export` wrote" in p)
    assert "parallel.tensor" in note and "data.tokenizer.kind" in note and "smoke." not in note
    preset_spec, preset_script = _exported("h200_1gpu.toml")  # the preset's name goes with the model arguments
    assert '# mcx: model.preset = "llama3-8b"\n' in preset_script
    deeper = import_script(preset_script.replace("--num-layers 8", "--num-layers 16"), name="h200")
    assert (deeper.spec.model.num_layers, deeper.spec.model.preset, deeper.spec.hardware.gpu) == (16, None, "H200")


def test_mcx_lines_that_make_no_sense_are_reported() -> None:
    spec, script = _exported("tiny.toml")
    bad = script.replace("# mcx: arguments", "# mcx: smoke.hiden_size = 3\n# mcx: smoke.lr = 1e-\n# mcx: arguments")
    r = import_script(bad, name="tiny")
    assert r.spec == attrs.evolve(spec, description=r.spec.description)
    assert any("`# mcx: smoke.hiden_size` names no spec key" in p for p in r.problems)
    assert any("`# mcx: smoke.lr` holds no JSON value" in p for p in r.problems)


# ---- argument forms the fixtures do not cover


def test_expandable_segments_travels_as_the_allocator_variable() -> None:
    """train.expandable_segments is PYTORCH_CUDA_ALLOC_CONF in a Megatron-LM script: exported as an
    export line, imported from the variable where the script launches (prefix assignments too)."""
    spec, layout = _spec(_BASE), _ONE_GPU
    on = attrs.evolve(spec, train=attrs.evolve(spec.train, expandable_segments=True))
    script = export_script(on, layout)
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in script
    assert "PYTORCH_CUDA_ALLOC_CONF" not in export_script(spec, layout)
    assert import_script(script, name=spec.name).spec.train == on.train
    assert import_script(export_script(spec, layout), name=spec.name).spec.train.expandable_segments is False
    prefixed = _mini("", launcher="PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64,expandable_segments:True torchrun")
    assert prefixed.spec.train.expandable_segments is True
    assert any("max_split_size_mb:64, which no spec key carries" in p for p in prefixed.problems)
    off = _mini("", pre="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    assert off.spec.train.expandable_segments is False and not any("ALLOC" in p for p in off.problems)
    unknown = _mini("", pre='export PYTORCH_CUDA_ALLOC_CONF="$ALLOC"')
    assert unknown.spec.train.expandable_segments is False
    assert any("PYTORCH_CUDA_ALLOC_CONF is not known before run time" in p for p in unknown.problems)


def _mini_text(args: str, launcher: str = "torchrun --nproc_per_node 8", pre: str = "") -> str:
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
            "--micro-batch-size 1 --train-iters 10 --lr 1e-3 --data-path data/c_text_document "
            "--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt ")
    return f"{pre}\n{launcher} pretrain_gpt.py {base}{args}\n"


def _mini(args: str, launcher: str = "torchrun --nproc_per_node 8", pre: str = "",
          overrides: list[str] = ()) -> ImportResult:
    return import_script(_mini_text(args, launcher, pre), name="mini", overrides=overrides)


def test_argument_forms() -> None:
    r = _mini("--lr=3e-4 --seed 1 --seed 2 --use-rotary-position-embeddings --recompute-activations "
              "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2")
    t = r.spec.train
    assert (t.lr, t.seed, t.recompute_granularity) == (3e-4, 2, "selective")
    assert r.spec.model.position_embedding_type == "rope" and r.spec.parallel.virtual_pipeline == 2
    assert r.spec.train.global_batch_size == 4  # micro-batch 1 x data-parallel 8 / pipeline 2, as Megatron-LM
    assert r.spec.model.rotary_base == 10000 and r.spec.hardware.gpus_per_node == 8
    assert _mini("--split 98,2").spec.data.split == "98,2,0"  # Megatron-LM reads missing weights as 0


def test_full_iteration_cuda_graphs_carry_over_and_per_layer_ones_do_not() -> None:
    """train.cuda_graphs is Megatron-LM's --cuda-graph-impl full_iteration (D75), both ways; per-layer graphs
    import as false, said so, and are not problems (they do not change the math)."""
    for args in ("--cuda-graph-impl full_iteration", "--cuda-graph-scope full_iteration"):
        r = _mini(f"{args} --eval-interval 5", launcher="torchrun --nproc_per_node 1")
        assert r.spec.train.cuda_graphs is True and not r.problems, (args, r.problems)
    local = _mini("--cuda-graph-impl local --eval-interval 5", launcher="torchrun --nproc_per_node 1")
    said = [m for m in local.mapped if m.key == "train.cuda_graphs"]
    assert local.spec.train.cuda_graphs is False and "per layer" in said[0].origin and not local.problems
    assert _mini("", launcher="torchrun --nproc_per_node 1").spec.train.cuda_graphs is False
    args = export_args(attrs.evolve(local.spec, train=attrs.evolve(local.spec.train, cuda_graphs=True)))
    i = args.index("--cuda-graph-impl")
    assert args[i + 1] == "full_iteration" and "--no-check-for-nan-in-loss-and-grad" in args
    assert "--cuda-graph-impl" not in export_args(local.spec)


def test_what_cannot_be_carried_over_is_reported() -> None:
    r = _mini("--num-query-groups 2 --lr-warmup-fraction 0.33 --optimizer sgd --apply-residual-connection-post-layernorm --fp16 "
              "--fp8-format hybrid --data-path 0.7 a/x 0.3 b/y --position-embedding-type yarn",
              launcher="torchrun --nproc_per_node gpu")
    text = "\n".join(r.problems)
    assert "--num-query-groups 2 without --group-query-attention is ignored" in text
    assert "3.3 warmup steps, not whole; train.lr_warmup_iters = 3" in text
    assert "mcx's fp8 precisions keep bf16 parameters" in text
    assert "--data-path" not in text  # a weighted blend is a mixture (D60; tests/test_mixture.py)
    assert "--position-embedding-type yarn: mcx supports" in text
    assert "torchrun --nproc-per-node gpu is not a fixed positive count" in text
    reasons = dict(r.unsupported)
    assert reasons["--optimizer"] == "sgd: mcx trains with Adam (decoupled weight decay) only"
    assert reasons["--apply-residual-connection-post-layernorm"].startswith("not in mcx's flag table")
    assert (r.spec.model.num_query_groups, r.spec.data.path, r.spec.train.precision) == (None, None, "fp8-hybrid")
    assert {name: (p.path, p.weight) for name, p in r.spec.data.mix.items()} == {"x": ("a", 0.7), "y": ("b", 0.3)}


def test_not_a_gpt_launch() -> None:
    with pytest.raises(InputError, match="no pretrain_gpt.py launch found"):
        import_script("echo training\npython train.py --lr 1\n", name="x")
    with pytest.raises(InputError, match="launches pretrain_bert.py"):
        import_script("torchrun pretrain_bert.py --lr 1\n", name="x")


def test_import_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        import_file(tmp_path / "nope.sh")
    with pytest.raises(InputError, match="cannot read"):
        import_file(tmp_path)
    (tmp_path / "bin.sh").write_bytes(b"\xff\xfe\x00torchrun")
    with pytest.raises(InputError, match="UTF-8"):
        import_file(tmp_path / "bin.sh")


def test_toml_header_lists_what_did_not_map() -> None:
    r = imported("train_gpt3_1.3b.sh")
    text = to_toml(r, "train_gpt3_1.3b.sh")
    assert "#   --rampup-batch-size: mcx trains with a constant train.global_batch_size" in text
    assert loads_spec(text) == r.spec


# ---- what Megatron-LM accepts, mcx plans: the property, --set, unknown arguments, notes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Arguments any command may add: optimizer and shape values, and flags mcx lists without a spec key.
_EXTRAS = [("--no-gradient-accumulation-fusion",), ("--no-rope-fusion",), ("--rotary-base", 500000),
           ("--rotary-percent", 0.5), ("--make-vocab-size-divisible-by", 64), ("--init-method-std", 0.01),
           ("--weight-decay", 0.1), ("--clip-grad", 0.5), ("--adam-beta1", 0.8), ("--adam-beta2", 0.95),
           ("--adam-eps", 1e-5), ("--seed", 7), ("--split", "98,2,0"), ("--norm-epsilon", 1e-6),
           ("--use-mcore-models",), ("--use-flash-attn",), ("--log-throughput",), ("--tensorboard-dir", "/tb"),
           ("--no-masked-softmax-fusion",), ("--attention-softmax-in-fp32",), ("--add-qkv-bias",),
           ("--distributed-timeout-minutes", 30), ("--num-workers", 4), ("--manual-gc",), ("--log-interval", 10),
           ("--eval-interval", 50, "--eval-iters", 5), ("--grad-reduce-in-bf16",)]


@st.composite
def megatron_commands(draw: st.DrawFn) -> tuple[str, int, int, list[str]]:
    """(launcher, GPUs per node, nodes, pretrain_gpt.py arguments) that Megatron-LM 0.19.2 accepts.

    Valid as Megatron-LM's parser, validate_args and Megatron-Core's model building are: heads and
    query groups divisible by TP, layers by PP (and the virtual stages), experts by EP, EP within
    DP x CP, sequence parallel with an MoE model at TP > 1, the sequence split over 2 x CP, whole
    micro-batch counts (a multiple of PP when interleaved), --overlap-param-gather only with the
    distributed optimizer and --overlap-grad-reduce, iteration- or sample-based schedules unmixed,
    warmup below the decay, full recomputation with its method and layer count, no fused MLP with
    experts, no fused cross entropy in deterministic mode. The local layers get none of sequence
    parallel at TP > 1, context parallel or fp8: mcx's local spec implements none of them (a
    planning error that no import default causes).
    """
    pick = lambda xs: draw(st.sampled_from(list(xs)))  # noqa: E731
    maybe = lambda: draw(st.booleans())  # noqa: E731
    a: list[str] = []
    add = lambda *words: a.extend(str(w) for w in words)  # noqa: E731
    gpus, nodes = pick([1, 2, 4, 8]), pick([1, 2])
    world = gpus * nodes
    tp = pick(d for d in (1, 2, 4, 8) if d <= gpus)
    pp = pick(d for d in (1, 2, 4) if world % (tp * d) == 0)
    cp = pick(d for d in (1, 2) if world % (tp * pp * d) == 0)
    dp = world // (tp * pp * cp)
    gqa = maybe()
    groups = tp * pick([1, 2])
    heads = groups * pick([1, 2, 4]) if gqa else groups
    hidden = heads * pick([32, 64])
    stage_layers = pick([1, 2, 4])
    seq = pick([128, 256, 1024])
    add("--num-layers", pp * stage_layers, "--hidden-size", hidden, "--num-attention-heads", heads,
        "--seq-length", seq, "--max-position-embeddings", seq * pick([1, 2]))
    if gqa:
        add("--group-query-attention", "--num-query-groups", groups)
    if maybe():
        add("--normalization", pick(["RMSNorm", "LayerNorm"]))
    for switch in ("--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear"):
        if maybe():
            add(switch)
    pos = pick([None, "rope", "learned_absolute", "none", "--use-rotary-position-embeddings"])
    if pos:
        add(pos) if pos.startswith("--") else add("--position-embedding-type", pos)
    if maybe():
        add("--ffn-hidden-size", hidden * pick([2, 3]))
    if maybe():
        add("--hidden-dropout", pick([0.0, 0.1]), "--attention-dropout", pick([0.0, 0.1]))
    experts = pick([None, 4, 8])
    if experts:
        add("--num-experts", experts, "--moe-router-topk", pick([1, 2]))
        ep = pick(d for d in (1, 2, 4, 8) if experts % d == 0 and (dp * cp) % d == 0)
        if ep > 1 or maybe():
            add("--expert-model-parallel-size", ep)
        if maybe():
            add("--moe-grouped-gemm", "--moe-token-dispatcher-type", pick(["alltoall", "allgather"]))
        if maybe():
            add("--moe-router-load-balancing-type", pick(["aux_loss", "none"]), "--moe-aux-loss-coeff", 0.01)
    for flag, degree in (("--tensor-model-parallel-size", tp), ("--pipeline-model-parallel-size", pp),
                         ("--context-parallel-size", cp)):
        if degree > 1 or maybe():
            add(flag, degree)
    sp = maybe() or bool(experts and tp > 1)
    if sp:
        add("--sequence-parallel")
    precision = pick(["bf16", "fp16", "fp32", "fp8"])
    fp8 = ["--bf16", "--fp8-format", pick(["hybrid", "e4m3"])]
    add(*{"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [], "fp8": fp8}[precision])
    if precision == "fp8" and maybe():
        add("--fp8-recipe", pick(["delayed", "tensorwise"]), "--fp8-amax-history-len", 16)
    impl = pick([None, "transformer_engine", "local"])
    if not (impl == "local" and ((sp and tp > 1) or cp > 1 or precision == "fp8")) and impl:
        add("--transformer-impl", impl)
    if experts is None and maybe():
        add("--use-transformer-engine-op-fuser")
    vpp = 1
    if pp > 1 and maybe():
        per_virtual = pick(_divisors(stage_layers))
        vpp = stage_layers // per_virtual
        add(*(("--num-layers-per-virtual-pipeline-stage", per_virtual) if maybe()
              else ("--num-virtual-stages-per-pipeline-rank", vpp)))
    dist, overlap_grads = maybe(), maybe()
    add(*["--use-distributed-optimizer"] * dist, *["--overlap-grad-reduce"] * overlap_grads)
    if dist and overlap_grads and maybe():
        add("--overlap-param-gather")
    mbs, micro = pick([1, 2]), pick([1, 2, 4]) * (pp if vpp > 1 else 1)
    gbs = mbs * dp * micro
    add("--micro-batch-size", mbs)
    if micro > 1 or maybe():
        add("--global-batch-size", gbs)
    iters = pick([100, 1000])
    if maybe():
        add("--train-iters", iters, *(["--lr-decay-iters", iters] if maybe() else []))
        add(*pick([[], ["--lr-warmup-iters", iters // 10], ["--lr-warmup-fraction", 0.01]]))
    else:
        add("--train-samples", iters * gbs, *(["--lr-warmup-samples", iters * gbs // 10] if maybe() else []))
    add("--lr", 3e-4, *(["--min-lr", 3e-5] if maybe() else []))
    add(*pick([[], ["--recompute-activations"], ["--recompute-granularity", "selective"],
               ["--recompute-granularity", "full", "--recompute-method", pick(["uniform", "block"]),
                "--recompute-num-layers", pick(range(1, stage_layers + 1))]]))
    if maybe():
        add("--deterministic-mode")
    elif maybe():
        add("--cross-entropy-loss-fusion")
    add("--data-path", "/data/corpus_text_document")
    add(*pick([["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/t/vocab.json", "--merge-file", "/t/merges.txt"],
               ["--tokenizer-type", pick(["HuggingFaceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"]),
                "--tokenizer-model", "/t/tokenizer"]]))
    if maybe():
        add("--save", "/ckpt", "--load", "/ckpt", "--save-interval", pick([50, 5000]))
        if maybe():
            add("--async-save", "--use-persistent-ckpt-worker")
    for words in draw(st.lists(st.sampled_from(_EXTRAS), max_size=4, unique=True)):
        add(*words)
    return pick(["torchrun", "slurm", *(["python"] if world == 1 else [])]), gpus, nodes, a


def _launch_script(launcher: str, gpus: int, nodes: int, args: list[str]) -> str:
    line = f"pretrain_gpt.py {' '.join(args)}\n"
    return {"python": f"python {line}",
            "torchrun": f"torchrun --nproc_per_node {gpus} --nnodes {nodes} {line}",
            "slurm": f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --gpus-per-node={gpus}\n"
                     f"srun torchrun --nproc_per_node {gpus} --nnodes $SLURM_NNODES {line}"}[launcher]


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(command=megatron_commands())
def test_what_megatron_accepts_imports_as_a_spec_mcx_plans(command, megatron: argparse.ArgumentParser) -> None:
    """Every default the import leaves to mcx agrees with what it wrote: mcx's own rules never refuse it."""
    from mcx.plan.params import effective_vocab_size
    from mcx.plan.planner import make_plan

    launcher, gpus, nodes, args = command
    megatron.parse_args(args)  # the generator stays within Megatron-LM's parser
    r = import_script(_launch_script(launcher, gpus, nodes, args), name="generated")
    vocab = None
    if effective_vocab_size(r.spec) is None:  # the tokenizer file's size: mcx plan needs it, and the import says so
        assert any("--set model.vocab_size=N" in n for n in r.notes)
        vocab = 32000
    make_plan(r.spec, te_available=None, vocab_size=vocab)


def _llama70b(extra: str = "") -> str:
    return textwrap.dedent(f"""\
        torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \\
            --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \\
            --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 \\
            --normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights \\
            --disable-bias-linear --hidden-dropout 0.0 --attention-dropout 0.0 --vocab-size 128256 \\
            --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel \\
            --transformer-impl transformer_engine --micro-batch-size 1 --global-batch-size 64 \\
            --train-iters 1000 --lr 1.5e-4 --bf16 --data-path /data/dclm_text_document \\
            --tokenizer-type HuggingFaceTokenizer --tokenizer-model /t/llama3 {extra}
        """)


def test_llama_70b_without_the_distributed_optimizer_plans() -> None:
    from mcx.plan.planner import make_plan

    r = import_script(_llama70b(), name="llama70b")
    p = r.spec.parallel
    assert (p.distributed_optimizer, p.overlap_grad_reduce, p.overlap_param_gather) == (False, False, False)
    gather = [m for m in r.mapped if m.key == "parallel.overlap_param_gather"]
    assert [(m.flag, m.origin) for m in gather] == [("--overlap-param-gather", "Megatron-LM default")]
    assert make_plan(r.spec, te_available=None).layout.distributed_optimizer is False


def test_what_megatron_overrides_is_written_as_it_trains() -> None:
    r = _mini("--sequence-parallel --transformer-impl local --use-transformer-engine-op-fuser")
    assert (r.spec.parallel.sequence_parallel, r.spec.train.te_op_fuser) == (False, False)
    assert r.notes == [
        "--sequence-parallel has no effect here: validate_args turns sequence parallelism off at "
        "--tensor-model-parallel-size 1; parallel.sequence_parallel = false",
        "--use-transformer-engine-op-fuser has no effect here: Megatron-LM builds the local layers without it "
        "(it applies to Transformer Engine layers only); train.te_op_fuser = false"]
    kept = import_script(_mini_text("--sequence-parallel"), name="mini", overrides=["parallel.sequence_parallel=true"])
    assert kept.spec.parallel.sequence_parallel is True and kept.notes == []  # a --set is the user's word
    alone = _mini("--save /ckpt --load /ckpt --save-interval 10 --async-save")
    assert alone.spec.checkpoint.async_save is False and any("--use-persistent-ckpt-worker" in n for n in alone.notes)
    both = _mini("--save /ckpt --load /ckpt --save-interval 10 --async-save --use-persistent-ckpt-worker")
    assert both.spec.checkpoint.async_save is True and not any("--async-save" in n for n in both.notes)


_MIXTRAL = """\
#!/bin/bash
# Mixtral 8x7B-shaped: TP 2, EP 4, 8 experts, top-2, aux loss; no --lr, no --train-iters.
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 \\
    --normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 1000000 \\
    --untie-embeddings-and-output-weights --disable-bias-linear --hidden-dropout 0.0 --attention-dropout 0.0 \\
    --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 \\
    --tensor-model-parallel-size 2 --expert-model-parallel-size 4 --sequence-parallel \\
    --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 256 --bf16 \\
    --data-path /data/slimpajama_text_document --tokenizer-type Llama2Tokenizer --tokenizer-model /t/tokenizer.model \\
    --eval-interval 1000 --eval-iters 10
"""
MISSING_LR_AND_ITERS = (
    "mixtral does not give --train-iters (or --train-samples) and --lr, which Megatron-LM and mcx both need; "
    "add --set train.train_iters=VALUE --set train.lr=VALUE to the mcx import command.")


def test_set_fills_what_the_script_lacks() -> None:
    from mcx.plan.planner import make_plan

    with pytest.raises(InputError) as err:
        import_script(_MIXTRAL, name="mixtral")
    assert str(err.value) == MISSING_LR_AND_ITERS and not isinstance(err.value, SpecError)
    sets = ["train.lr=1e-4", "train.train_iters=1000", "model.vocab_size=32000"]
    r = import_script(_MIXTRAL, name="mixtral", overrides=sets)
    assert (r.spec.train.lr, r.spec.train.train_iters, r.spec.model.vocab_size) == (1e-4, 1000, 32000)
    assert [(m.key, m.value) for m in r.mapped if m.origin == "--set"] == [
        ("train.lr", 1e-4), ("train.train_iters", 1000), ("model.vocab_size", 32000)]
    assert all(m.flag == "--set" for m in r.mapped if m.origin == "--set")
    assert (r.spec.parallel.expert, r.spec.model.num_experts, r.problems, r.notes) == (4, 8, [], [])
    assert make_plan(r.spec, te_available=None).layout.ep == 4
    assert "lr = 0.0001" in to_toml(r, "mixtral.sh") and loads_spec(to_toml(r, "mixtral.sh")) == r.spec


def test_set_wins_over_the_script_and_is_typed_as_plan_set() -> None:
    r = _mini("--hidden-dropout 0.0", overrides=["train.lr=3e-4", "model.hidden_dropout=0.05", "hardware.nodes=2"])
    assert (r.spec.train.lr, r.spec.model.hidden_dropout, r.spec.hardware.nodes) == (3e-4, 0.05, 2)
    assert "--set train.lr=0.0003 replaces the script's --lr (0.001)" in r.notes
    assert "--set model.hidden_dropout=0.05 replaces the script's --hidden-dropout (0.0)" in r.notes
    assert r.spec.train.global_batch_size == 16  # derived from the --set world: 2 nodes x 8 GPUs
    with pytest.raises(SpecError, match='train.lr: expected a number, got str "fast"'):
        _mini("", overrides=["train.lr=fast"])
    with pytest.raises(SpecError, match="train.lrr: unknown key; did you mean 'train.lr'?"):
        _mini("", overrides=["train.lrr=1"])
    with pytest.raises(SpecError, match="is not KEY=VALUE; write e.g. --set train.lr=3e-4"):
        _mini("", overrides=["train.lr"])
    preset = import_script(_mini_text("").replace("--num-layers 4 --hidden-size 256 --num-attention-heads 4 ", ""),
                           name="p", overrides=["model.preset=llama3-8b"])
    assert preset.spec.model.preset == "llama3-8b" and preset.spec.model.num_layers == 32


def test_every_missing_value_is_named_at_once() -> None:
    text = ("torchrun --nproc_per_node 3 pretrain_gpt.py --num-layers 4 --tensor-model-parallel-size 2 "
            "--micro-batch-size 1 --lr abc\n")
    with pytest.raises(InputError) as err:
        import_script(text, name="bare")
    assert str(err.value) == (
        "bare does not give --hidden-size, --num-attention-heads, --seq-length, --global-batch-size (its value "
        "cannot be read: the GPUs do not divide into data-parallel replicas to derive it from), --train-iters "
        "(or --train-samples), --lr (its value cannot be read: 'abc' is not a number) and --data-path, which "
        "Megatron-LM and mcx both need; add --set model.hidden_size=VALUE --set model.num_attention_heads=VALUE "
        "--set model.seq_length=VALUE --set train.global_batch_size=VALUE --set train.train_iters=VALUE "
        "--set train.lr=VALUE --set data.path=DIR --set data.prefix=PREFIX to the mcx import command.")


BOGUS = ("line 2 of bogus passes --bogus-flag (no argument is close), which Megatron-LM's pretrain_gpt.py does not "
         "know, so it would refuse the command; correct or remove it in the script, then import again.")


def test_an_argument_megatron_does_not_know_is_refused(megatron: argparse.ArgumentParser) -> None:
    from mcx.interop.options import unknown_options

    with pytest.raises(InputError) as err:
        import_script(_mini_text("--bogus-flag 3"), name="bogus")
    assert str(err.value) == BOGUS
    with pytest.raises(InputError) as err:
        import_script(_mini_text("--num-layer 3 --seqlen=5 --use-flash-attn -x --lr -1e-3"), name="typos")
    assert str(err.value) == (
        "line 2 of typos passes --num-layer (did you mean --num-layers, --mtp-num-layers or --num-classes?), "
        "--seqlen (did you mean --seq-length, --seed or --mscale?), -x (no argument is close) and -1e-3 (argparse "
        "reads it as an option, not a value: write --lr=-1e-3), which Megatron-LM's pretrain_gpt.py does not know, "
        "so it would refuse the command; correct or remove them in the script, then import again.")
    for args in (["--bogus-flag", "3"], ["--seqlen=5"], ["-x"], ["--lr", "-1e-3"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            megatron.parse_args(args)  # Megatron-LM refuses each of them too
    megatron.parse_args(["--lr", "-1", "--min-lr=-.5", "--data-path", "-"])  # negative numbers and - are values
    assert unknown_options(["--lr", "-1", "--min-lr=-.5", "--data-path", "-"]) == {}
    ok = _mini("--use-flash-attn --tensorboard-dir /tb --rampup-batch-size 8 8 100 "
               "--apply-residual-connection-post-layernorm")
    assert dict(ok.unsupported)["--rampup-batch-size"] == DROPPED["--rampup-batch-size"]
    assert dict(ok.unsupported)["--use-flash-attn"] == HANDLED["--use-flash-attn"]
    assert dict(ok.unsupported)["--apply-residual-connection-post-layernorm"].startswith("not in mcx's flag table")


def test_the_option_list_is_megatrons_parser(megatron: argparse.ArgumentParser) -> None:
    from mcx.interop.options import megatron_options, parser_options, render

    assert megatron_options() == set(megatron._option_string_actions)
    assert render(parser_options()) == (ROOT / "mcx" / "interop" / "megatron_options.json").read_text(), \
        "mcx/interop/megatron_options.json is out of date: run python -m mcx.interop.options"


_LLAMA_BY_NAME = """\
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 \\
    --group-query-attention --num-query-groups 2 --seq-length 128 --max-position-embeddings 128 --swiglu \\
    --micro-batch-size 1 --train-iters 10 --lr 1e-3 --data-path data/c_text_document --vocab-size 32000 \\
    --tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt {extra}
"""


def test_notes_name_the_megatron_defaults_a_llama_script_relies_on() -> None:
    r = import_script(_LLAMA_BY_NAME.format(extra=""), name="train_llama2_7b")
    m = r.spec.model
    assert (m.normalization, m.swiglu, m.position_embedding_type, m.add_bias_linear) == (
        "LayerNorm", True, "learned_absolute", True)  # the spec is what the script trains
    assert r.notes == [
        "the script is named like a LLaMA model (train_llama2_7b) but leaves 6 arguments to Megatron-LM's defaults, "
        "so it trains with LayerNorm, learned absolute position embeddings, biases in every linear layer, hidden "
        "dropout 0.1, attention dropout 0.1 and the output layer tied to the input embedding; a LLaMA model passes "
        "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear --hidden-dropout 0.0 "
        "--attention-dropout 0.0 --untie-embeddings-and-output-weights"]
    toml_text, report = to_toml(r, "train_llama2_7b.sh"), summary(r)
    assert f"# Notes:\n#   {r.notes[0]}\n" in toml_text and f"1 note:\n  {r.notes[0]}" in report
    assert loads_spec(toml_text) == r.spec
    shaped = import_script(_LLAMA_BY_NAME.format(extra="--position-embedding-type rope --normalization LayerNorm"),
                           name="run7")  # no name to go by: grouped-query attention, RoPE and SwiGLU
    assert len(shaped.notes) == 1 and shaped.notes[0].startswith(
        "the script is shaped like a LLaMA model (grouped-query attention, RoPE and SwiGLU) but leaves 4 arguments")
    assert "LayerNorm" not in shaped.notes[0]  # --normalization LayerNorm is the script's own choice
    full = ("--normalization RMSNorm --position-embedding-type rope --disable-bias-linear --hidden-dropout 0.0 "
            "--attention-dropout 0.0 --untie-embeddings-and-output-weights")
    assert import_script(_LLAMA_BY_NAME.format(extra=full), name="llama").notes == []
    assert _mini("").notes == []  # GPT-2/3 style: Megatron-LM's defaults are what it means
    for name in FIXTURES:
        assert not [n for n in imported(name).notes if "LLaMA" in n], name


# ---- docs


def test_docs_spec_is_generated_from_the_table() -> None:
    text = DOC.read_text()
    assert update(text) == text, "docs/spec.md is out of date: run python -m mcx.interop.docgen"
    for key in spec_keys():
        assert f"| `{key}` |" in text, key


def test_migration_guide_shows_what_the_commands_print() -> None:
    from mcx.interop import args_text, summary

    text = (ROOT / "docs" / "migration.md").read_text()
    for name in ("train_llama3_70b_3d.sh", "train_mixtral_8x7b_ep.sh"):
        toml_text, result = import_file(SCRIPTS / name)
        for shown in ((SCRIPTS / name).read_text(), toml_text, summary(result), args_text(result.spec)):
            assert shown.rstrip() in text, f"docs/migration.md is out of date for {name}"
    from mcx.ops.interop import export_spec

    section = text.split("## Exporting an mcx spec", 1)[1].split("\n## ", 1)[0]
    script = export_spec(str(ROOT / "experiments" / "tiny.toml"), [])
    blocks = [b.split("\n", 1)[1] for b in section.split("```")[1::2] if b.startswith("bash\n")]
    assert len(blocks) == 3 and all(b in script for b in blocks), "docs/migration.md is out of date for tiny.toml"
    assert "--save checkpoints/tiny --load checkpoints/tiny" in section
    assert "--save checkpoints/tiny --load checkpoints/tiny" in export_spec(str(ROOT / "experiments" / "tiny.toml"), [],
                                                                             script=False)


def test_migration_guide_shows_the_errors_and_notes() -> None:
    text = (ROOT / "docs" / "migration.md").read_text()
    with pytest.raises(InputError) as err:
        import_file(SCRIPTS / "train_gpt3_1.3b.sh")
    assert f"mcx: error: {err.value}\n" in text
    sets = ["data.path=/data/gpt3", "data.prefix=pile_text_document"]
    assert import_file(SCRIPTS / "train_gpt3_1.3b.sh", overrides=sets)[1].spec.data.path == "/data/gpt3"
    mixtral = (SCRIPTS / "train_mixtral_8x7b_ep.sh").read_text()
    bogus = mixtral.replace("MOE_ARGS=(\n", "MOE_ARGS=(\n    --bogus-flag 3\n    --moe-router-top-k 2\n", 1)
    with pytest.raises(InputError) as err:
        import_script(bogus, name="train_mixtral_8x7b_ep", source="train_mixtral_8x7b_ep.sh")
    assert f"mcx: error: {err.value}\n" in text
    llama = (SCRIPTS / "train_llama3_70b_3d.sh").read_text()
    for line in ("--normalization RMSNorm", "--disable-bias-linear", "--attention-dropout 0.0", "--hidden-dropout 0.0"):
        llama = llama.replace(f"    {line}\n", "", 1)
    notes = import_script(llama, name="train_llama3_70b_3d").notes
    assert len(notes) == 1 and f"1 note:\n  {notes[0]}\n" in text


def test_interop_stays_off_torch_and_megatron() -> None:
    code = ("import sys, mcx.interop, mcx.interop.docgen; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'mlflow', 'dvc')]; "
            "assert not bad, bad")
    subprocess.run([os.sys.executable, "-c", code], check=True, cwd=ROOT)
