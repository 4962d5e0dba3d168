"""Fingerprints and run IDs against real git repositories, a real DVC repository and real processes."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import pytest

import mcx
from rich.console import Console

from mcx.errors import DataError, InputError, RunIdError
from mcx.fingerprint import (
    collect,
    component_hashes,
    explain,
    explanation_to_dict,
    load_record,
    patch_bytes,
    record_from_dict,
    record_to_dict,
    run_id,
)
from mcx.fingerprint.code import collect_code, module_changes, worker_package
from mcx.fingerprint.config import NOT_HASHED, canonical_config
from mcx.fingerprint.data import collect_data
from mcx.fingerprint.environment import collect_environment, cuda_version
from mcx.fingerprint.diff import flatten
from mcx.fingerprint.filehashes import cache_path, load
from mcx.report.explain_view import render_explanation
from mcx.fingerprint.modules import dependencies, imported_names, module_files
from mcx.fingerprint.record import FingerprintRecord
from mcx.fingerprint.modules import dependencies, imported_names, module_files
from mcx.fingerprint.record import FingerprintRecord
from mcx.fingerprint.hardware import cpu_model, identity, parse_gpu_query, parse_topology, visible
from mcx.hashing import digest
from mcx.spec import load_spec
from mcx.spec.convert import field_types
from mcx.spec.schema import ExperimentSpec

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny.toml"
GIT_ID = ["-c", "user.name=mcx tests", "-c", "user.email=tests@mcx.invalid", "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def dvc(cwd: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, check=True, capture_output=True)


def make_repo(root: Path, files: dict[str, bytes], ignore: str = "data/\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text(ignore)
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


def write_dataset(root: Path) -> None:
    (root / "data" / "quickstart").mkdir(parents=True, exist_ok=True)
    (root / "data" / "quickstart" / "corpus.bin").write_bytes(bytes(range(256)) * 8)
    (root / "data" / "quickstart" / "corpus.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x01" * 23)
    (root / "data" / "other").mkdir(parents=True, exist_ok=True)
    (root / "data" / "other" / "notes.txt").write_text("another dataset in the same tracked directory\n")


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC project: `data/` tracked by data.dvc, the tiny spec, a lockfile, all committed."""
    root = tmp_path_factory.mktemp("project")
    make_repo(root, {"README.md": b"a project\n"}, ignore="")
    dvc(root, "init", "-q")
    write_dataset(root)
    dvc(root, "add", "-q", "data")
    shutil.copy(TINY, root / "tiny.toml")
    (root / "lockfiles").mkdir()
    (root / "lockfiles" / "cpu.txt").write_text("torch==2.11.0\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "data and spec")
    return root


@pytest.fixture
def project(dvc_project: Path, tmp_path: Path) -> Path:
    """A private copy of the DVC project (tests may change it)."""
    return Path(shutil.copytree(dvc_project, tmp_path / "copy", symlinks=True))


def spec_in(root: Path, *overrides: str) -> ExperimentSpec:
    return load_spec(root / "tiny.toml", list(overrides))


def dvc_record(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())["outs"][0]


# ---------------------------------------------------------------- code


def _mcx_copy(dest: Path) -> Path:
    """A tree holding a copy of the mcx package (as a reproduction's worktree of a project that holds mcx)."""
    shutil.copytree(Path(mcx.__file__).parent, dest / "mcx", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_code_id_is_the_content_of_the_modules_a_run_executes(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "r", {"train.py": b"print(1)\n"})
    code = collect_code(root)
    modules = code["id"]["modules"]
    assert set(code["id"]) == {"modules"}
    package = Path(mcx.__file__).parent
    # The worker's entry, the planner, the stage launcher and what they import; not the CLI or the reports.
    for rel in ["mcx/__init__.py", "mcx/train/__main__.py", "mcx/train/loop.py", "mcx/plan/planner.py",
                "mcx/ops/run.py", "mcx/ops/stage.py", "mcx/launch/env.py", "mcx/spec/schema.py"]:
        assert modules[rel] == hashlib.sha256((package.parent / rel).read_bytes()).hexdigest(), rel
    for rel in ["mcx/cli/main.py", "mcx/report/htmlpage.py", "mcx/interop/importer.py", "mcx/ops/compare.py"]:
        assert (package.parent / rel).is_file() and rel not in modules, rel
    info = code["info"]
    assert info["commit"] == git(root, "rev-parse", "HEAD").strip() and info["branch"] == "main"
    assert info["dirty"] is False and info["changes"] == {} and info["mcx_root"] == str(package.resolve())
    assert code["patch"] is None and code["warnings"] == []


def test_commits_untracked_and_ignored_files_are_provenance_not_identity(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "r", {"train.py": b"print(1)\n", "gone.py": b"old\n"}, ignore="data/\n*.log\n")
    clean = collect_code(root)
    (root / "experiments").mkdir()
    (root / "experiments" / "x.toml").touch()  # an empty untracked file
    (root / "train.py").write_bytes(b"print(2)\n")
    (root / "gone.py").unlink()
    (root / "run.log").write_text("ignored\n")
    (root / ".mcx" / "checkpoints" / "0123456789ab").mkdir(parents=True)  # mcx's own state never counts
    (root / ".mcx" / "checkpoints" / "0123456789ab" / "full.dvc").write_text("outs: []\n")
    dirty = collect_code(root)
    assert dirty["id"] == clean["id"]
    assert dirty["info"]["dirty"] is True and dirty["info"]["commit"] == clean["info"]["commit"]
    assert dirty["info"]["changes"] == {"experiments/x.toml": "untracked", "gone.py": "deleted",
                                        "train.py": "modified"}
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "everything")
    git(root, "checkout", "-q", "-b", "topic")
    committed = collect_code(root)
    assert committed["id"] == clean["id"]
    assert committed["info"]["commit"] != clean["info"]["commit"] and committed["info"]["branch"] == "topic"
    assert committed["info"]["dirty"] is False


def test_editing_a_module_a_run_executes_changes_the_id_and_explain_names_it(tmp_path: Path) -> None:
    tree = _mcx_copy(make_repo(tmp_path / "r", {"README.md": b"x\n"}))
    assert worker_package(tree) == (tree / "mcx").resolve() and worker_package(None) == Path(mcx.__file__).resolve().parent
    base = collect_code(tree, code_path=tree)
    assert base["id"] == collect_code(tree)["id"]  # the copy holds the same bytes as the installed mcx
    (tree / "mcx" / "report" / "htmlpage.py").write_text("# a report is not training\n", encoding="utf-8")
    assert collect_code(tree, code_path=tree)["id"] == base["id"]
    loop = tree / "mcx" / "train" / "loop.py"
    loop.write_text(loop.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    (tree / "mcx" / "train" / "extra.py").write_text("X = 1\n", encoding="utf-8")  # not imported: not run
    (tree / "mcx" / "train" / "cpu.py").write_text((tree / "mcx" / "train" / "cpu.py").read_text(encoding="utf-8")
                                                   + "\nfrom mcx.train import extra  # noqa\n", encoding="utf-8")
    edited = collect_code(tree, code_path=tree)
    assert module_changes(base["id"], edited["id"]) == ["mcx/train/cpu.py", "mcx/train/extra.py (added)",
                                                        "mcx/train/loop.py"]
    spec = load_spec(TINY)
    a = FingerprintRecord(code=base, **_other_components(spec, tree))
    b = FingerprintRecord(code=edited, **_other_components(spec, tree))
    expl = explain(a, b)
    assert [d.component for d in expl.components] == ["code"]
    assert [(c.key, c.kind) for c in expl.components[0].changes] == [
        ("modules.mcx/train/cpu.py", "changed"), ("modules.mcx/train/extra.py", "added"),
        ("modules.mcx/train/loop.py", "changed")]


def _other_components(spec: ExperimentSpec, root: Path) -> dict:
    """Fixed components beside a code component under test (only their ``id`` and ``info`` are read)."""
    return {name: {"id": {"name": name}, "info": {}} for name in ("environment", "config", "data", "hardware")}


def test_the_import_scanner_finds_exactly_what_ast_finds() -> None:
    files = module_files(Path(mcx.__file__).parent)
    for name, path in files.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                src = node.module or ""
                if node.level:
                    parts = base.split(".")
                    src = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                targets |= {src, *(f"{src}.{a.name}" for a in node.names)}
        expected = set()
        for target in targets:
            while target:
                if target in files:
                    expected.add(target)
                target = target.rpartition(".")[0]
        assert dependencies(name, files) == expected - {name}, name
    # Relative imports, parenthesized lists, aliases and comments, as a fork of mcx might write them.
    source = "from . import a, b as c  # x\nfrom ..up import (\n    d,\n    e as f,\n)\nimport p.q as r, s\n"
    assert imported_names(source, "pkg.sub.mod", is_package=False) == {
        "pkg.sub", "pkg.sub.a", "pkg.sub.b", "pkg.up", "pkg.up.d", "pkg.up.e", "p.q", "s"}


def test_diff_hash_ignores_users_diff_settings(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "r", {"a.py": b"".join(b"line %d\n" % i for i in range(50))})
    (root / "a.py").write_bytes(b"".join(b"line %d\n" % (i * 7 % 50) for i in range(50)))
    before = collect_code(root)
    git(root, "config", "diff.algorithm", "histogram")
    git(root, "config", "diff.noprefix", "true")
    git(root, "config", "diff.context", "9")
    after = collect_code(root)
    assert after["id"] == before["id"]
    assert after["patch"] == before["patch"]


def test_patch_restores_the_working_tree(tmp_path: Path) -> None:
    """The recorded patch (through fingerprint.json) turns a clean checkout into the dirty tree."""
    files = {"train.py": b"lr = 1\n", "weights.bin": bytes(range(256)), "latin1.txt": b"caf\xe9\n",
             "gone.py": b"old\n"}
    root = make_repo(tmp_path / "r", files)
    (root / "train.py").write_bytes(b"lr = 2\n")
    (root / "weights.bin").write_bytes(bytes(reversed(range(256))))
    (root / "latin1.txt").write_bytes(b"na\xefve\n")  # not UTF-8: the patch is kept as base64
    (root / "gone.py").unlink()
    (root / "new_module.py").write_bytes(b"def f():\n    return 3\n")
    (root / "blob.npy").write_bytes(b"\x93NUMPY\x00\x01" + bytes(100))
    shutil.copy(TINY, root / "tiny.toml")
    write_dataset(root)

    rec = collect(load_spec(root / "tiny.toml"), root, probe_hardware=False)
    assert rec.side["patch_encoding"] == "base64"
    back = record_from_dict(json.loads(json.dumps(record_to_dict(rec))))
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    subprocess.run(["git", "apply", "--binary", "-"], cwd=clone, input=patch_bytes(back), check=True)
    for rel in ["train.py", "weights.bin", "latin1.txt", "new_module.py", "blob.npy", "tiny.toml"]:
        assert (clone / rel).read_bytes() == (root / rel).read_bytes(), rel
    assert not (clone / "gone.py").exists()


def test_outside_git_the_modules_are_still_hashed_with_a_warning(tmp_path: Path) -> None:
    code = collect_code(tmp_path)
    assert code["info"]["commit"] is None and code["info"]["dirty"] is None
    assert code["id"] == collect_code(make_repo(tmp_path / "r", {"a.py": b"1\n"}))["id"]
    assert any("not a git checkout" in w for w in code["warnings"])


# ---------------------------------------------------------------- data (real DVC)


def test_dvc_hash_of_a_path_inside_a_tracked_directory(dvc_project: Path) -> None:
    out = dvc_record(dvc_project / "data.dvc")
    data = collect_data(spec_in(dvc_project), dvc_project)
    ds = data["id"]["dataset"]
    assert ds == {"source": "dvc", "hash": "md5", "value": out["md5"], "subpath": "quickstart"}
    assert "quickstart" in data["info"]["dataset"]["note"]
    assert data["warnings"] == []
    # The value is DVC's own object: the .dir listing in the cache hashes to it and lists our files.
    listing = dvc_project / ".dvc" / "cache" / "files" / "md5" / ds["value"][:2] / ds["value"][2:]
    assert hashlib.md5(listing.read_bytes()).hexdigest() + ".dir" == ds["value"]
    entries = {e["relpath"]: e["md5"] for e in json.loads(listing.read_text())}
    corpus = dvc_project / "data" / "quickstart" / "corpus.bin"
    assert entries["quickstart/corpus.bin"] == hashlib.md5(corpus.read_bytes()).hexdigest()


def test_dvc_file_of_the_path_itself_wins(project: Path) -> None:
    tok = project / "tokenizer.json"
    tok.write_text('{"model": {"type": "BPE"}}\n')
    dvc(project, "add", "-q", "tokenizer.json")
    spec = spec_in(project, 'data.tokenizer.path="tokenizer.json"')
    data = collect_data(spec, project)
    assert data["id"]["tokenizer"] == {"source": "dvc", "hash": "md5",
                                       "value": hashlib.md5(tok.read_bytes()).hexdigest(), "subpath": None}
    assert data["id"]["tokenizer"]["value"] == dvc_record(project / "tokenizer.json.dvc")["md5"]


def test_dvc_lock_stage_output(project: Path) -> None:
    (project / "dvc.yaml").write_text(textwrap.dedent("""\
        stages:
          prepare:
            wdir: work
            cmd: PYTHON -c "import pathlib; p = pathlib.Path('prepared'); p.mkdir(); (p / 'x.bin').write_bytes(b'1')"
            outs:
              - prepared
        """).replace("PYTHON", sys.executable))
    (project / "work").mkdir()
    dvc(project, "repro", "-q")
    spec = spec_in(project, 'data.path="work/prepared"')
    data = collect_data(spec, project)
    lock_out = __import__("yaml").safe_load((project / "dvc.lock").read_text())["stages"]["prepare"]["outs"][0]
    assert data["id"]["dataset"] == {"source": "dvc", "hash": "md5", "value": lock_out["md5"], "subpath": None}
    assert data["info"]["dataset"]["stage"] == "prepare"


def test_modified_tracked_data_is_refused(project: Path) -> None:
    with (project / "data" / "quickstart" / "corpus.bin").open("ab") as f:
        f.write(b"more")
    with pytest.raises(DataError, match="changed since DVC recorded it") as exc:
        collect_data(spec_in(project), project)
    assert "dvc add" in exc.value.hint and "dvc checkout" in exc.value.hint


def test_missing_data_names_the_key_and_the_fix(project: Path) -> None:
    present = run_id(collect(spec_in(project), project))
    shutil.rmtree(project / "data")
    not_pulled = collect(spec_in(project), project, require_data=False)  # planning on a fresh clone
    assert run_id(not_pulled) == present
    assert any("dvc pull" in w for w in not_pulled.warnings)
    with pytest.raises(DataError) as exc:
        collect(spec_in(project), project)
    assert "data.path = 'data/quickstart'" in exc.value.message and "dvc pull" in exc.value.hint
    with pytest.raises(DataError) as exc:
        collect_data(spec_in(project, 'data.path="nowhere"'), project)
    assert "data.path = 'nowhere'" in exc.value.message and "mcx data prepare" in exc.value.hint
    assert exc.value.exit_code == 2


def test_untracked_data_is_hashed_by_content_with_a_warning(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    spec = load_spec(TINY)
    first = collect_data(spec, tmp_path)
    assert first["id"]["dataset"]["source"] == "sha256"
    assert any("not tracked by DVC" in w for w in first["warnings"])
    assert collect_data(spec, tmp_path)["id"] == first["id"]
    (tmp_path / "data" / "quickstart" / "corpus.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x02" * 23)
    assert collect_data(spec, tmp_path)["id"] != first["id"]


# ---------------------------------------------------------------- data: content, and the hashes kept by stat


def age(root: Path, seconds: int = 60) -> None:
    """Every file under ``root`` as if last written ``seconds`` ago (hashes of newer files are not kept)."""
    past = time.time_ns() - seconds * 10**9
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(past, past))


def flip(path: Path, offset: int = 1000, n: int = 64) -> bytes:
    """Overwrite ``n`` bytes in place (same size, same inode) with their complement; returns the old bytes."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))
    return old


def forge(path: Path) -> None:
    """A change a stat cannot see: bytes overwritten in place, then inode, size and mtime as before."""
    st = os.stat(path)
    flip(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def kept(project: Path) -> dict:
    return load(cache_path(project))


def test_same_size_edit_of_tracked_data_is_refused_naming_the_files(project: Path) -> None:
    (project / ".mcx").mkdir()
    age(project / "data")
    clean = collect_data(spec_in(project), project)
    flip(project / "data" / "quickstart" / "corpus.bin")  # 64 bytes, size unchanged
    (project / "data" / "quickstart" / "extra.bin").write_bytes(b"x")
    (project / "data" / "other" / "notes.txt").unlink()
    with pytest.raises(DataError, match="changed since DVC recorded it in data.dvc") as exc:
        collect_data(spec_in(project), project)
    # Named from the record's .dir listing in DVC's cache.
    assert ("changed: data/quickstart/corpus.bin; added: data/quickstart/extra.bin; removed: data/other/notes.txt"
            in exc.value.message)
    assert "`dvc add data`" in exc.value.hint and "`dvc checkout --force data.dvc`" in exc.value.hint
    assert exc.value.exit_code == 2
    assert clean["info"]["dataset"]["verified"] == "content matches the DVC record"
    dvc(project, "checkout", "-q", "--force", "data.dvc")  # the advice, as given, restores the recorded data
    assert collect_data(spec_in(project), project)["id"]["dataset"] == clean["id"]["dataset"]


def test_without_dvcs_listing_the_kept_hashes_name_the_changed_file(project: Path) -> None:
    shutil.rmtree(project / ".dvc" / "cache")
    corpus = project / "data" / "quickstart" / "corpus.bin"
    old = flip(corpus)  # nothing kept yet: named as the file written after data.dvc was
    with pytest.raises(DataError, match=r"it hashes to \w+\.dir, DVC recorded \w+\.dir; modified after data.dvc "
                                        r"was written: data/quickstart/corpus.bin\)"):
        collect_data(spec_in(project), project)
    age(project / "data")  # no later file either: unknown, and the command that brings the listing
    with pytest.raises(DataError, match=r"which files differ is unknown here, as DVC's cache holds no listing of "
                                        r"\w+\.dir \(`dvc fetch data.dvc` brings it\)"):
        collect_data(spec_in(project), project)
    assert flip(corpus) != old and corpus.read_bytes()[1000:1064] == old  # the recorded bytes again
    (project / ".mcx").mkdir()
    age(project / "data")
    collect_data(spec_in(project), project)  # keeps every file's md5
    flip(corpus)
    with pytest.raises(DataError, match="changed since mcx last hashed them: data/quickstart/corpus.bin"):
        collect_data(spec_in(project), project)


def test_unchanged_data_is_not_read_and_a_full_rehash_sees_what_stat_cannot(project: Path) -> None:
    (project / ".mcx").mkdir()
    age(project / "data")
    first = collect_data(spec_in(project), project)
    assert first["info"]["dataset"]["content"] == {"files": 3, "read": 3, "bytes_read": 2048 + 32 + 46,
                                                   "kept_hashes": "used"}
    assert set(kept(project)) == {str(p) for p in (project / "data").rglob("*") if p.is_file()}
    again = collect_data(spec_in(project), project)
    assert again["id"] == first["id"]
    assert again["info"]["dataset"]["content"] == {"files": 3, "read": 0, "bytes_read": 0, "kept_hashes": "used"}
    # The proof that nothing was read: bytes changed behind an unchanged (inode, mtime, size) go unseen.
    forge(project / "data" / "quickstart" / "corpus.bin")
    blind = collect_data(spec_in(project), project)
    assert blind["id"] == first["id"] and blind["info"]["dataset"]["content"]["read"] == 0
    with pytest.raises(DataError, match="changed: data/quickstart/corpus.bin"):  # what --verify-data asks for
        collect_data(spec_in(project), project, rehash=True)
    with pytest.raises(DataError, match="changed: data/quickstart/corpus.bin"):  # the full re-hash was kept
        collect_data(spec_in(project), project)


def test_a_file_written_within_the_racy_window_is_not_kept(project: Path) -> None:
    """Its mtime could be reused by a second write in the same timestamp tick (git's racy-clean rule)."""
    (project / ".mcx").mkdir()
    age(project / "data")
    corpus = project / "data" / "quickstart" / "corpus.bin"
    os.utime(corpus)  # modified just now (content unchanged)
    collect_data(spec_in(project), project)
    assert str(corpus) not in kept(project) and str(project / "data" / "other" / "notes.txt") in kept(project)
    forge(corpus)  # a second write in the same tick: same inode, mtime, size
    with pytest.raises(DataError, match="changed: data/quickstart/corpus.bin"):
        collect_data(spec_in(project), project)


def test_dvcignore_patterns_are_applied_or_make_a_difference_a_warning(project: Path) -> None:
    (project / ".dvcignore").write_text("# scratch files\n*.tmp\nscratch/\n")
    (project / "data" / "quickstart" / "run.tmp").write_bytes(b"ignored by DVC")
    (project / "data" / "scratch").mkdir()
    (project / "data" / "scratch" / "x.bin").write_bytes(b"ignored too")
    assert collect_data(spec_in(project), project)["info"]["dataset"]["verified"] == "content matches the DVC record"
    (project / "data" / "quickstart" / "keep.bin").write_bytes(b"not ignored")
    with pytest.raises(DataError, match=r"\(added: data/quickstart/keep\.bin\)"):
        collect_data(spec_in(project), project)
    (project / ".dvcignore").write_text("*.tmp\n!keep.bin\n")  # negation: DVC's own matcher decides
    data = collect_data(spec_in(project), project)
    assert data["info"]["dataset"]["verified"] == "not verified (.dvcignore)"
    assert any("`dvc status`" in w and ".dvcignore" in w for w in data["warnings"])


@pytest.mark.parametrize("content", ["{not json", '{"format": "something else", "version": 1, "files": {}}',
                                     "malformed-entry"])
def test_a_corrupt_or_foreign_hash_file_is_ignored_and_rebuilt(project: Path, content: str) -> None:
    (project / ".mcx").mkdir()
    age(project / "data")
    corpus = project / "data" / "quickstart" / "corpus.bin"
    st = corpus.stat()
    wrong = {str(corpus): [st.st_ino, st.st_mtime_ns, st.st_size, {"md5": "0" * 32}]}  # would refuse if trusted
    if content == "malformed-entry":
        wrong[str(project / "data" / "other" / "notes.txt")] = [1, 2, 3, {"md5": "not hex"}]
        content = json.dumps({"format": "mcx file hashes", "version": 1, "files": wrong})
    elif content.startswith("{\"format"):
        content = json.dumps({**json.loads(content), "files": wrong})
    cache_path(project).write_text(content)
    data = collect_data(spec_in(project), project)
    assert data["info"]["dataset"]["content"]["read"] == 3
    assert kept(project)[str(corpus)][3]["md5"] == hashlib.md5(corpus.read_bytes()).hexdigest()


def test_untracked_data_edited_in_place_changes_the_id_reading_only_that_file(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    (tmp_path / ".mcx").mkdir()
    age(tmp_path / "data")
    spec = load_spec(TINY)
    first = collect_data(spec, tmp_path)
    assert collect_data(spec, tmp_path)["info"]["dataset"]["content"]["read"] == 0
    flip(tmp_path / "data" / "quickstart" / "corpus.bin")
    edited = collect_data(spec, tmp_path)
    assert edited["id"]["dataset"]["source"] == "sha256" and edited["id"] != first["id"]
    assert edited["info"]["dataset"]["content"] == {"files": 2, "read": 1, "bytes_read": 2048, "kept_hashes": "used"}


def test_mcx_run_refuses_an_in_place_edit_before_training_and_plan_agrees(tmp_path: Path) -> None:
    """The issue's case, as a user meets it: 64 bytes of the quickstart's .bin overwritten in place."""
    from conftest import make_e2e_project, mcx_subprocess

    project = make_e2e_project(tmp_path / "project")
    (project / ".mcx").mkdir()  # as a first run leaves it
    age(project / "data")
    planned = mcx_subprocess(project, "plan", "experiments/tiny.toml", "--json")
    assert planned.code == 0, planned
    run_id_before = planned.json()["run_id"]
    old = flip(project / "data" / "quickstart" / "corpus.bin")
    for verb in (["run"], ["plan"]):
        res = mcx_subprocess(project, *verb, "experiments/tiny.toml", "--json")
        assert res.code == 2, res
        assert "changed since DVC recorded it in data.dvc" in res.err and "data/quickstart/corpus.bin" in res.err
        assert "`dvc add data`" in res.err and "`dvc checkout --force data.dvc`" in res.err and "Traceback" not in res.err
    assert sorted(p.name for p in (project / ".mcx").iterdir()) == ["file-hashes.json"]  # nothing trained
    flip(project / "data" / "quickstart" / "corpus.bin")
    assert (project / "data" / "quickstart" / "corpus.bin").read_bytes()[1000:1064] == old
    again = mcx_subprocess(project, "plan", "experiments/tiny.toml", "--json")
    assert again.code == 0 and again.json()["run_id"] == run_id_before, again


def test_verify_data_reads_what_the_kept_hashes_cannot_see(tmp_path: Path) -> None:
    from conftest import make_e2e_project, mcx_subprocess

    project = make_e2e_project(tmp_path / "project")
    (project / ".mcx").mkdir()
    age(project / "data")
    assert mcx_subprocess(project, "plan", "experiments/tiny.toml", "--json").code == 0
    forge(project / "data" / "quickstart" / "corpus.bin")
    assert mcx_subprocess(project, "run", "experiments/tiny.toml", "--dry-run").code == 0  # a stat sees nothing
    res = mcx_subprocess(project, "run", "experiments/tiny.toml", "--dry-run", "--verify-data")
    assert res.code == 2 and "data/quickstart/corpus.bin" in res.err, res
    assert mcx_subprocess(project, "plan", "experiments/tiny.toml").code == 2  # the re-hash was kept


# ---------------------------------------------------------------- run IDs

ID_SCRIPT = """
import sys
from pathlib import Path
from mcx.fingerprint import collect, run_id
from mcx.spec import load_spec
from mcx.spec.convert import field_types
root = Path(sys.argv[1])
print(run_id(collect(load_spec(root / "tiny.toml"), root)))
"""


def test_same_inputs_same_id_in_separate_processes(dvc_project: Path) -> None:
    ids = [subprocess.run([sys.executable, "-c", ID_SCRIPT, str(dvc_project)], check=True, capture_output=True,
                          text=True, cwd=REPO).stdout.strip() for _ in range(2)]
    here = run_id(collect(spec_in(dvc_project), dvc_project))
    assert ids == [here, here]
    assert len(here) == 12 and int(here, 16) >= 0


def test_what_changes_the_id_and_what_does_not(dvc_project: Path) -> None:
    base = run_id(collect(spec_in(dvc_project), dvc_project))
    assert run_id(collect(spec_in(dvc_project, "train.lr=1e-3"), dvc_project)) != base
    for override in ['name="renamed"', 'tracking.uri="http://mlflow.invalid:5000"', 'launch.kind="torchrun"',
                     'description="other words"', "checkpoint.keep=5", "budget.max_gpu_hours=99.0"]:
        assert run_id(collect(spec_in(dvc_project, override), dvc_project)) == base, override


def test_slurm_launch_is_identified_by_the_declared_hardware(dvc_project: Path) -> None:
    local = collect(spec_in(dvc_project, 'hardware.gpu="H100"'), dvc_project, probe_hardware=False)
    slurm = collect(spec_in(dvc_project, 'hardware.gpu="H100"', 'launch.kind="slurm"'), dvc_project)
    assert slurm.hardware.id == {"probed": False, "device": "cuda", "gpu": "H100", "nodes": 1,
                                    "gpus_per_node": 1}
    assert run_id(slurm) == run_id(local)


def test_project_files_do_not_change_the_id(project: Path) -> None:
    before = collect(spec_in(project), project)
    (project / "README.md").write_text("a project, edited\n")
    (project / "experiments").mkdir()
    (project / "experiments" / "x.toml").touch()
    after = collect(spec_in(project), project)
    assert run_id(after) == run_id(before) and explain(before, after).same
    assert after.code.dirty is True and "README.md" in after.side["patch"]


def test_every_not_hashed_key_is_a_spec_field() -> None:
    for dotted in NOT_HASHED:
        cls = ExperimentSpec
        for part in dotted.split("."):
            by_key = {} if cls is None else {a.metadata.get("key", a.name): a.name for a in attrs.fields(cls)}
            assert part in by_key, dotted  # a TOML key ([init] from is the field `source`)
            typ = field_types(cls)[by_key[part]]
            cls = typ if isinstance(typ, type) and attrs.has(typ) else None
    flat = flatten(canonical_config(load_spec(TINY)))
    assert not any(k == key or k.startswith(key + ".") for key in NOT_HASHED for k in flat)
    assert "train.lr" in flat and "data.prefix" in flat and "hardware.gpus_per_node" in flat


def test_a_debug_table_is_hashed_and_an_absent_one_leaves_the_config_as_it_was(tmp_path: Path) -> None:
    """Fault injection changes what a run computes: its [debug] keys are in the config hash. A spec
    without the table, or with an empty one, hashes exactly as before the table existed (no key)."""
    plain = canonical_config(load_spec(TINY))
    empty = tmp_path / "empty.toml"
    empty.write_text(TINY.read_text() + "\n[debug]\n")
    assert "debug" not in plain and canonical_config(load_spec(empty)) == plain
    assert digest(canonical_config(load_spec(empty))) == digest(plain)
    perturbed = canonical_config(load_spec(TINY, ["debug.perturb_params={step=5}"]))
    poisoned = canonical_config(load_spec(TINY, ["debug.nan_params_at_step=5"]))
    assert {k: v for k, v in perturbed.items() if k != "debug"} == plain
    assert perturbed["debug"] == {"perturb_params": {"step": 5, "amount": 0.01}, "nan_params_at_step": None}
    swapped = canonical_config(load_spec(TINY, ["debug.swap_micro_batches_at_step=5"]))
    assert swapped["debug"] == {"perturb_params": None, "nan_params_at_step": None, "swap_micro_batches_at_step": 5}
    assert len({digest(plain), digest(perturbed), digest(poisoned), digest(swapped)}) == 4


# ---------------------------------------------------------------- explain and stored records


def test_explain_lists_exactly_the_changed_keys(dvc_project: Path) -> None:
    a = collect(spec_in(dvc_project), dvc_project)
    b = collect(spec_in(dvc_project, "train.lr=1e-3", "model.num_layers=6", 'name="other"'), dvc_project)
    expl = explain(a, b)
    assert [d.component for d in expl.components] == ["config"]
    assert [(c.key, c.a, c.b) for c in expl.components[0].changes] == [("model.num_layers", 4, 6),
                                                                      ("train.lr", 0.003, 0.001)]
    as_json = explanation_to_dict(expl)
    assert as_json["same"] is False and as_json["run_a"] == run_id(a) and as_json["run_b"] == run_id(b)
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render_explanation(expl))
    text = console.file.getvalue()
    assert "train.lr" in text and "0.003" in text and "model.num_layers" in text and "name" not in text
    assert explain(a, a).same


def test_stored_record_round_trip_and_lookup(dvc_project: Path, tmp_path: Path) -> None:
    rec = collect(spec_in(dvc_project), dvc_project)
    rid = run_id(rec)
    run_dir = tmp_path / ".mcx" / "runs" / rid
    run_dir.mkdir(parents=True)
    (run_dir / "fingerprint.json").write_text(json.dumps(record_to_dict(rec)))
    loaded = load_record(tmp_path, rid)
    assert loaded == rec and component_hashes(loaded) == component_hashes(rec)

    other = tmp_path / ".mcx" / "runs" / "0123456789ab"  # a valid record under another run's name
    other.mkdir()
    shutil.copy(run_dir / "fingerprint.json", other / "fingerprint.json")
    with pytest.raises(InputError, match=f"hashes to run ID {rid}, not 0123456789ab"):
        load_record(tmp_path, "0123456789ab")

    tampered = record_to_dict(rec)
    tampered["config"]["id"]["train"]["lr"] = 1.0
    (run_dir / "fingerprint.json").write_text(json.dumps(tampered))
    with pytest.raises(InputError, match="hashes to"):
        load_record(tmp_path, rid)


@pytest.mark.parametrize("bad", ["../etc", "abc;rm -rf", "ABCDEF012345", "0123456789a", "0123456789abc",
                                 "0123456789a/", "../../.mcx/r", ""])
def test_malformed_run_ids_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(RunIdError, match="is not a run ID") as exc:
        load_record(tmp_path, bad)
    assert "12 lowercase hex" in exc.value.hint


def test_unknown_run_id(tmp_path: Path) -> None:
    with pytest.raises(RunIdError, match="unknown run ID 0123456789ab") as exc:
        load_record(tmp_path, "0123456789ab")
    assert "mcx ls" in exc.value.hint and exc.value.exit_code == 2


# ---------------------------------------------------------------- environment


def test_environment_reads_metadata_and_the_lockfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lockfiles").mkdir()
    (tmp_path / "lockfiles" / "cuda13.txt").write_bytes(b"torch==2.11.0\nmegatron-core==0.19.2\n")
    env = collect_environment(tmp_path, "cuda13")
    assert env["id"]["lockfile_sha256"] == hashlib.sha256(b"torch==2.11.0\nmegatron-core==0.19.2\n").hexdigest()
    assert env["info"]["lockfile"] == "cuda13" and env["info"]["lockfile_source"] == "argument"
    from importlib.metadata import version

    assert env["id"]["torch"] == version("torch") and env["id"]["megatron_core"] == version("megatron-core")
    assert env["id"]["python"] == ".".join(map(str, sys.version_info[:3]))

    monkeypatch.setenv("MCX_LOCKFILE", "cuda13")
    assert collect_environment(tmp_path)["info"]["lockfile_source"] == "$MCX_LOCKFILE"
    monkeypatch.setenv("MCX_LOCKFILE", "rocm")
    missing = collect_environment(tmp_path)
    assert missing["id"]["lockfile_sha256"] is None and "not found" in missing["warnings"][0]
    with pytest.raises(InputError, match="does not exist"):
        collect_environment(tmp_path, "rocm")
    with pytest.raises(InputError, match="not a lockfile name"):
        collect_environment(tmp_path, "../cpu")


def test_cuda_version_from_torch_local_tag() -> None:
    assert cuda_version("2.11.0+cu130")[0] == "13.0"
    assert cuda_version("2.7.1+cu128")[0] == "12.8"
    assert cuda_version("2.3.0+cu118")[0] == "11.8"
    assert cuda_version("2.11.0+cpu")[0] is None


def test_control_plane_imports_stay_light() -> None:
    code = ("import sys, mcx.fingerprint, mcx.fingerprint.diff; "
            "print(sorted(m for m in ('torch', 'megatron', 'mlflow', 'dvc', 'rich', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- hardware

# Captured from a 2 x H200 host (nvidia-smi 580.159.04), UUIDs shortened; the header really is underlined.
H200_QUERY = """\
0, GPU-070e6e8c-4e8d-867b-710e-87385ac4b91f, NVIDIA H200, 580.159.04, 143771
1, GPU-e38e8d4b-ce40-6707-d71f-184c50a89e9e, NVIDIA H200, 580.159.04, 143771
"""
H200_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\n"
    "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
PCIE_TOPO = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tSYS\tPHB\t0-15\t0\n"
    "GPU1\tSYS\t X \tSYS\t16-31\t1\n"
    "NIC0\tPHB\tSYS\t X \n"
)


def test_nvidia_smi_parsing() -> None:
    gpus = parse_gpu_query(H200_QUERY)
    assert [(g["index"], g["name"], g["driver"], g["memory_mib"]) for g in gpus] == [
        (0, "NVIDIA H200", "580.159.04", 143771), (1, "NVIDIA H200", "580.159.04", 143771)]
    assert parse_topology(H200_TOPO, [0, 1]) == "nvlink"
    assert parse_topology(PCIE_TOPO, [0, 1]) == "pcie"
    assert parse_topology(H200_TOPO, [1]) == "single"
    assert parse_topology("", []) is None
    assert [g["index"] for g in visible(gpus, None)] == [0, 1]
    assert [g["index"] for g in visible(gpus, "1")] == [1]
    assert [g["index"] for g in visible(gpus, "GPU-e38e8d4b,0")] == [1, 0]
    assert visible(gpus, "") == [] and [g["index"] for g in visible(gpus, "0,7,1")] == [0]


def test_hardware_identity_hashes_the_documented_fields() -> None:
    spec = load_spec(TINY, ['hardware.gpu="H200"', "hardware.gpus_per_node=2"])
    probed = {"gpus": parse_gpu_query(H200_QUERY), "visible": [0, 1], "interconnect": "nvlink",
              "cpu": "Intel(R) Xeon(R) Processor", "cpu_cores": 32}
    warnings: list[str] = []
    assert identity(spec, probed, warnings) == {"probed": True, "device": "cuda", "gpu": "NVIDIA H200",
                                                "driver_major": "580", "interconnect": "nvlink", "nodes": 1,
                                                "gpus_per_node": 2}
    assert warnings == []
    cpu = identity(load_spec(TINY, ['hardware.gpu="cpu"']), probed, warnings)
    assert cpu == {"probed": True, "device": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "nodes": 1,
                   "gpus_per_node": 1}


def test_this_machine_probe(dvc_project: Path) -> None:
    rec = collect(spec_in(dvc_project), dvc_project)
    hw = rec.hardware
    if shutil.which("nvidia-smi") is None:
        assert hw.device == "cpu" and hw.id["cpu"] == cpu_model() and hw.visible_gpus == []
        assert hw.info["probe"]["nvidia_smi"] is False
    assert hw.info["probe"]["cpu_cores"] >= 1


# nvidia-smi as probed on the two-H200 machine (fingerprint.json of a run there, 2026-11-30).
H200_PROBE = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_cores": 32, "interconnect": "single", "nvidia_smi": True,
              "visible": [0], "gpus": [
                  {"driver": "580.159.04", "index": 0, "memory_mib": 143771, "name": "NVIDIA H200",
                   "uuid": "GPU-9a4e1411-771b-c05e-3b61-ed163a008243"},
                  {"driver": "580.159.04", "index": 1, "memory_mib": 143771, "name": "NVIDIA H200",
                   "uuid": "GPU-ace0c60b-b916-e7a0-c228-23c554d83224"}]}


def test_mcx_run_trains_on_the_gpu_its_hardware_fingerprint_probed():
    """The worker's device follows the hardware fingerprint: a visible GPU -> cuda (a run on the
    H200 machine once went to the CPU backend because this read the wrong key). The plan's stages carry it."""
    from mcx.fingerprint.components import HardwareComponent
    from mcx.fingerprint.hardware import identity
    from mcx.ops.plan import local_device
    from mcx.plan.planner import make_plan

    spec = load_spec(REPO / "experiments" / "h200_1gpu.toml")

    EMPTY = {"id": {}, "info": {}}

    def device(probed):
        hw = HardwareComponent(id=identity(spec, probed, []), info={"probe": probed})
        plan = make_plan(spec, te_available=True, local_device=local_device(
            FingerprintRecord(code=EMPTY, environment=EMPTY, config=EMPTY, data=EMPTY, hardware=hw)))
        assert plan.smoke.device == plan.full.device
        return plan.full.device

    assert device(H200_PROBE) == "cuda"
    assert device({**H200_PROBE, "gpus": [], "visible": [], "nvidia_smi": False, "interconnect": None}) == "cpu"
