"""Reports: run directories -> RunData -> Comparison -> table / Markdown / JSON / HTML; verdicts.

Run directories are written the way the control plane and the worker write them (a spec resolved
from experiments/tiny.toml, fingerprint.json, job.json, metrics.jsonl, result.json). The HTML is
rendered by headless Chromium and its screenshot decoded and inspected.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import statistics
import struct
import subprocess
import tomllib
import zlib
from array import array
from pathlib import Path

import pytest
import tomli_w
from rich.console import Console

from mcx.errors import InputError
from mcx.report.compare_view import compare
from mcx.report.htmlpage import to_html
from mcx.report.jsondoc import to_json
from mcx.report.markdown import to_markdown
from mcx.metrics.curves import curve, read_metrics
from mcx.report.rundata import RunData, load_run_dir, summarize_run
from mcx.report.table import to_table, to_table_text
from mcx.report.verdict import Band, seed_spread_band, verdict, verdict_to_dict
from mcx.metrics.summary import BY_KEY, METRICS, spread
from mcx.report import fmt
from mcx.report.outcome import lines
from mcx.report.rolling import spread_band, trailing_mean
from mcx.spec.load import dump_spec, load_spec

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny.toml"
HOSTILE = """<script>alert("x")</script> & 'quotes' [bold]markup[/bold] | pipe"""


# -- writing run directories as mcx does -----------------------------------------------------------

def _component(ident: dict) -> dict:
    return {"id": ident, "info": {"note": "probed"}, "warnings": []}


def write_run(root: Path, run_id: str, *, overrides: tuple[str, ...] = (), steps: int = 60, loss_shift: float = 0.0,
              tokens_per_s: float = 50_000.0, commit: str = "a" * 40, eval_every: int = 20,
              mfu: float | None = 0.4, name: str | None = None, tps_wobble: float = 0.0) -> Path:
    spec = load_spec(TINY, list(overrides))
    d = root / run_id
    (d / "full").mkdir(parents=True)
    text = dump_spec(spec)
    if name is not None:  # a name the spec rules would refuse: run directories are data, not trusted
        text = tomli_w.dumps({**tomllib.loads(text), "name": name})
    (d / "spec.toml").write_text(text, encoding="utf-8")
    (d / "fingerprint.json").write_text(json.dumps({"run_id": run_id, "components": {
        "code": _component({"commit": commit, "dirty": False}),
        "environment": _component({"lockfile_sha256": "e" * 64, "torch": "2.11.0"}),
        "config": _component({"train": {"lr": spec.train.lr}}),
        "data": _component({"dataset": "d" * 32}),
        "hardware": _component({"gpu": "cpu", "count": 1}),
    }}), encoding="utf-8")
    (d / "plan.json").write_text("{}")
    (d / "full" / "job.json").write_text(json.dumps({"run_id": run_id, "stage": "full", "layout": {
        "tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1, "world_size": 1, "sequence_parallel": False}}))
    lines = []
    t = 1_750_000_000.0
    for s in range(1, steps + 1):
        loss = 6.0 * math.exp(-s / 20) + 2.0 + loss_shift
        t += 0.5
        tps = tokens_per_s * (1 + tps_wobble * math.sin(s * 2.3))  # a CPU's step-to-step wobble
        lines.append(json.dumps({"kind": "train", "step": s, "loss": loss, "grad_norm": 1.0 / s + 4 * loss_shift, "lr": 3e-3 * min(1, s / 20),
                                 "tokens_per_s_per_gpu": tps, "tflops_per_gpu": 0.1 * tps / 50_000, "mfu": mfu,
                                 "mem_peak_bytes": 300_000_000, "step_time_s": 0.5, "time": t}))
        if s % eval_every == 0:
            lines.append(json.dumps({"kind": "valid", "step": s, "loss": loss + 0.1, "ppl": math.exp(loss + 0.1)}))
    lines.append(json.dumps({"kind": "test", "step": steps, "loss": loss + 0.12, "ppl": math.exp(loss + 0.12)}))
    (d / "full" / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "full" / "result.json").write_text(json.dumps({
        "status": "finished", "passed": True, "checks": {}, "final": {}, "error": None, "steps": steps,
        "layer_spec": "local", "versions": {}}))
    return d


@pytest.fixture()
def two_runs(tmp_path: Path) -> tuple[RunData, RunData]:
    a = load_run_dir(write_run(tmp_path, "aaaa1111bbbb"))
    b = load_run_dir(write_run(tmp_path, "cccc2222dddd", overrides=("train.lr=1e-3",), loss_shift=0.05,
                               tokens_per_s=45_000.0, commit="b" * 40))
    return a, b


# -- loading -----------------------------------------------------------------------------------------

def test_load_run_dir_reads_spec_fingerprint_curves_and_cost(tmp_path: Path) -> None:
    run = load_run_dir(write_run(tmp_path, "aaaa1111bbbb", steps=60))
    assert run.run_id == "aaaa1111bbbb" and run.name == "tiny" and run.status == "finished"
    assert run.spec["train.lr"] == 3e-3 and run.spec["model.num_layers"] == 4
    assert run.fingerprint.names() == {"code", "environment", "config", "data", "hardware"}
    loss = run.curves["train/loss"]
    assert list(loss.steps) == list(range(1, 61)) and loss.values.typecode == "d"
    assert list(run.curves["valid/loss"].steps) == [20, 40, 60]
    assert list(run.curves["test/ppl"].steps) == [60]
    assert "train/kind" not in run.curves and "train/step" not in run.curves
    # 60 steps of 0.5 s: the span of the logged times plus the first step's own time
    assert run.wall_time_s == pytest.approx(30.0)
    assert run.gpu_hours == pytest.approx(30.0 / 3600)
    assert run.stages["full"].world_size == 1 and run.stages["full"].steps == 60


def test_metrics_file_nulls_nans_and_an_unfinished_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 2.0, "mfu": null}\n'
                    '{"kind": "train", "step": 2, "loss": NaN, "mfu": 0.5}\n'
                    '{"kind": "train", "step": 3, "lo', encoding="utf-8")
    curves, notes = read_metrics(path)
    assert list(curves["train/loss"].steps) == [1, 2]
    assert curves["train/loss"].values[0] == 2.0 and math.isnan(curves["train/loss"].values[1])
    assert list(curves["train/mfu"].steps) == [2]  # null is "unknown", not a point
    assert len(notes) == 1 and "unfinished last line 3" in notes[0]


def test_fast_and_standard_parsers_give_the_same_curves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcx.metrics import curves as metricsfile

    path = write_run(tmp_path, "aaaa1111bbbb", steps=200, mfu=None) / "full" / "metrics.jsonl"
    fast, notes = read_metrics(path)
    monkeypatch.setattr(metricsfile, "_fast_loads", json.loads)
    slow, _ = read_metrics(path)
    assert notes == [] and "train/mfu" not in fast  # every mfu was null
    assert {k: (list(c.steps), list(c.values)) for k, c in fast.items()} == \
           {k: (list(c.steps), list(c.values)) for k, c in slow.items()}
    assert sorted(fast) == ["test/loss", "test/ppl", "train/grad_norm", "train/loss", "train/lr",
                            "train/mem_peak_bytes", "train/step_time_s", "train/tflops_per_gpu", "train/time",
                            "train/tokens_per_s_per_gpu", "valid/loss", "valid/ppl"]


def test_metrics_file_damaged_in_the_middle_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n{oops\n{"kind": "train", "step": 3, "loss": 1.0}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl:2 is not valid JSON"):
        read_metrics(path)


def test_not_a_run_dir_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no run directory"):
        load_run_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no spec.toml"):
        load_run_dir(tmp_path / "empty")


# -- comparing ---------------------------------------------------------------------------------------

def test_config_diff_shows_exactly_the_changed_key(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs
    cmp = compare([b], a)
    assert [(r.key, r.values) for r in cmp.config_diff] == [("train.lr", (3e-3, 1e-3))]
    assert list(cmp.fingerprint_diff) == ["code"]
    assert [r.key for r in cmp.fingerprint_diff["code"]] == ["id.commit"]
    assert cmp.fingerprint_same == ("environment", "data", "hardware")
    assert [h.run_id for h in cmp.runs] == ["aaaa1111bbbb", "cccc2222dddd"] and cmp.runs[0].is_baseline


def test_regressions_are_flagged_in_the_right_direction(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs
    cmp = compare([b], a)
    flagged = {r.metric for r in cmp.regressions}
    # b: every loss 0.05 higher (lower is better) and 10% less throughput (higher is better)
    assert {"train_loss", "valid_loss", "test_loss", "valid_ppl", "tokens_per_s_per_gpu"} <= flagged
    assert not flagged & {"mfu", "mem_peak_bytes", "wall_time_s", "gpu_hours", "step_time_s"}  # unchanged
    tps = next(r for r in cmp.regressions if r.metric == "tokens_per_s_per_gpu")
    assert tps.delta_rel == pytest.approx(-0.10)
    # the same comparison the other way round: b as the baseline, a improves everywhere
    back = compare([a], b)
    assert back.regressions == ()
    row = next(r for r in back.metrics if r.metric.key == "tokens_per_s_per_gpu")
    assert row.cells[1].improved and not row.cells[1].regressed
    # a tolerance above the change silences exactly that metric
    tolerant = compare([b], a, tolerances={"tokens_per_s_per_gpu": 0.11})
    assert "tokens_per_s_per_gpu" not in {r.metric for r in tolerant.regressions}
    assert "valid_loss" in {r.metric for r in tolerant.regressions}


def test_a_nan_loss_is_a_regression_and_bad_tolerances_are_input_errors(two_runs: tuple[RunData, RunData]) -> None:
    a, _ = two_runs
    nan_run = RunData(run_id="nan0", name="nan", curves={"valid/loss": curve([20], [math.nan])})
    cmp = compare([nan_run], a)
    assert [r.metric for r in cmp.regressions] == ["valid_loss"]
    with pytest.raises(InputError, match=r"baseline.tolerances.valid_los: unknown metric"):
        compare([a], a, tolerances={"valid_los": 0.1})
    with pytest.raises(InputError, match=r"baseline.tolerances.valid_loss = -1"):
        compare([a], a, tolerances={"valid_loss": -1})


def test_summaries_window_the_train_loss_and_skip_warmup() -> None:
    steps = list(range(1, 201))
    loss = [5.0] * 190 + [1.0] * 10  # the last 10-step window is all 1.0
    tps = [10.0] * 10 + [100.0] * 190  # warm-up (first 5% = 10 steps) is left out
    run = RunData(run_id="r", name="r", curves={"train/loss": curve(steps, loss),
                                                "train/tokens_per_s_per_gpu": curve(steps, tps)})
    s = summarize_run(run)
    assert s["train_loss"] == 1.0 and s["train_loss_best"] == 1.0
    assert s["tokens_per_s_per_gpu"] == 100.0
    assert s["mfu"] is None and s["valid_loss"] is None
    spiky = RunData(run_id="s", name="s", curves={"train/loss": curve(steps, [3.0] * 100 + [0.1] + [3.0] * 99)})
    assert summarize_run(spiky)["train_loss_best"] == pytest.approx((9 * 3.0 + 0.1) / 10)  # one lucky batch is not "best"
    diverged = RunData(run_id="d", name="d", curves={"train/loss": curve(steps, [3.0] * 50 + [2.0] * 100 + [math.nan] * 50)})
    d = summarize_run(diverged)
    assert math.isnan(d["train_loss"]) and d["train_loss_best"] == 2.0  # best of the finite windows


# -- rendering ---------------------------------------------------------------------------------------

def test_every_format_carries_the_same_facts(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs
    cmp = compare([b], a)
    doc = to_json(cmp, curves=True)
    json.dumps(doc, allow_nan=False)  # strict JSON
    assert doc["config_diff"] == [{"key": "train.lr", "values": {"aaaa1111bbbb": 3e-3, "cccc2222dddd": 1e-3}}]
    assert doc["metrics"]["tokens_per_s_per_gpu"]["runs"]["cccc2222dddd"]["regressed"] is True
    assert len(doc["curves"]["train/loss"]["cccc2222dddd"]["steps"]) == 60
    md = to_markdown(cmp)
    assert "| `train.lr` | 0.003 | 0.001 |" in md and "regression" in md
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(to_table(cmp))
    text = console.file.getvalue()
    assert "train.lr" in text and "0.003" in text and "0.001" in text and "-10.00%" in text


def test_html_has_both_runs_curves_and_coloured_deltas(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs
    page = to_html(compare([b], a))
    for chart in ("chart-train_loss", "chart-valid_loss", "chart-throughput", "chart-lr", "chart-grad_norm"):
        svg = re.search(rf'<svg class="chart" id="{chart}".*?</svg>', page, re.S)
        assert svg, chart
        runs = re.findall(r'<path class="series" data-run="([0-9a-z]+)" d="M[-\d. L]+"', svg.group(0))
        assert runs == ["aaaa1111bbbb", "cccc2222dddd"], chart
    assert re.search(r'<td class="bad"[^>]*>0\.0030[^<]*<span class="d bad">', page) is None  # baseline not judged
    assert '<span class="d bad">-10.00% ▲</span>' in page  # throughput dropped 10%
    assert "http://" not in page.replace("http://www.w3.org", "") and "<script" not in page


def test_hostile_names_and_values_are_escaped(tmp_path: Path) -> None:
    a = load_run_dir(write_run(tmp_path, "aaaa1111bbbb", name=HOSTILE))
    b = load_run_dir(write_run(tmp_path, "cccc2222dddd", overrides=('description="</td><img src=x onerror=alert(1)>"',)))
    cmp = compare([b], a)
    page = to_html(cmp)
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;quotes&#x27;" in page
    assert "&lt;/td&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    md = to_markdown(cmp)
    assert "<script>" not in md and "<img" not in md and "\\| pipe" in md
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(to_table(cmp))
    assert "[bold]markup[/bold]" in console.file.getvalue()  # shown as written, not as rich markup


def test_html_stays_small_for_100_runs_of_10000_steps() -> None:
    steps = array("q", range(1, 10_001))
    runs = []
    for i in range(100):
        loss = array("d", (2.5 + 8 * math.exp(-s / 400) + 0.01 * i + 0.05 * math.sin(s * 0.37 + i) for s in steps))
        tps = array("d", (40_000.0 + 500 * math.sin(s * 0.11 + i) for s in steps))
        runs.append(RunData(run_id=f"run{i:03d}", name=f"sweep-{i}", spec={"train.lr": 1e-4 * (i + 1)},
                            curves={"train/loss": curve(steps, loss), "train/tokens_per_s_per_gpu": curve(steps, tps)}))
    page = to_html(compare(runs[1:], runs[0]))
    assert len(page.encode()) < 2_500_000
    paths = re.findall(r'<path class="series" data-run="run\d{3}" d="([^"]+)"', page)
    assert len(paths) == 200
    assert max(p.count("L") + 1 for p in paths) <= 280  # one point per two pixel columns, at most


# -- the summary, noise, definitions -----------------------------------------------------------------

def test_summary_names_the_better_run_and_says_the_noise_is_unknown(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs  # b: every loss 0.05 higher, train.lr and the commit differ
    for cmp, role in ((compare([b], a), "baseline"), (compare([a, b]), "first run given")):
        s = cmp.summary
        assert s.config_keys == ("train.lr",) and s.components == ("code",)
        assert s.metric.key == "valid_loss" and s.margin.best == a.run_id and s.noise is None
        assert s.margin.delta == pytest.approx(-0.05) and s.reference_role == role
        said = " ".join(lines(cmp))
        assert "train.lr (0.003 → 0.001)" in said and "fingerprint code" in said
        assert f"Better on validation loss (final): {a.run_id}" in said and "0.0500 lower (-2.04%)" in said
        assert "noise: unknown" in said and "mcx run SPEC --set train.seed=N" in said
    cmp = compare([b], a)
    page = to_html(cmp)
    assert page.index('id="summary"') < page.index('class="runs"') < page.index('id="metrics"')
    assert "<code>mcx run SPEC --set train.seed=N</code>" in page
    md = to_markdown(cmp)
    assert md.index("### Summary") < md.index("### Metrics") and "`mcx run SPEC --set train.seed=N`" in md
    text = to_table_text(cmp)  # the table as a pipe and `--format table -o` have it: each sentence one line
    assert text.index("Summary\n") < text.index("Runs") < text.index("Metrics")
    assert all(f"\n  {line}\n" in text for line in lines(cmp)), text
    doc = to_json(cmp)
    assert doc["summary"]["best"] == a.run_id and doc["summary"]["metric"] == "valid_loss"
    assert doc["summary"]["noise"]["source"] == "unknown" and doc["summary"]["text"] == lines(cmp)
    # without validation or test losses the train loss is used, and the summary says so
    strip = {"valid/loss", "valid/ppl", "test/loss", "test/ppl"}
    bare = [RunData(run_id=r.run_id, name=r.name, curves={k: c for k, c in r.curves.items() if k not in strip})
            for r in (a, b)]
    only_train = compare(bare)
    assert only_train.summary.metric.key == "train_loss"
    assert "a training metric, not a held-out one" in " ".join(lines(only_train))


def test_seed_runs_quantify_the_noise(tmp_path: Path, two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs  # margin on validation loss: 0.05
    seeds = [a] + [load_run_dir(write_run(tmp_path / "seeds", f"seed{n}0000000", overrides=(f"train.seed={n}",),
                                          loss_shift=shift)) for n, shift in ((1, 0.01), (2, -0.01))]
    cmp = compare([b], a, seeds={a.run_id: seeds})
    n = cmp.summary.noise
    assert n.spread == pytest.approx(0.02) and n.of == a.run_id
    assert n.seeds == ((a.run_id, 1234), ("seed10000000", 1), ("seed20000000", 2))
    assert cmp.summary.within_noise is False
    said = " ".join(lines(cmp))
    assert "the seed spread of validation loss (final) is 0.0200 over 3 runs" in said and "2.5× it" in said
    assert "more than seed noise" in said and "unknown" not in said
    doc = to_json(cmp)["summary"]["noise"]
    assert doc["source"] == "seed spread" and doc["spread"] == pytest.approx(0.02) and doc["margin_within"] is False
    # a wider seed spread swallows the margin
    wide = [a, load_run_dir(write_run(tmp_path / "wide", "seed30000000", overrides=("train.seed=3",), loss_shift=0.2))]
    within = compare([b], a, seeds={a.run_id: wide})
    assert within.summary.within_noise is True
    assert "not distinguishable from seed noise" in " ".join(lines(within))
    # runs that differ only in their seed are their own noise estimate
    alone = compare(seeds[1:], seeds[0])
    assert alone.summary.config_keys == ("train.seed",) and alone.summary.noise.of == ""
    assert "the compared runs, which differ only in train.seed" in " ".join(lines(alone))


def _recorded_run(project: Path, *, seed: int, lr: float, loss_shift: float) -> str:
    """A finished run in ``project`` with a real fingerprint record (what seed_runs reads)."""
    from mcx.fingerprint.record import FingerprintRecord, record_to_dict

    def comp(ident: dict) -> dict:
        return {"id": ident, "info": {}}

    rec = record_to_dict(FingerprintRecord(
        code=comp({"commit": "a" * 40}), environment=comp({"lockfile_sha256": "e" * 64}),
        config=comp({"train": {"lr": lr, "seed": seed}}), data=comp({"dataset": "d" * 32}), hardware=comp({"gpu": "cpu"})))
    d = write_run(project / ".mcx" / "runs", rec["run_id"], overrides=(f"train.seed={seed}", f"train.lr={lr}"),
                  loss_shift=loss_shift)
    (d / "fingerprint.json").write_text(json.dumps(rec), encoding="utf-8")
    (d / "run.json").write_text(json.dumps({"status": "finished"}), encoding="utf-8")
    return rec["run_id"]


def test_mcx_compare_gathers_the_seed_runs_of_the_project(tmp_path: Path) -> None:
    from mcx.ops.compare import compare as compare_op

    project = tmp_path / "project"
    a = _recorded_run(project, seed=1234, lr=3e-3, loss_shift=0.0)
    b = _recorded_run(project, seed=1234, lr=1e-3, loss_shift=0.05)
    unknown = json.loads(compare_op([a, b], project=project, experiment=None, baseline=None, fmt="json", out=None))
    assert unknown["summary"]["noise"]["source"] == "unknown"
    s7 = _recorded_run(project, seed=7, lr=1e-3, loss_shift=0.06)  # b's config, another seed
    _recorded_run(project, seed=8, lr=2e-3, loss_shift=0.5)  # another config: not a seed run of either
    doc = json.loads(compare_op([a, b], project=project, experiment=None, baseline=None, fmt="json", out=None))
    noise = doc["summary"]["noise"]
    assert noise["source"] == "seed spread" and noise["of"] == b and noise["spread"] == pytest.approx(0.01)
    assert [r["run_id"] for r in noise["seed_runs"]] == [b, s7] and noise["margin_within"] is False


def test_mcx_compare_table_carries_the_summary_on_a_pipe_and_into_a_file(tmp_path: Path) -> None:
    """`mcx compare` piped and `--format table -o FILE` (once refused): the same plain text, summary first,
    no line wrapped however narrow COLUMNS is."""
    import contextlib
    import io

    from mcx.cli.main import main

    project = tmp_path / "project"
    a = _recorded_run(project, seed=1234, lr=3e-3, loss_shift=0.0)
    b = _recorded_run(project, seed=1234, lr=1e-3, loss_shift=0.05)
    piped = io.StringIO()
    with contextlib.redirect_stdout(piped), contextlib.chdir(project):
        assert main(["--project", str(project), "compare", a, b]) == 0
    assert piped.getvalue().startswith("Summary\n  What differs: config train.lr (0.003 → 0.001).")
    out = tmp_path / "report.txt"
    with contextlib.chdir(project):
        assert main(["--project", str(project), "compare", a, b, "--format", "table", "-o", str(out)]) == 0
    written = out.read_text(encoding="utf-8")
    assert written == "".join(line.rstrip() + "\n" for line in piped.getvalue().splitlines())
    summary = json.loads(compare_op_json(project, a, b))["summary"]["text"]
    assert all(f"\n  {line}\n" in written for line in summary)
    assert max(len(line) for line in written.splitlines()) > 80  # long lines kept whole, not folded


def compare_op_json(project: Path, *ids: str) -> str:
    from mcx.ops.compare import compare as compare_op

    return compare_op(list(ids), project=project, experiment=None, baseline=None, fmt="json", out=None)


def test_within_noise_deltas_are_not_flagged_anywhere(tmp_path: Path) -> None:
    a = load_run_dir(write_run(tmp_path, "aaaa1111bbbb", tps_wobble=0.2))  # a CPU: per-step throughput ±20%
    b = load_run_dir(write_run(tmp_path, "cccc2222dddd", tokens_per_s=53_000.0, tps_wobble=0.2))
    cmp = compare([b], a)
    row = next(r for r in cmp.metrics if r.metric.key == "tokens_per_s_per_gpu")
    cell = row.cells[1]
    assert cell.within_noise and not cell.improved and not cell.regressed and cell.noise > abs(cell.delta_rel)
    note = fmt.noise(cell)
    assert re.fullmatch(r"within ±\d+% step noise", note)
    page = to_html(cmp)
    td = re.search(r"<td[^>]*>\d\d,\d{3} <span class=\"d ([a-z ]*)\">\+\d\.\d\d%</span><span class=\"nz\">(.*?)</span>", page)
    assert td and td.group(1) == "noise" and td.group(2) == note
    assert "+6.00% ▲" not in page and not any(r.metric == "tokens_per_s_per_gpu" for r in cmp.regressions)
    assert f"(+6.00%, {note})" in to_markdown(cmp)
    entry = to_json(cmp)["metrics"]["tokens_per_s_per_gpu"]["runs"]["cccc2222dddd"]
    assert entry["within_noise"] is True and entry["improved"] is False and entry["noise"] == pytest.approx(cell.noise)
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(to_table(cmp))
    assert f"+6.00% ({note})" in console.file.getvalue()
    # small values keep their digits: a CPU's TFLOP/s is not 0.0
    assert fmt.value("tflops", 0.0624) == "0.0624" and fmt.value("tflops", 412.34) == "412.3"
    assert fmt.value("ratio", 0.0003) == "0.030%" and fmt.value("seconds", 2e-5) == "0.0200 ms"
    assert fmt.value("rate", 0.00123) == "0.00123"


def test_throughput_band_is_the_step_to_step_spread(tmp_path: Path) -> None:
    run = load_run_dir(write_run(tmp_path, "aaaa1111bbbb", steps=400, tps_wobble=0.2))
    tps = run.curves["train/tokens_per_s_per_gpu"]
    xs, lo, hi = spread_band(tps.steps, tps.values)
    assert xs[0] >= 21 and len(xs) == 150  # after warm-up (the first 5% of 400 steps)
    center = summarize_run(run)["tokens_per_s_per_gpu"]
    half = [(h - l) / 2 / center for l, h in zip(lo, hi)]
    assert statistics.median(half) == pytest.approx(spread(BY_KEY["tokens_per_s_per_gpu"], tps.values), rel=0.15)
    page = to_html(compare([run]))
    assert re.search(r'<svg class="chart" id="chart-throughput".*?<path class="spread" data-run="aaaa1111bbbb"', page, re.S)
    # the smoothed train loss ends at train loss (final)
    loss = run.curves["train/loss"]
    _, means = trailing_mean(loss.steps, loss.values)
    assert means[-1] == pytest.approx(summarize_run(run)["train_loss"])


def test_lr_chart_and_definitions(two_runs: tuple[RunData, RunData]) -> None:
    a, b = two_runs
    cmp = compare([b], a)
    assert [p.key for p in cmp.plots] == ["train_loss", "valid_loss", "throughput", "lr", "grad_norm"]
    page = to_html(cmp)
    lr = re.search(r'<svg class="chart" id="chart-lr".*?</svg>', page, re.S).group(0)
    assert "Learning rate" in lr and len(re.findall(r'<path class="series" data-run=', lr)) == 2
    shown = [row.metric for row in cmp.metrics]
    defs = page[page.index('id="definitions"'):]
    md = to_markdown(cmp)
    doc = to_json(cmp)["definitions"]
    for m in shown:
        assert f"<th>{m.label}</th><td>{m.definition.replace(chr(39), '&#x27;')}</td>" in defs
        assert doc[m.key] == {"term": m.label, "definition": m.definition}
    assert md.count("\n- **") >= len(shown) and "### Definitions" in md
    assert {"seed_spread", "smoothed_train_loss", "throughput_band"} <= set(doc)
    assert {m.key for m in shown} == {m.key for m in METRICS} - {"moe_expert_load"}  # dense runs: no routing row


# -- verdicts ----------------------------------------------------------------------------------------

def _curves(loss: list[float], *, lr: float = 1e-3, tps: float = 1000.0) -> dict:
    steps = list(range(1, len(loss) + 1))
    return {"train/loss": (steps, loss), "train/lr": (steps, [lr] * len(loss)),
            "train/tokens_per_s_per_gpu": (steps, [tps] * len(loss)), "valid/loss": ([5, 10], [loss[4] + 0.1, loss[9] + 0.1])}


def test_verdict_bitwise_ignores_timing_and_matches_nan_positions() -> None:
    loss = [3.0, 2.9, 2.8, math.nan, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1]
    v = verdict(_curves(loss), _curves(loss, tps=2000.0))
    assert v.kind == "bitwise" and v.divergence is None and v.steps == 10
    assert set(v.compared) == {"train/loss", "train/lr", "valid/loss"}
    assert "timing" in v.excluded["train/tokens_per_s_per_gpu"]
    d = verdict_to_dict(v)
    json.dumps(d, allow_nan=False)
    assert d["verdict"] == "bitwise" and "train/tokens_per_s_per_gpu" in d["excluded"]


def test_verdict_compares_a_mixture_of_experts_routing() -> None:
    """The routing (D82) is the training's: its expert load and balance loss take part; a router that parts
    while the loss still agrees is where the runs diverged."""
    loss = [3.0 - 0.1 * i for i in range(10)]
    load = [1.2] * 10
    routed = _curves(loss) | {"train/moe_expert_load": (list(range(1, 11)), load),
                              "train/moe_balance_loss": (list(range(1, 11)), [1.01] * 10)}
    other = dict(routed, **{"train/moe_expert_load": (list(range(1, 11)), load[:4] + [1.5] * 6)})
    assert verdict(routed, dict(routed)).kind == "bitwise"
    v = verdict(routed, other)
    assert {"train/moe_expert_load", "train/moe_balance_loss"} <= set(v.compared)
    assert v.kind == "diverged" and (v.divergence.metric, v.divergence.step) == ("train/moe_expert_load", 5)


def test_verdict_equivalent_reports_the_band_and_its_source() -> None:
    loss = [3.0 - 0.1 * i for i in range(10)]
    near = [x * (1 + 1e-4) for x in loss]
    v = verdict(_curves(loss), _curves(near), tolerances={"train/loss": 1e-3, "valid_loss": 1e-3},
                band_source="spec tolerances")
    assert v.kind == "equivalent"
    assert v.band_sources == {"train/loss": "spec tolerances", "valid/loss": "spec tolerances", "train/lr": "default"}
    assert v.first_difference is not None and v.first_difference.step == 1 and v.first_difference.within
    assert v.deviations["train/loss"].max_rel == pytest.approx(1e-4, rel=1e-6)
    assert "spec tolerances; default for train/lr" in v.describe()


def test_verdict_diverged_names_the_first_step_metric_and_both_values() -> None:
    loss = [3.0 - 0.1 * i for i in range(10)]
    off = list(loss)
    off[6] += 0.2  # step 7 leaves a 1% band (2.4 -> 2.6)
    off[8] += 0.5
    v = verdict(_curves(loss), _curves(off), tolerances={"train/loss": 0.01}, band_source="spec tolerances")
    assert v.kind == "diverged"
    assert (v.divergence.metric, v.divergence.step) == ("train/loss", 7)
    assert v.divergence.original == pytest.approx(2.4) and v.divergence.rerun == pytest.approx(2.6)
    assert "step 7" in v.describe() and "2.4" in v.describe()
    one_sided_nan = list(loss)
    one_sided_nan[2] = math.nan
    w = verdict(_curves(loss), _curves(one_sided_nan), tolerances={"train/loss": 10.0})
    assert (w.divergence.metric, w.divergence.step) == ("train/loss", 3)


def test_verdict_missing_steps_diverge_at_the_first_missing_step() -> None:
    loss = [3.0 - 0.1 * i for i in range(10)]
    short = {k: (s[:6], v[:6]) if k.startswith("train/") else (s, v) for k, (s, v) in _curves(loss).items()}
    v = verdict(_curves(loss), short)
    assert v.kind == "diverged" and v.divergence.step == 7 and v.divergence.rerun is None
    assert v.divergence.original == pytest.approx(2.4)
    no_valid = {k: c for k, c in _curves(loss).items() if k != "valid/loss"}
    w = verdict(_curves(loss), no_valid)
    assert (w.divergence.metric, w.divergence.step) == ("valid/loss", 5)


def test_seed_spread_band_separates_seed_noise_from_divergence() -> None:
    base = [3.0 - 0.1 * i for i in range(40)]
    seeds = [_curves([x + 0.02 * math.sin(i * 1.7 + k) for i, x in enumerate(base)]) for k in range(3)]
    bands = seed_spread_band(seeds)
    assert set(bands) == {"train/loss", "train/lr", "valid/loss"}
    assert max(bands["train/lr"].abs_curve.values) == 0.0  # the schedule must match exactly
    inside = [x + 0.01 for x in base]
    v = verdict(_curves(base), _curves(inside), tolerances=bands, band_source="seed spread")
    assert v.kind == "equivalent" and v.band_sources["train/loss"] == "seed spread"
    outside = list(base)
    outside[30] += 0.5
    w = verdict(_curves(base), _curves(outside), tolerances=bands, band_source="seed spread")
    assert w.kind == "diverged" and (w.divergence.metric, w.divergence.step) == ("train/loss", 31)
    assert Band(rel=0.01).width(5, 2.0) == pytest.approx(0.02)


# -- the page in a real browser ----------------------------------------------------------------------

def _png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG into rows of RGB bytes (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat.append(body)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), w * bpp
    m7, m8 = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")

    def add(x: int, y: int) -> int:  # bytewise (x + y) mod 256, all bytes at once
        return ((x & m7) + (y & m7)) ^ ((x ^ y) & m8)

    prev, rows = bytes(stride), []
    for y in range(h):
        ftype, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if ftype == 0:
            cur = line
        elif ftype in (1, 2):
            v = int.from_bytes(line, "big")
            if ftype == 2:
                v = add(v, int.from_bytes(prev, "big"))
            else:  # prefix sums over pixels, by doubling
                shift = 8 * bpp
                while shift < 8 * stride:
                    v = add(v, v >> shift)
                    shift *= 2
            cur = v.to_bytes(stride, "big")
        else:
            out = bytearray(line)
            for i in range(stride):
                left = out[i - bpp] if i >= bpp else 0
                up, ul = prev[i], (prev[i - bpp] if i >= bpp else 0)
                if ftype == 3:
                    out[i] = (out[i] + ((left + up) >> 1)) & 255
                else:
                    p = left + up - ul
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                    out[i] = (out[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 255
            cur = bytes(out)
        rows.append(cur if bpp == 3 else b"".join(cur[i:i + 3] for i in range(0, stride, 4)))
        prev = cur
    return w, h, rows


_GREY_RUN = re.compile(rb"[\x6e-\xc8]{900,}")  # 300+ pixels with every channel in 110..200


def _plot_frames(rows: list[bytes]) -> list[tuple[int, int, int, int]]:
    """Plot areas: rectangles whose top and bottom are long grey (#999) lines, as (x0, x1, top, bottom)."""
    lines = [(y, m.start() // 3, m.end() // 3) for y, row in enumerate(rows) for m in _GREY_RUN.finditer(row)]
    frames: list[tuple[int, int, int, int]] = []
    for y, x0, x1 in lines:  # pair each line with the nearest one well below it, at the same x
        if any(abs(x0 - f[0]) < 4 and f[2] <= y <= f[3] + 3 for f in frames):
            continue
        below = [y2 for y2, a, _ in lines if y2 - y > 100 and abs(a - x0) < 4]
        if below:
            frames.append((x0, x1, y, min(below)))
    return frames


def _count_colour(rows: list[bytes], frame: tuple[int, int, int, int], colour: tuple[int, int, int]) -> int:
    x0, x1, top, bottom = frame
    n = 0
    for row in rows[top + 3:bottom - 2]:
        part = row[3 * (x0 + 3):3 * (x1 - 2)]
        n += sum(1 for px in zip(part[0::3], part[1::3], part[2::3])
                 if abs(px[0] - colour[0]) + abs(px[1] - colour[1]) + abs(px[2] - colour[2]) < 60)
    return n


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed; install Debian's package: apt-get install -y chromium "
                    "(./dev test installs it)")
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'profile'}"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=120, check=True)


def test_html_in_headless_chromium(two_runs: tuple[RunData, RunData], tmp_path: Path) -> None:
    a, b = two_runs
    page = tmp_path / "compare.html"
    page.write_text(to_html(compare([b], a)), encoding="utf-8")
    url = page.as_uri()

    first = tmp_path / "first.png"  # what a laptop shows first; the same run prints the DOM
    dom = _chromium(["--dump-dom", f"--screenshot={first}", "--window-size=1366,900", url], tmp_path).stdout
    assert "aaaa1111bbbb" in dom and "cccc2222dddd" in dom
    assert len(re.findall(r'<path class="series" data-run="(?:aaaa1111bbbb|cccc2222dddd)" d="M', dom)) == 10
    w, h, rows = _png_rgb(first)
    assert (w, h) == (1366, 900) and first.stat().st_size > 20_000
    assert sum(1 for row in rows[:300] for x in range(0, 3 * w, 3) if row[x] < 100) > 500  # dark text at the top

    full = tmp_path / "full.png"  # tall enough to hold the charts
    _chromium([f"--screenshot={full}", "--window-size=1366,2800", url], tmp_path)
    w, h, rows = _png_rgb(full)
    frames = _plot_frames(rows)
    assert len(frames) == 5, frames  # train loss, validation loss, throughput, learning rate, gradient norm
    blue, orange = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # the first two series colours
    for i, frame in enumerate(frames):
        assert _count_colour(rows, frame, orange) > 20, frame
        if i != 3:  # both runs share one learning-rate schedule: the later line covers the first
            assert _count_colour(rows, frame, blue) > 20, frame


# A user's click, scripted: the page itself has no script; the control is radio buttons and CSS.
_CLICK_RAW = """<script>
const probe = () => ["smoothed", "raw"].map(g => {
  const s = getComputedStyle(document.querySelector("#chart-train_loss g." + g));
  return g + ":" + s.display + ":" + s.opacity;
}).join(",");
const before = probe();
document.querySelector("label[for=view-raw]").click();
const out = document.createElement("pre");
out.id = "probe";
out.textContent = before + "|" + probe() + "|" + document.getElementById("view-raw").checked;
document.body.append(out);
</script></body>"""


def test_smoothing_toggle_in_headless_chromium(two_runs: tuple[RunData, RunData], tmp_path: Path) -> None:
    a, b = two_runs
    html = to_html(compare([b], a))
    assert "<script" not in html and html.count("</body>") == 1
    toggle = re.search(r'<div class="toggle" id="loss-toggle">(.*?)</div>', html).group(1)
    assert "smoothed</label>" in toggle and "raw</label>" in toggle and "trailing mean over the last 1% of steps" in toggle
    loss = re.search(r'<svg class="chart" id="chart-train_loss".*?</svg>', html, re.S).group(0)
    assert len(re.findall(r'<path class="smooth" data-run=', loss)) == 2  # smoothed curves, beside the raw ones
    assert len(re.findall(r'<path class="series" data-run=', loss)) == 2
    page = tmp_path / "toggle.html"
    page.write_text(html.replace("</body>", _CLICK_RAW), encoding="utf-8")
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path).stdout
    before, after, checked = re.search(r'<pre id="probe">(.*?)</pre>', dom).group(1).split("|")
    # smoothed by default, raw curves faint behind; after the click on "raw": only the raw curves
    assert before == "smoothed:inline:1,raw:inline:0.22"
    assert after == "smoothed:none:1,raw:inline:1" and checked == "true"


