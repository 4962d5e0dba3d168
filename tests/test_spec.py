"""The spec loader: extends, --set, presets, strict types, unknown keys, all problems at once, round trips.

Every test goes through the public entry points (``load_spec``, ``loads_spec``, ``dump_spec``) on real
TOML files, and asserts the TOML path and the fix each problem names.
"""

from __future__ import annotations

import copy
import math
import tomllib
import typing
from pathlib import Path

import attrs
import pytest
import tomli_w

from mcx.errors import InputError, McxError, SpecError
from mcx.spec import ExperimentSpec, dump_spec, load_spec, loads_spec, spec_to_dict
from mcx.spec.load import resolve_dict
from mcx.spec.presets import PRESETS
from mcx.spec.schema import (
    DataSpec,
    HardwareSpec,
    LaunchSpec,
    ModelSpec,
    SlurmSpec,
    TokenizerSpec,
    TrainSpec,
)

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"
EXPERIMENTS = sorted(EXPERIMENTS_DIR.glob("*.toml"))
TINY = tomllib.loads((EXPERIMENTS_DIR / "tiny.toml").read_text())


def write(path: Path, data: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else tomli_w.dumps(data), encoding="utf-8")
    return path


def tiny(**sections) -> dict:
    """tiny.toml's table with ``sections`` deep-merged in (``None`` deletes a key)."""
    data = copy.deepcopy(TINY)

    def merge(node: dict, over: dict) -> None:
        for key, value in over.items():
            if value is None:
                node.pop(key, None)
            elif isinstance(value, dict) and isinstance(node.get(key), dict):
                merge(node[key], value)
            else:
                node[key] = value

    merge(data, sections)
    return data


def problems(path: Path, overrides: list[str] = ()) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as exc:
        load_spec(path, list(overrides))
    err = exc.value
    assert isinstance(err, InputError) and err.exit_code == 2
    for key, msg in err.problems:  # the message lists every problem with its path
        assert (f"{key}: {msg}" if key else msg) in str(err)
    return err.problems


def one_problem(path: Path, overrides: list[str] = ()) -> tuple[str, str]:
    found = problems(path, overrides)
    assert len(found) == 1, found
    return found[0]


# --- the errors ---------------------------------------------------------------------------------


def test_spec_errors_are_input_errors_with_exit_code_2_and_one_line_per_problem():
    err = SpecError([("train.lr", "expected a number"), ("", "malformed TOML")], "x.toml")
    assert isinstance(err, InputError) and isinstance(err, McxError) and err.exit_code == 2
    assert str(err) == "2 problems in x.toml:\n  train.lr: expected a number\n  malformed TOML"
    assert str(SpecError([("name", "bad")])) == "1 problem:\n  name: bad"


# --- files ----------------------------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path):
    key, msg = one_problem(tmp_path / "nope.toml")
    assert key == "" and "file not found" in msg and str(tmp_path / "nope.toml") in msg and "check the path" in msg


