"""`mcx locate A B` across layouts (D74): a run of one process (one micro-batch of 4 a step) against the same
model data-parallel over two gloo processes (one micro-batch of 2 each; the CPU backend runs no tensor
parallelism), both started from one run's checkpoint as their canonical weights on the same data, compared
layer by layer on gathered full tensors within the band a rounding-noise replay measures; and a fault planted
in a DP 2 run named as the first layer where the layouts part.

The runs are stage directories the real worker trains (no `mcx run`: its tracking and DVC add nothing here
and cost half a minute a run), the one-process ones in this process; locate replays them through the
launchers as it does any run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import e2e_env, mcx_inprocess, quickstart_dataset
from mcx.spec.load import load_spec, spec_to_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=2",
         "model.ffn_hidden_size=128", "model.seq_length=64", "model.max_position_embeddings=64",
         "train.micro_batch_size=2", "train.global_batch_size=4", "train.train_iters=1", "train.lr_warmup_iters=0",
         "train.eval_interval=100", "train.eval_iters=1", "checkpoint.interval=1", "smoke.enabled=false"]
ONE = ["train.micro_batch_size=4"]  # one process, one micro-batch of 4: other GEMM shapes and gradient sums
DP2 = ['launch.kind="torchrun"', "hardware.gpus_per_node=2"]  # two gloo processes, one micro-batch each
PLANT = {"step": 1, "micro_batch": 0, "module": "decoder.layers.1.mlp", "amount": 0.01}
IDS = {"source": "5" * 12, "one": "a" * 12, "dp2": "b" * 12, "dp2_fault": "c" * 12}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("e2e_clean_env")]


def stage(project: Path, name: str, overrides: list[str], init: Path | None = None, dp: int = 1) -> Path:
    """The full stage directory of run IDS[name] with the job.json the control plane would write."""
    spec = load_spec(TINY, [*SMALL, *overrides])
    out = project / ".mcx" / "runs" / IDS[name] / "full"
    out.mkdir(parents=True)
    job = {"run_id": IDS[name], "stage": "full", "spec": spec_to_dict(spec),
           "layout": {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": dp, "world_size": dp,
                      "sequence_parallel": False},
           "data_dir": str(project / "data" / "quickstart"), "checkpoint_dir": str(out / "checkpoints"),
           "train_samples_limit": None, "checks": {"resume_check_iters": 3, "loss_window": 5, "min_loss_drop": 0.0},
           "device": "cpu", "output": "quiet",
           **({"init": {"kind": "run", "path": str(init), "format": "torch", "load_optimizer": False,
                        "reset_step": True}} if init else {})}
    (out / "job.json").write_text(json.dumps(job, indent=1))
    return out


def in_process(out: Path) -> None:
    """One process's stage, trained in this process (no interpreter start)."""
    from mcx.train import train_stage

    assert train_stage(out)["status"] == "finished", (out / "worker.log").read_text()[-3000:]


def data_parallel(out: Path) -> subprocess.Popen:
    """A DP 2 stage: torchrun, two gloo processes."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                             "mcx.train", str(out)], cwd=ROOT, env={**e2e_env(), "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source run (1 step, one process: its checkpoint is the canonical start of the others), a run of one
    process and two of DP 2 (one with a fault planted), each one step from that checkpoint."""
    root = tmp_path_factory.mktemp("xlayout")
    (root / "data").mkdir()
    os.symlink(quickstart_dataset(), root / "data" / "quickstart")
    in_process(stage(root, "source", []))
    start = root / ".mcx" / "runs" / IDS["source"] / "full" / "checkpoints" / "iter_0000001"
    fault = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in PLANT.items()) + "}"
    procs = [data_parallel(stage(root, "dp2", DP2, start, dp=2)),
             data_parallel(stage(root, "dp2_fault", [*DP2, f"debug.perturb_output={fault}"], start, dp=2))]
    in_process(stage(root, "one", ONE, start))  # while the two DP 2 runs train
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    return root