def test_docs_state_every_metric_definition() -> None:
    from mcx.metrics.summary import definitions_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert definitions_table() in doc, "docs/metrics.md: paste mcx.metrics.summary.definitions_table() into it"


def test_throughput_is_total_work_over_total_time_and_noise_is_not_a_change() -> None:
    from mcx.metrics.summary import BY_KEY, spread

    steps = list(range(1, 101))
    times = [5.0] + [1.0, 2.0] * 49 + [1.0]  # warm-up step left out; then alternating 1 s and 2 s steps
    tps = [1000.0 / t for t in times]
    run = RunData(run_id="r", name="r", curves={"train/tokens_per_s_per_gpu": curve(steps, tps),
                                                "train/step_time_s": curve(steps, times)})
    s = summarize_run(run)
    assert s["step_time_s"] == pytest.approx(1.5, rel=0.01)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(1000.0 / s["step_time_s"])  # not the mean of the rates (750)
    assert spread(BY_KEY["step_time_s"], times) == pytest.approx(0.5 / 1.5, rel=0.01)
    faster = RunData(run_id="f", name="f", curves={"train/tokens_per_s_per_gpu": curve(steps, [t * 1.2 for t in tps])})
    cell = compare([faster], run).metrics[0].cells[1]
    assert cell.delta_rel == pytest.approx(0.2) and cell.within_noise and not cell.improved  # 20% inside a 33% spread
    steady = RunData(run_id="q", name="q", curves={"train/tokens_per_s_per_gpu": curve(steps, [1000.0] * 100)})
    quicker = RunData(run_id="k", name="k", curves={"train/tokens_per_s_per_gpu": curve(steps, [1020.0] * 100)})
    cell = compare([quicker], steady).metrics[0].cells[1]
    assert cell.improved and not cell.within_noise  # 2% with no step noise is a change