def test_a_directory_or_non_utf8_file_is_not_a_spec(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    assert "IsADirectoryError" in one_problem(tmp_path / "dir.toml")[1]
    (tmp_path / "latin1.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    key, msg = one_problem(tmp_path / "latin1.toml")
    assert "UnicodeDecodeError" in msg and "UTF-8" in msg


def test_malformed_toml_gives_line_and_column(tmp_path):
    path = write(tmp_path / "bad.toml", 'name = "x"\n[model\nnum_layers = 2\n')
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert exc.value.source == str(path)
    key, msg = exc.value.problems[0]
    assert key == "" and "malformed TOML" in msg and "line 2, column 7" in msg and "fix the syntax" in msg
    with pytest.raises(SpecError, match="malformed TOML"):
        loads_spec("lr = = 3")


# --- extends ------------------------------------------------------------------------------------


def test_extends_deep_merges_tables_and_replaces_everything_else(tmp_path):
    write(tmp_path / "parent.toml", tiny(launch={"kind": "slurm", "slurm": {"partition": "gpu", "time": "01:00:00",
                                                                            "extra_sbatch": ["--exclusive", "-C h100"]}}))
    child = write(tmp_path / "child.toml", {
        "extends": "parent.toml", "name": "child",
        "train": {"lr": 1e-3},  # one key of a table: the rest stays the parent's
        "launch": {"slurm": {"time": "02:00:00", "extra_sbatch": ["--comment=x"]}},  # nested table: key by key
    })
    spec = load_spec(child)
    assert spec.name == "child"
    assert spec.train.lr == 1e-3 and spec.train.min_lr == 3e-4 and spec.train.train_iters == 200
    assert spec.launch.kind == "slurm"
    assert (spec.launch.slurm.partition, spec.launch.slurm.time) == ("gpu", "02:00:00")
    assert spec.launch.slurm.extra_sbatch == ("--comment=x",)  # arrays are replaced whole, not appended
    assert "extends" not in resolve_dict(child)
    # extends is not part of the resolved spec: the flat equivalent is the same spec.
    assert load_spec(write(tmp_path / "flat.toml", resolve_dict(child))) == spec


def test_extends_chain_of_three_with_paths_relative_to_each_file(tmp_path, monkeypatch):
    write(tmp_path / "root.toml", tiny(train={"lr": 1e-3, "seed": 1}))
    write(tmp_path / "base" / "mid.toml", {"extends": "../root.toml", "train": {"seed": 2, "train_iters": 300}})
    leaf = write(tmp_path / "exp" / "deep" / "leaf.toml", {"extends": "../../base/mid.toml", "name": "leaf",
                                                           "train": {"seed": 3}})
    monkeypatch.chdir(tmp_path / "base")  # relative to the file that says extends, never to the cwd
    spec = load_spec(leaf)
    assert (spec.name, spec.train.seed, spec.train.train_iters, spec.train.lr) == ("leaf", 3, 300, 1e-3)
    assert spec.model.num_layers == TINY["model"]["num_layers"]


def test_recipes_with_extends_resolve_through_their_chain():
    slurm = load_spec(EXPERIMENTS_DIR / "tiny_slurm.toml")  # -> tiny_ddp.toml -> tiny.toml
    assert slurm.name == "tiny-slurm" and slurm.launch.kind == "slurm" and slurm.hardware.gpus_per_node == 2
    assert slurm.launch.slurm.requeue is False and slurm.model == load_spec(EXPERIMENTS_DIR / "tiny.toml").model


def test_extends_cycle_is_one_error_naming_the_cycle(tmp_path):
    write(tmp_path / "a.toml", {"extends": "b.toml", "name": "a"})
    write(tmp_path / "b.toml", {"extends": "c.toml"})
    write(tmp_path / "c.toml", {"extends": "a.toml"})
    key, msg = one_problem(tmp_path / "a.toml")
    assert key == "extends"
    assert "cycle: a.toml -> b.toml -> c.toml -> a.toml" in msg and "remove one of these extends" in msg
    write(tmp_path / "self.toml", {"extends": "self.toml"})
    assert one_problem(tmp_path / "self.toml") == ("extends", "cycle: self.toml -> self.toml; remove one of these extends")


def test_extends_missing_parent_or_wrong_type(tmp_path):
    key, msg = one_problem(write(tmp_path / "a.toml", {"extends": "base/nope.toml", "name": "a"}))
    assert key == "extends" and "'base/nope.toml' not found" in msg and str(tmp_path / "base" / "nope.toml") in msg
    assert "fix the path" in msg
    assert one_problem(write(tmp_path / "b.toml", {"extends": 3})) == ("extends", "expected a string path to another spec")


def test_a_malformed_parent_is_reported_with_the_parent_file(tmp_path):
    parent = write(tmp_path / "parent.toml", "name = \n")
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path / "child.toml", {"extends": "parent.toml"}))
    assert exc.value.source == str(parent) and "malformed TOML" in str(exc.value)


# --- --set ----------------------------------------------------------------------------------------


