"""[launch.container] (D67): the spec's checks, pyxis' srun line in the sbatch script, the image's content in
the environment fingerprint, and the quickstart trained in a Podman image built here (tests/container_image.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import make_e2e_project, mcx_inprocess, mcx_subprocess, missing
from test_e2e import FAST, SPEC

from mcx.errors import InputError, SpecError
from mcx.fingerprint.record import collect, run_id
from mcx.launch import Placement, render_sbatch
from mcx.spec import load_spec, spec_to_dict
from mcx.spec.schema import ContainerSpec, LaunchSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny.toml"
DIGEST = "sha256:" + "ab" * 32
PINNED = f"nvcr.io/nvidia/pytorch@{DIGEST}"
# The quickstart's full stage, shorter still than test_e2e's FAST: 6 steps, a checkpoint and evaluation at 3.
SHORT = ["--set", "train.train_iters=6", "--set", "train.eval_interval=3", "--set", "checkpoint.interval=3",
         "--set", "train.eval_iters=2"]


def problems(*overrides: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        load_spec(TINY, list(overrides))
    return dict(info.value.problems)


def image(value: str) -> str:
    return f"launch.container.image={json.dumps(value)}"


# -- the spec ---------------------------------------------------------------------------------------


def test_a_spec_without_a_container_records_and_hashes_as_before():
    spec = load_spec(TINY)
    assert spec.launch.container == ContainerSpec()
    assert "container" not in spec_to_dict(spec)["launch"]
    pinned = load_spec(TINY, [image(PINNED), "launch.kind=\"slurm\""])
    assert spec_to_dict(pinned)["launch"]["container"]["image"] == PINNED


@pytest.mark.parametrize(("overrides", "key", "fragment"), [
    (['launch.container.mounts=["/a:/b"]'], "launch.container.image", "is missing"),
    ([image("localhost/mcx:1"), 'launch.kind="slurm"'], "launch.container.image", "pin it (name@sha256:<digest>)"),
    ([image("/images/pytorch.sqsh")], "launch.container.image", "launch.kind = 'local' runs Podman"),
    ([image("/images/pytorch.sif"), 'launch.kind="slurm"'], "launch.container.image", "Apptainer image"),
    ([image("a b")], "launch.container.image", "is not an image reference"),
    ([image(PINNED), 'launch.container.mounts=["data:/data"]'], "launch.container.mounts[0]", "must be absolute"),
    ([image(PINNED), 'launch.container.mounts=["/a,b:/c"]'], "launch.container.mounts[0]", "separates mounts"),
    ([image(PINNED), 'launch.container.mounts=["/a:/b:rx"]'], "launch.container.mounts[0]", "HOST:CONTAINER:ro"),
    ([image(PINNED), 'launch.container.workdir="work"'], "launch.container.workdir", "absolute path"),
    ([image(PINNED), 'launch.container.env=["HF-TOKEN"]'], "launch.container.env[0]", "not an environment variable"),
])
def test_bad_container_tables_name_the_key_and_the_fix(overrides, key, fragment):
    found = problems(*overrides)
    assert key in found and fragment in found[key], found


# -- pyxis ------------------------------------------------------------------------------------------


def srun_words(script: str) -> list[str]:
    """The srun line of a script, as bash splits it (its trailing '&' dropped)."""
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return shlex.split(line.removesuffix(" &"))


def test_the_sbatch_script_starts_the_agents_in_the_image_through_pyxis(tmp_path: Path):
    project = tmp_path / "proj"
    stage = project / ".mcx" / "runs" / "3f9c0a12b4de" / "full"
    stage.mkdir(parents=True)
    (stage / "job.json").write_text(json.dumps({"data_dir": "/lustre/data", "checkpoint_dir": str(stage / "checkpoints"),
                                                "init": {"path": "/lustre/models/llama"}}))
    container = ContainerSpec(image=PINNED, mounts=("/lustre/cache:/cache:ro",), env=("HF_TOKEN",), python="python")
    script = render_sbatch(stage, Placement(world_size=16, nodes=2, device="cuda"),
                           LaunchSpec(kind="slurm", container=container), {"PYTHONHASHSEED": "0"},
                           python="/opt/venv/bin/python")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    words = srun_words(script)
    options = {w.split("=", 1)[0]: w.partition("=")[2] for w in words if w.startswith("--container")}
    # enroot's spelling of a registry host, the image pinned by its digest
    assert options["--container-image"] == f"nvcr.io#nvidia/pytorch@{DIGEST}"
    mounts = options["--container-mounts"].split(",")
    assert mounts[-1] == "/lustre/cache:/cache:ro"  # the spec's own, after the job's
    for path in (str(project), "/lustre/data", "/lustre/models/llama"):
        assert f"{path}:{path}" in mounts, mounts
    assert not any(m.startswith(f"{stage}:") for m in mounts)  # inside the project's mount already
    assert options["--container-workdir"] == str(stage)
    assert options["--container-env"].split(",") == ["HF_TOKEN", "OMP_NUM_THREADS", "PYTHONHASHSEED"]
    # the pyxis options belong to srun, before the agent, which is the image's interpreter
    agent = words.index("python")
    assert max(words.index(w) for w in words if w.startswith("--container")) < agent
    # ... first the node's hang watchdog (D66), in the image too, which starts the torchrun agent after "--"
    assert words[agent + 1:agent + 3] == ["-m", "mcx.launch.watch_node"]
    inner = words.index("--", agent)
    assert words[inner + 1:inner + 3] == ["python", "-c"] and "--nnodes" in words[inner:]
    assert "/opt/venv/bin/python" not in script


def test_a_squashfs_image_and_a_workdir_reach_the_srun_line(tmp_path: Path):
    stage = tmp_path / "run" / "smoke"
    stage.mkdir(parents=True)
    sqsh = "/lustre/images/pytorch$24.09.sqsh"  # a '$': quoted for bash, the path itself for srun
    script = render_sbatch(stage, Placement(world_size=1), LaunchSpec(
        kind="slurm", container=ContainerSpec(image=sqsh, workdir="/workspace")), {})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    words = srun_words(script)
    assert f"--container-image={sqsh}" in words and "--container-workdir=/workspace" in words


def test_render_sbatch_refuses_a_container_table_it_cannot_render(tmp_path: Path):
    with pytest.raises(InputError, match=r"launch.container.mounts\[0\]"):
        render_sbatch(tmp_path / "r" / "smoke", Placement(world_size=1), LaunchSpec(
            kind="slurm", container=ContainerSpec(image=PINNED, mounts=("/a:/b\n",))), {})


def test_the_podman_command_mounts_the_job_and_passes_only_the_workers_variables(tmp_path: Path):
    from mcx.launch.container import job_mounts, podman_argv

    stage = tmp_path / "proj" / ".mcx" / "runs" / "3f9c0a12b4de" / "smoke"
    stage.mkdir(parents=True)
    container = ContainerSpec(image=PINNED, python="/usr/bin/python3", env=("HF_TOKEN",),
                              mounts=("/scratch/cache:/cache:ro",))
    mounts = job_mounts(stage, container, {"PYTHONPATH": "/srv/rebuilt-tree"})
    argv = podman_argv(["/usr/bin/python3", "-m", "mcx.train", str(stage)], name="mcx-x", image=PINNED,
                       mounts=mounts, workdir=str(stage), env={"PYTHONHASHSEED": "0"}, passthrough=("HF_TOKEN",),
                       device="cuda")
    assert argv[:3] == ["podman", "run", "--rm"] and "--init" in argv and "--network=host" in argv
    volumes = [a.removeprefix("--volume=") for a in argv if a.startswith("--volume=")]
    assert f"{tmp_path / 'proj'}:{tmp_path / 'proj'}" in volumes  # the project, which holds the stage
    assert "/srv/rebuilt-tree:/srv/rebuilt-tree" in volumes  # a reproduction's tree on PYTHONPATH
    assert volumes[-1] == "/scratch/cache:/cache:ro"
    assert [a for a in argv if a.startswith("--env=")] == ["--env=PYTHONHASHSEED=0", "--env=HF_TOKEN"]
    assert "--device=nvidia.com/gpu=all" in argv  # a GPU placement, through CDI
    assert argv[argv.index(PINNED) + 1:] == ["/usr/bin/python3", "-m", "mcx.train", str(stage)]


# -- the fingerprint --------------------------------------------------------------------------------


def test_the_image_is_in_the_environment_and_another_image_is_another_run(tmp_path: Path):
    """A squashfs file by its content (kept by stat, as data hashes are), a pinned reference by its digest;
    `mcx explain` names the environment's image."""
    (tmp_path / ".mcx").mkdir()
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.sqsh").write_bytes(b"image a")
    (images / "b.sqsh").write_bytes(b"image b")

    def record(value: str | None):
        sets = ['launch.kind="slurm"'] + ([image(value)] if value else [])
        return collect(load_spec(TINY, sets), ROOT, probe_hardware=False, require_data=False,
                       state_root=tmp_path)

    host, a, b, pinned = record(None), record(str(images / "a.sqsh")), record(str(images / "b.sqsh")), record(PINNED)
    assert "container_image" not in host.environment.id
    assert a.environment.id["container_image"] == "sha256:" + hashlib.sha256(b"image a").hexdigest()
    assert a.environment.info["container_image_kind"] == "file"
    assert pinned.environment.id["container_image"] == DIGEST
    assert len({run_id(r) for r in (host, a, b, pinned)}) == 4
    assert a.config == host.config == pinned.config  # the image moves the environment only
    specs = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'extends = "{TINY}"\n[launch]\nkind = "slurm"\n[launch.container]\n'
                        f'image = "{images / (name + ".sqsh")}"\n')
        specs.append(str(path))
    res = mcx_inprocess(ROOT, "explain", *specs)
    assert res.code == 0, res
    assert "container_image" in res.out, res.out