def test_two_layouts_from_one_start_are_equivalent_within_the_band(project):
    res = mcx_inprocess(project, "locate", IDS["one"], IDS["dp2"], "--json")
    assert res.code == 0 and "Traceback" not in res.err, res
    v = res.json()
    print("locate:", v["summary"])  # the worked example of docs/reproduce.md
    assert v["across_layouts"] is True and v["differs"] is False and v["step"] == 1
    assert v["summary"].startswith("step 1: equivalent up to layer 2 within the band")
    assert v["layouts"] == ["TP1 PP1 CP1 EP1 DP1, 1 micro-batch of 4 a rank", "TP1 PP1 CP1 EP1 DP2, 1 micro-batch of 2 a rank"]
    outputs = [c for c in v["checks"] if c["what"] == "output"]
    params = [c for c in v["checks"] if c["what"] == "parameter"]
    assert [c["name"] for c in outputs] == ["embedding", *[f"decoder.layers.{i}{part}" for i in (0, 1) for part in (
        ".self_attention", ".mlp", "")], "decoder.final_layernorm", "output_layer"]
    assert all(c["samples"] == 4 for c in outputs) and [c["layer"] for c in outputs] == [0, 1, 1, 1, 2, 2, 2, None, None]
    assert len(params) == 15 and all(c["within"] for c in v["checks"])
    # the band is measured: the noise replay moved every layer's output, and the two layouts' parameters after
    # the step differ (one micro-batch of 4 against two of 2 summed across ranks) yet stay within it
    assert all(c["noise"] > 0 for c in outputs[1:]) and any(c["max_abs"] > 0 for c in params)
    assert all(c["band"] >= 10 * c["noise"] for c in v["checks"])
    assert [Path(r).name for r in v["replays"]] == ["step1.layers", "step1.layers", "step1.noise"]
    text = mcx_inprocess(project, "locate", IDS["one"], IDS["dp2"])  # the replays are reused
    assert text.code == 0 and "equivalent up to layer 2 within the band" in text.out and "replaying" not in text.err


def test_a_fault_in_one_layout_is_the_first_layer_where_they_part(project):
    res = mcx_inprocess(project, "locate", IDS["one"], IDS["dp2_fault"], "--json")
    assert res.code == 0, res
    v = res.json()
    print("locate:", v["summary"])
    first = v["first"]
    assert (first["what"], first["name"], first["layer"]) == ("output", PLANT["module"], 2)
    assert first["max_abs"] == pytest.approx(PLANT["amount"], rel=1e-3) and first["band"] < 1e-5
    before = v["checks"][:[c["name"] for c in v["checks"]].index(PLANT["module"])]
    assert before and all(c["within"] for c in before)
    assert v["summary"].startswith("step 1: the layouts part at layer 2: `decoder.layers.1.mlp` output: max abs 0.01")


def test_layouts_that_cannot_be_compared_are_refused(project):
    # the source run started from its own random weights, the others from its checkpoint
    res = mcx_inprocess(project, "locate", IDS["source"], IDS["dp2"])
    assert res.code == 2 and "do not start from the same weights" in res.err and "Traceback" not in res.err, res
    # another model: a run of 3 layers (its job file and metrics are all the refusal reads)
    other = project / ".mcx" / "runs" / ("d" * 12) / "full"
    other.mkdir(parents=True)
    one = project / ".mcx" / "runs" / IDS["one"] / "full"
    job = json.loads((one / "job.json").read_text())
    job["spec"]["model"]["num_layers"] = 3
    (other / "job.json").write_text(json.dumps(job))
    (other / "metrics.jsonl").write_text((one / "metrics.jsonl").read_text())
    res = mcx_inprocess(project, "locate", IDS["dp2"], "d" * 12)
    assert res.code == 2 and "train different models (model.num_layers: 2 vs 3)" in res.err, res
    assert not (other.parent / "replays").exists()