def test_set_values_are_toml_values(tmp_path):
    path = write(tmp_path / "s.toml", tiny())
    spec = load_spec(path, ["train.lr=1e-2", "train.train_iters=70", "train.deterministic=false",
                            "parallel.tensor=1", "launch.slurm.extra_sbatch=['--exclusive', '-C h100']",
                            'train.precision="bf16"', "budget.max_gpu_hours=3", "data.tokenizer.vocab_size = 1024 "])
    assert spec.train.lr == 1e-2 and type(spec.train.lr) is float
    assert spec.train.train_iters == 70 and spec.train.deterministic is False and spec.parallel.tensor == 1
    assert spec.launch.slurm.extra_sbatch == ("--exclusive", "-C h100") and spec.train.precision == "bf16"
    assert spec.budget.max_gpu_hours == 3.0 and type(spec.budget.max_gpu_hours) is float  # int where a number goes
    assert spec.data.tokenizer.vocab_size == 1024


def test_set_takes_what_is_not_toml_as_a_bare_string(tmp_path):
    path = write(tmp_path / "s.toml", tiny())
    spec = load_spec(path, ["train.precision=fp16", "launch.slurm.partition=debug", "data.path=datasets/v2 (old)",
                            "name=tiny-2", "description=a = b"])
    assert spec.train.precision == "fp16" and spec.launch.slurm.partition == "debug"
    assert spec.data.path == "datasets/v2 (old)" and spec.name == "tiny-2" and spec.description == "a = b"


def test_set_goes_through_the_same_strict_checks(tmp_path):
    path = write(tmp_path / "s.toml", tiny())
    assert one_problem(path, ["train.lr=fast"]) == ("train.lr", 'expected a number, got str "fast"')
    assert one_problem(path, ['train.lr="3e-4"']) == ("train.lr", 'expected a number, got str "3e-4"')
    assert one_problem(path, ["train.train_iters=2.5"]) == ("train.train_iters", "expected an integer, got float 2.5")
    key, msg = one_problem(path, ["train.learning_rate=1e-4"])
    assert key == "train.learning_rate" and msg.startswith("unknown key")
    # A new table through --set is checked like one in the file.
    assert one_problem(path, ["trainer.lr=1"]) == ("trainer", "unknown key; did you mean 'train'?")


def test_set_order_after_extends_last_one_wins(tmp_path):
    write(tmp_path / "parent.toml", tiny(train={"lr": 1e-3}))
    child = write(tmp_path / "child.toml", {"extends": "parent.toml", "train": {"lr": 2e-3}})
    assert load_spec(child).train.lr == 2e-3
    assert load_spec(child, ["train.lr=4e-3"]).train.lr == 4e-3
    assert load_spec(child, ["train.lr=4e-3", "train.lr=5e-3"]).train.lr == 5e-3


@pytest.mark.parametrize("item,shown", [
    ("train.lr", "'train.lr' is not KEY=VALUE; write e.g. --set train.lr=3e-4"),
    ("=3", "'' is not a dotted key"),
    ("train..lr=3", "'train..lr' is not a dotted key"),
    ("train lr=3", "'train lr' is not a dotted key"),
    (".lr=3", "'.lr' is not a dotted key"),
    ("train.lr;rm=3", "'train.lr;rm' is not a dotted key"),
])
def test_bad_set_syntax_names_set(tmp_path, item, shown):
    key, msg = one_problem(write(tmp_path / "s.toml", tiny()), [item])
    assert key == "--set" and shown in msg


def test_set_inside_a_value_that_is_not_a_table(tmp_path):
    key, msg = one_problem(write(tmp_path / "s.toml", tiny()), ["train.lr.warm=1"])
    assert key == "train.lr.warm" and "'lr' is not a table" in msg


# --- presets --------------------------------------------------------------------------------------