def test_table_titles_stay_on_one_line_on_a_pipe() -> None:
    """A title wider than its table (mcx gc --dry-run with nothing to remove) was wrapped to the table's width,
    a column of word fragments, although docs/cli.md says nothing is wrapped off a terminal."""
    from rich.text import Text

    from mcx.ops.gc import GcResult
    from mcx.report.gc_view import render_gc
    from mcx.report.plain import plain_text
    from mcx.report.titled import titled_table

    text = plain_text(render_gc(GcResult(True, (), (), 0, 0, 0), Path("/p")))
    assert "mcx gc: would remove 0 items (--dry-run: nothing was removed)\n" in text, text
    narrow = titled_table(Text("sweep s: running", style="bold") + " (random, 3 of 40 trials done; objective "
                          "valid_loss, minimize)", style="italic")
    narrow.add_column("n")
    narrow.add_row("1")
    assert plain_text(narrow).startswith("sweep s: running (random, 3 of 40 trials done; objective valid_loss, "
                                         "minimize)\n")


def test_batch_checks_name_the_lowest_step_then_micro_batch_then_rank():
    """mcx.metrics.batches.compare_batches over two stages' hashes (dp rank -> step -> digests)."""
    from mcx.metrics.batches import compare_batches

    a = {0: {1: ("a", "b"), 2: ("c", "d"), 3: ("e", "f")}, 1: {1: ("g", "h"), 2: ("i", "j"), 3: ("k", "l")}}
    same = compare_batches(a, {r: dict(s) for r, s in a.items()})
    assert same is not None and same.same and same.steps == 3 and same.describe() == \
        "same batches at every step (3 steps on each of 2 data-parallel ranks)"
    b = {0: {**a[0], 2: ("c", "x")}, 1: {**a[1], 2: ("y", "j")}}  # step 2: rank 0 at micro-batch 1, rank 1 at 0
    first = compare_batches(a, b).first
    assert (first.step, first.micro_batch, first.dp_rank, first.original, first.other) == (2, 0, 1, "i", "y")
    short = compare_batches(a, {0: {**a[0], 3: ("e",)}, 1: a[1]}).first  # a micro-batch missing on one side
    assert (short.step, short.micro_batch, short.other) == (3, 1, None)
    assert compare_batches(a, {0: {1: ("a", "b"), 2: ("c", "d")}, 1: {1: ("g", "h"), 2: ("i", "j")}}).steps == 2
    assert "1 and 2 data-parallel ranks" in compare_batches({0: a[0]}, a).describe()
    assert compare_batches({}, a) is None and compare_batches(a, {}) is None  # recorded before D69: nothing said