def test_a_tag_no_runtime_here_resolves_is_bad_input(tmp_path: Path):
    res = mcx_inprocess(ROOT, "plan", str(TINY), "--set", image("localhost/mcx-no-such-image:latest"))
    assert res.code == 2, res
    assert "launch.container.image = 'localhost/mcx-no-such-image:latest'" in res.err
    assert "Traceback" not in res.err and res.out == ""


# -- Podman, for real -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman_image() -> str:
    if shutil.which("podman") is None:
        missing("podman is not installed (./dev test installs it)")
    from container_image import python_image

    return python_image()


def podman_id(tag: str) -> str:
    return subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_quickstart_trains_in_a_podman_image(tmp_path: Path, podman_image: str):
    """The full stage (the smoke stage is left out to keep CI short: it runs through the same launcher) in a
    container of the image, as Podman's own event log says, with exit 0; the image ID in the fingerprint and
    `mcx show`; the same spec in another image is another run, and explain says why."""
    from container_image import another_image

    project = make_e2e_project(tmp_path)
    res = mcx_subprocess(project, "run", SPEC, *FAST, *SHORT, "--skip-smoke", "--set", image(podman_image), "--json")
    assert res.code == 0, res
    rid = res.json()["run_id"]
    ident = podman_id(podman_image)
    record = json.loads((project / ".mcx" / "runs" / rid / "fingerprint.json").read_text())
    assert record["environment"]["id"]["container_image"] == f"sha256:{ident}"
    events = subprocess.run(["podman", "events", "--stream=false", "--filter", "event=died", "--format",
                             "{{.Name}} {{.Image}} {{.ContainerExitCode}}"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    died = {line.split()[0].rsplit("-", 1)[0]: line.split()[1:] for line in events if f"mcx-{rid}-" in line}
    assert died == {f"mcx-{rid}-full": [podman_image, "0"]}, events[-10:]  # Podman names the image by its tag
    shown = mcx_inprocess(project, "show", rid, "--json")
    assert shown.code == 0 and f"sha256:{ident}" in shown.out, shown

    other = another_image(podman_image, "other")
    specs = []
    for name, tag in (("ours", podman_image), ("other", other)):
        (project / f"{name}.toml").write_text(f'extends = "{SPEC}"\n[launch.container]\nimage = "{tag}"\n')
        specs.append(f"{name}.toml")
    explained = mcx_inprocess(project, "explain", *specs)
    assert explained.code == 0, explained
    assert explained.out.splitlines()[0].endswith(": environment differ"), explained.out  # and nothing else
    assert "container_image" in explained.out and podman_id(other)[:12] != ident[:12]