def test_preset_fills_model_keys_and_spec_keys_win(tmp_path):
    path = write(tmp_path / "p.toml", tiny(model={"preset": "llama3-8b", "num_layers": 2, "hidden_size": None,
                                                 "num_attention_heads": None, "num_query_groups": None,
                                                 "ffn_hidden_size": None, "seq_length": None,
                                                 "max_position_embeddings": None, "rotary_base": None}))
    spec = load_spec(path)
    want = PRESETS["llama3-8b"]
    assert spec.model.preset == "llama3-8b" and spec.model.num_layers == 2
    for key in ("hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
                "rotary_base", "seq_length"):
        assert getattr(spec.model, key) == want[key], key
    # --set comes before the preset: a model key set there wins too, and the preset can be switched.
    spec70 = load_spec(path, ["model.preset=llama3-70b", "model.hidden_size=1024"])
    assert spec70.model.num_attention_heads == 64 and spec70.model.hidden_size == 1024 and spec70.model.num_layers == 2


def test_unknown_preset_suggests_the_nearest(tmp_path):
    path = write(tmp_path / "p.toml", tiny(model={"preset": "lama3-8b"}))
    assert one_problem(path) == ("model.preset", "unknown preset 'lama3-8b'; did you mean 'llama3-8b'?")
    key, msg = one_problem(path, ["model.preset=gpt5"])
    assert key == "model.preset" and all(name in msg for name in PRESETS)
    key, msg = one_problem(path, ["model.preset=3"])
    assert key == "model.preset" and "unknown preset 3" in msg


# --- strict types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dotted,value,expected", [
    ("train.lr", "3e-4", 'expected a number, got str "3e-4"'),
    ("train.lr", True, "expected a number, got bool true"),
    ("model.num_layers", 2.5, "expected an integer, got float 2.5"),
    ("model.num_layers", 4.0, "expected an integer, got float 4.0"),
    ("model.num_layers", "4", 'expected an integer, got str "4"'),
    ("model.num_layers", False, "expected an integer, got bool false"),
    ("train.deterministic", 1, "expected true or false, got int 1"),
    ("train.deterministic", "true", 'expected true or false, got str "true"'),
    ("name", 5, "expected a string, got int 5"),
    ("data.path", ["data"], "expected a string, got list ['data']"),
    ("parallel.tensor", 2.0, "expected an integer, got float 2.0"),  # an optional int is as strict
    ("data.tokenizer.vocab_size", "4096", 'expected an integer, got str "4096"'),
    ("launch.slurm.requeue", 0, "expected true or false, got int 0"),
    ("baseline.tolerances.loss", "5%", 'expected a number, got str "5%"'),
])
def test_no_silent_coercion(tmp_path, dotted, value, expected):
    *parents, leaf = dotted.split(".")
    over: dict = {leaf: value}
    for part in reversed(parents):
        over = {part: over}
    assert one_problem(write(tmp_path / "t.toml", tiny(**over))) == (dotted, expected)


def test_integers_are_numbers_and_types_are_exact(tmp_path):
    spec = load_spec(write(tmp_path / "t.toml", tiny(train={"lr": 1, "clip_grad": 0}, baseline={"tolerances": {"loss": 0}})))
    assert spec.train.lr == 1.0 and type(spec.train.lr) is float and type(spec.train.clip_grad) is float
    assert spec.baseline.tolerances == {"loss": 0.0} and type(spec.baseline.tolerances["loss"]) is float


def test_list_items_are_checked_with_their_index(tmp_path):
    found = problems(write(tmp_path / "t.toml", tiny(launch={"slurm": {"extra_sbatch": ["--exclusive", 3, True]}})))
    assert found == [("launch.slurm.extra_sbatch[1]", "expected a string, got int 3"),
                     ("launch.slurm.extra_sbatch[2]", "expected a string, got bool true")]


def test_a_value_where_a_table_belongs_names_the_table(tmp_path):
    for data, key in [(tiny(model=3), "model"), (tiny(data={"tokenizer": "bpe"}), "data.tokenizer"),
                      (tiny(launch={"slurm": ["gpu"]}), "launch.slurm"), (tiny(baseline={"tolerances": [1]}),
                                                                          "baseline.tolerances")]:
        assert one_problem(write(tmp_path / "t.toml", data))[0] == key


def test_a_value_where_a_table_belongs_says_table(tmp_path):
    key, msg = one_problem(write(tmp_path / "t.toml", tiny(model=3)))
    assert key == "model" and "expected a table" in msg and "iterable" not in msg


def test_a_string_is_not_an_array_of_strings(tmp_path):
    key, msg = one_problem(write(tmp_path / "t.toml", tiny(launch={"slurm": {"extra_sbatch": "--exclusive"}})))
    assert key == "launch.slurm.extra_sbatch" and "array" in msg


@pytest.mark.parametrize("dotted", ["train.lr", "train.loss_spike_factor", "model.norm_epsilon", "budget.max_gpu_hours"])
def test_non_finite_numbers_are_rejected(tmp_path, dotted):
    section, key = dotted.split(".")
    for value in (math.nan, math.inf):
        got_key, msg = one_problem(write(tmp_path / "t.toml", tiny(**{section: {key: value}})))
        assert got_key == dotted and "finite" in msg


def test_zero_micro_batch_is_a_problem_not_a_crash(tmp_path):
    found = problems(write(tmp_path / "t.toml", tiny(train={"micro_batch_size": 0})))
    assert ("train.micro_batch_size", "must be positive, got 0") in found


# --- unknown keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dotted,wrong,right", [
    ("", "trian", "train"),
    ("", "descripton", "description"),
    ("model", "num_layer", "num_layers"),
    ("model", "num_attention_head", "num_attention_heads"),
    ("parallel", "tensr", "tensor"),
    ("train", "global_batchsize", "global_batch_size"),
    ("data", "pth", "path"),
    ("data.tokenizer", "vocabsize", "vocab_size"),
    ("data.tokenizer", "merge", "merges"),
    ("checkpoint", "intervall", "interval"),
    ("smoke", "train_iter", "train_iters"),
    ("hardware", "gpus_per_nodes", "gpus_per_node"),
    ("launch", "knd", "kind"),
    ("launch.slurm", "partion", "partition"),
    ("launch.slurm", "extra-sbatch", "extra_sbatch"),
    ("tracking", "experiments", "experiment"),
    ("baseline", "tolerance", "tolerances"),
    ("budget", "max_gpu_hour", "max_gpu_hours"),
])
def test_unknown_key_suggests_the_nearest_at_every_level(tmp_path, dotted, wrong, right):
    over: dict = {wrong: 1}
    for part in reversed(dotted.split(".") if dotted else []):
        over = {part: over}
    path = f"{dotted}.{wrong}" if dotted else wrong
    assert one_problem(write(tmp_path / "t.toml", tiny(**over))) == (path, f"unknown key; did you mean '{right}'?")


def test_unknown_key_far_from_any_lists_the_known_keys(tmp_path):
    key, msg = one_problem(write(tmp_path / "t.toml", tiny(launch={"slurm": {"xyzzy": 1}})))
    assert key == "launch.slurm.xyzzy" and msg.startswith("unknown key; known keys: ")
    assert all(a.name in msg for a in attrs.fields(SlurmSpec))


def test_documented_learning_rate_suggestion(tmp_path):
    path = write(tmp_path / "t.toml", tiny(train={"learning_rate": 1e-4}))
    assert one_problem(path) == ("train.learning_rate", "unknown key; did you mean 'lr'?")


def test_an_empty_key_is_named(tmp_path):
    assert one_problem(write(tmp_path / "t.toml", tiny(model={"": 1})))[0] == 'model.""'
    assert one_problem(write(tmp_path / "u.toml", tiny(**{"": 1})))[0] == '""'
    assert one_problem(write(tmp_path / "v.toml", tiny(model={"num layers": 1})))[0] == 'model."num layers"'


def test_free_form_tables_take_any_key(tmp_path):
    spec = load_spec(write(tmp_path / "t.toml", tiny(baseline={"tolerances": {"valid/loss": 0.02, "ppl": 0.1}})))
    assert spec.baseline.tolerances == {"valid/loss": 0.02, "ppl": 0.1}


# --- closed choices -------------------------------------------------------------------------------


LITERALS = [
    ("train", "precision", TrainSpec, "bf17", "bf16"),
    ("train", "lr_decay_style", TrainSpec, "cosin", "cosine"),
    ("hardware", "gpu", HardwareSpec, "h100", "H100"),
    ("launch", "kind", LaunchSpec, "slrum", "slurm"),
    ("model", "normalization", ModelSpec, "RMSnorm", "RMSNorm"),
    ("data.tokenizer", "kind", TokenizerSpec, "sentencepeice", "sentencepiece"),
]


@pytest.mark.parametrize("section,key,cls,wrong,near", LITERALS, ids=[f"{s}.{k}" for s, k, *_ in LITERALS])
def test_literals_list_allowed_values_and_the_nearest(tmp_path, section, key, cls, wrong, near):
    over: dict = {key: wrong}
    for part in reversed(section.split(".")):
        over = {part: over}
    got_key, msg = one_problem(write(tmp_path / "t.toml", tiny(**over)))
    allowed = typing.get_args(typing.get_type_hints(cls)[key])
    assert got_key == f"{section}.{key}" and f'"{wrong}" is not allowed' in msg
    assert all(f'"{a}"' in msg for a in allowed) and msg.endswith(f'did you mean "{near}"?')


def test_a_literal_of_the_wrong_type_is_not_allowed(tmp_path):
    key, msg = one_problem(write(tmp_path / "t.toml", tiny(train={"precision": 16})))
    assert key == "train.precision" and msg.startswith("16 is not allowed; use one of")


# --- every problem at once ------------------------------------------------------------------------


def test_every_structural_problem_is_reported_at_once(tmp_path):
    data = tiny(name=None, description=7,
                model={"num_layer": 4, "swiglu": "yes"},
                train={"lr": "3e-4", "precision": "bf17", "global_batch_size": None},
                data={"tokenizer": {"vocabsize": 1}},
                launch={"slurm": {"partion": "gpu", "extra_sbatch": [1]}},
                hardware={"gpu": "H1OO"},
                budget=[])
    found = problems(write(tmp_path / "t.toml", data))
    assert sorted(k for k, _ in found) == sorted([
        "name", "description", "model.num_layer", "model.swiglu", "train.lr", "train.precision",
        "train.global_batch_size", "data.tokenizer.vocabsize", "launch.slurm.partion",
        "launch.slurm.extra_sbatch[0]", "hardware.gpu", "budget"])
    assert dict(found)["train.global_batch_size"] == "required key is missing; add it"
    assert dict(found)["name"] == "required key is missing; add it"
    assert str(load_error(tmp_path / "t.toml")).startswith(f"12 problems in {tmp_path / 't.toml'}:\n")


def load_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    return exc.value


def test_every_rule_problem_is_reported_at_once(tmp_path):
    data = tiny(name="bad name!", model={"num_query_groups": 3, "seq_length": 256, "num_layers": 0},
                train={"min_lr": 1.0, "global_batch_size": 9, "adam_beta2": 1.0},
                data={"split": "90,10"}, launch={"master_port": 80, "slurm": {"time": "4h"}},
                smoke={"resume_check_iters": 30})
    found = problems(write(tmp_path / "t.toml", data))
    assert sorted(k for k, _ in found) == sorted([
        "name", "model.num_layers", "model.num_query_groups", "model.seq_length", "train.min_lr",
        "train.global_batch_size", "train.adam_beta2", "data.split", "launch.master_port", "launch.slurm.time",
        "smoke.resume_check_iters"])
    msgs = dict(found)
    assert msgs["model.num_query_groups"] == "3 does not divide model.num_attention_heads=4; use one of 1, 2, 4"
    assert "raise max_position_embeddings or shorten the sequence" in msgs["model.seq_length"]


def test_a_head_count_past_int64s_half_is_named_without_listing_its_divisors(tmp_path):
    """The fuzz found `mcx plan` searching 3e9 candidates for the divisors of 2**63 - 1 heads: above the
    range rule's count the fix names no list."""
    found = dict(problems(write(tmp_path / "t.toml", tiny(model={"num_attention_heads": 2**63 - 1, "num_query_groups": 8}))))
    assert "is above 1048576" in found["model.num_attention_heads"]
    assert found["model.num_query_groups"].endswith("use a divisor of it")


def test_fp8_attention_needs_an_fp8_precision(tmp_path):
    found = dict(problems(write(tmp_path / "t.toml", tiny(train={"fp8_attention": True, "precision": "bf16"}))))
    assert list(found) == ["train.fp8_attention"]
    assert found["train.fp8_attention"] == ('true needs an fp8 train.precision (it is "bf16"); set precision = '
                                            '"fp8-hybrid" or fp8_attention = false')
    ok = load_spec(write(tmp_path / "u.toml", tiny(train={"fp8_attention": True, "precision": "fp8-hybrid"})))
    assert ok.train.fp8_attention and ok.train.precision == "fp8-hybrid"


def test_te_op_fuser_needs_a_dense_mlp(tmp_path):
    """(Its need for Transformer Engine is the planner's rule: tests/test_plan.py.)"""
    moe = dict(problems(write(tmp_path / "m.toml", tiny(model={"num_experts": 4}, train={"te_op_fuser": True}))))
    assert list(moe) == ["train.te_op_fuser"] and "mixture-of-experts model has none" in moe["train.te_op_fuser"]
    ok = load_spec(write(tmp_path / "u.toml", tiny(train={"te_op_fuser": True, "precision": "fp8-hybrid"})))
    assert ok.train.te_op_fuser and load_spec(write(tmp_path / "v.toml", tiny())).train.te_op_fuser is False


def test_missing_required_sections_and_keys(tmp_path):
    found = problems(write(tmp_path / "t.toml", {"description": "only this"}))
    assert found == [(k, "required key is missing; add it") for k in ("name", "model", "train", "data")]
    found = problems(write(tmp_path / "u.toml", tiny(model={"num_layers": None, "seq_length": None},
                                                    data={"path": None})))
    assert sorted(k for k, _ in found) == ["data.path", "model.num_layers", "model.seq_length"]


# --- round trip and frozen specs ------------------------------------------------------------------


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_dump_then_load_is_the_same_spec(path):
    spec = load_spec(path)
    text = dump_spec(spec)
    again = loads_spec(text, source=f"{path.name} (dumped)")
    assert again == spec and spec_to_dict(again) == spec_to_dict(spec)
    assert dump_spec(again) == text
    assert "extends" not in text and "extends" not in tomllib.loads(text)


def test_specs_are_frozen_and_evolve_makes_new_ones():
    spec = load_spec(EXPERIMENTS_DIR / "tiny.toml")
    for obj, name, value in [(spec, "name", "x"), (spec.train, "lr", 1.0), (spec.model, "num_layers", 8),
                             (spec.data.tokenizer, "kind", "gpt2"), (spec.launch.slurm, "time", "00:01:00")]:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(obj, name, value)
    with pytest.raises(AttributeError):
        spec.train.learning_rate = 1.0  # slots: no new attributes either
    changed = attrs.evolve(spec, train=attrs.evolve(spec.train, lr=1.0))
    assert changed.train.lr == 1.0 and spec.train.lr == TINY["train"]["lr"] and changed != spec
    assert isinstance(spec, ExperimentSpec) and isinstance(spec.data, DataSpec)


# --- [debug]: fault injection ------------------------------------------------------------------------


def test_the_debug_table_is_read_checked_and_absent_where_unset(tmp_path):
    """[debug] perturb_params and nan_params_at_step are spec keys like any other: strict, checked by the
    rules, dumped and read back; a spec without the table (or with an empty one) has none in its dict,
    its dump or anything built from them (the config hash, the job file, MLflow params)."""
    from mcx.spec.schema import DebugSpec, PerturbSpec

    path = write(tmp_path / "d.toml", tiny(debug={"perturb_params": {"step": 11}, "nan_params_at_step": 14}))
    spec = load_spec(path)
    assert spec.debug == DebugSpec(perturb_params=PerturbSpec(step=11, amount=1e-2), nan_params_at_step=14)
    assert spec_to_dict(spec)["debug"] == {"perturb_params": {"step": 11, "amount": 0.01}, "nan_params_at_step": 14}
    assert "[debug.perturb_params]" in dump_spec(spec) and loads_spec(dump_spec(spec)) == spec
    assert load_spec(path, ["debug.perturb_params.amount=-1e-4"]).debug.perturb_params.amount == -1e-4

    plain = load_spec(EXPERIMENTS_DIR / "tiny.toml")
    empty = load_spec(write(tmp_path / "e.toml", tiny(debug={})))
    assert plain.debug == empty.debug == DebugSpec() and plain == empty
    assert "debug" not in spec_to_dict(plain) and "debug" not in dump_spec(empty)

    found = problems(path, ["debug.perturb_params.step=0", "debug.perturb_params.amount=0.0",
                            "debug.nan_params_at_step=-1", "debug.swap_micro_batches_at_step=0"])
    assert sorted(k for k, _ in found) == ["debug.nan_params_at_step", "debug.perturb_params.amount",
                                           "debug.perturb_params.step", "debug.swap_micro_batches_at_step"]
    swap = load_spec(path, ["debug.swap_micro_batches_at_step=12"])  # a newer key: in the dict only where set (D69)
    assert spec_to_dict(swap)["debug"]["swap_micro_batches_at_step"] == 12 and loads_spec(dump_spec(swap)) == swap
    assert one_problem(path, ["debug.perturb_params.amount=nan"])[0] == "debug.perturb_params.amount"
    key, msg = one_problem(path, ["debug.perturb_param={step=3}"])
    assert key == "debug.perturb_param" and "did you mean 'perturb_params'?" in msg
    assert one_problem(write(tmp_path / "s.toml", tiny(debug={"perturb_params": {"amount": 0.1}})))[0] == \
        "debug.perturb_params.step"


def test_perturb_output_is_a_debug_key_checked_by_the_rules(tmp_path):
    """debug.perturb_output (D70): read, dumped and read back, hashed when set; its step, micro-batch, amount
    and module path checked before anything runs."""
    from mcx.spec.schema import OutputPerturbSpec

    fault = {"step": 12, "micro_batch": 1, "module": "decoder.layers.1.mlp.linear_fc2"}
    path = write(tmp_path / "o.toml", tiny(debug={"perturb_output": fault}))
    spec = load_spec(path)
    assert spec.debug.perturb_output == OutputPerturbSpec(**fault, amount=1e-2)
    assert spec_to_dict(spec)["debug"]["perturb_output"] == {**fault, "amount": 0.01}
    assert loads_spec(dump_spec(spec)) == spec
    older = load_spec(path, ["debug.perturb_params={step=3}"])
    assert "perturb_output" in spec_to_dict(older)["debug"]
    assert "perturb_output" not in spec_to_dict(load_spec(write(tmp_path / "p.toml",
                                                                 tiny(debug={"perturb_params": {"step": 3}}))))["debug"]
    found = problems(path, ["debug.perturb_output.step=0", "debug.perturb_output.micro_batch=-1",
                            "debug.perturb_output.amount=0.0", 'debug.perturb_output.module="layers..1"'])
    assert sorted(k for k, _ in found) == ["debug.perturb_output.amount", "debug.perturb_output.micro_batch",
                                           "debug.perturb_output.module", "debug.perturb_output.step"]
    assert one_problem(write(tmp_path / "m.toml", tiny(debug={"perturb_output": {"step": 3}})))[0] == \
        "debug.perturb_output.module"


def test_eval_every_is_checked_and_absent_from_the_record_where_unset(tmp_path):
    """[eval] every (D71): a non-negative step count; an [eval] without it records as before the key existed."""
    tasks = {"tasks": ["evals/quickstart_next_line"]}
    without = load_spec(write(tmp_path / "a.toml", tiny(eval=tasks)))
    assert spec_to_dict(without)["eval"] == {"tasks": ["evals/quickstart_next_line"], "num_fewshot": 0, "limit": None,
                                             "batch_size": 8}
    every = load_spec(write(tmp_path / "b.toml", tiny(eval={**tasks, "every": 10})))
    assert spec_to_dict(every)["eval"]["every"] == 10 and loads_spec(dump_spec(every)) == every
    assert one_problem(tmp_path / "b.toml", ["eval.every=-1"])[0] == "eval.every"
