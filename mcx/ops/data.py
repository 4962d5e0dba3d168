"""`mcx data prepare`, and making sure a spec's dataset is on disk before a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from mcx.data.corpus import text_corpus
from mcx.data.dataset import check_dataset, read_manifest
from mcx.data.dvc_hash import verify_against_dvc
from mcx.data.prepare import prepare as build, prepare_quickstart, prepare_shards as build_shards, quickstart_recipe
from mcx.data.shards import find_shards, is_record_input
from mcx.errors import DataError, SpecError
from mcx.fingerprint.components import DataPath
from mcx.fingerprint.data import content_identity, data_paths, largest_token_id, not_pulled_warning
from mcx.fingerprint.dvcfiles import find_out, norm
from mcx.fingerprint.dvcworkspace import cache_object, recorded_listing, shown_path, shown_paths
from mcx.fingerprint.filehashes import FileHashes
from mcx.ops.plan import token_id_problems
from mcx.ops.progress import Note, Progress
from mcx.spec.schema import DataSpec, TokenizerKind, TokenizerSpec
from mcx.track.dvc_store import ensure_remote, keep_version, restore

if TYPE_CHECKING:
    from mcx.data.shard_work import Progress as ShardProgress
    from mcx.fingerprint.dvcfiles import DvcOut
    from mcx.ops.plan import PlanResult


def _summary(manifest: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return {"out_dir": str(out_dir), "documents": manifest["dataset"]["documents"],
            "tokens": manifest["dataset"]["tokens"], "vocab_size": manifest["tokenizer"]["vocab_size"],
            "manifest": manifest}


def prepare(*, project: Path, source: Sequence[str] | str | None, out: str | None, tokenizer: str | None,
            tokenizer_kind: TokenizerKind | None, merges: str | None, vocab_size: int | None, text_key: str = "text",
            force: bool, inside_tracked: bool = False, workers: int = 1,
            progress: ShardProgress | None = None) -> dict[str, Any]:
    """`mcx data prepare`: ``source`` (text files, a directory of them, or record shards: .jsonl, .jsonl.gz,
    .parquet files, directories or globs) into a dataset at ``out``; none: the bundled quickstart. Record shards
    are tokenized by ``workers`` processes, resumably, ``progress`` hearing how far (mcx.data.shard_work)."""
    sources = [source] if isinstance(source, str) else list(source or ())
    if not sources:
        if tokenizer or tokenizer_kind or merges or vocab_size or (out and Path(out).resolve() != (project / quickstart_recipe().path).resolve()):
            raise DataError("tokenizer and output options need a SOURCE;",
                            "give a text file, a directory of .txt files or a .jsonl file, or no options for the quickstart.")
        out_dir = prepare_quickstart(project, force=force)
        return _summary(read_manifest(out_dir), out_dir)
    hint = "give a text file, a directory of .txt files, or .jsonl, .jsonl.gz or .parquet shards (files, a directory or a glob)."
    records = []
    for raw in sources:
        try:
            found = Path(raw).exists()
        except OSError as exc:
            raise DataError(f"source {raw[:40]!r}...: {exc.strerror};", hint) from None
        if not found and not is_record_input(raw):
            raise DataError(f"source {raw!r} does not exist;", hint)
        records.append(is_record_input(raw))
    if any(records) and not all(records) or (not any(records) and len(sources) > 1):
        raise DataError(f"the sources mix text files with record shards, or name several text sources ({', '.join(sources[:4])});",
                        "prepare text from one file or one directory of .txt files, and shards (.jsonl, .jsonl.gz, "
                        ".parquet) as files, directories or globs of those alone.")
    if out is None:
        raise DataError("--out is required with a SOURCE;", "name the dataset directory, e.g. --out data/mycorpus.")
    if workers < 1:
        raise DataError(f"--workers {workers} is not a number of processes;", "use 1 or more (at most one a CPU core).")
    if workers > 1 and not any(records):
        raise DataError(f"--workers {workers} applies to record shards (.jsonl, .jsonl.gz, .parquet), not to text files;",
                        "leave --workers out for text, or give the text as JSON Lines shards.")
    tok = _tokenizer_spec(tokenizer, tokenizer_kind, merges, vocab_size)
    out_dir = Path(out) if Path(out).is_absolute() else project / out
    enclosing = _enclosing_output(project, out_dir)
    if enclosing is not None and not inside_tracked:
        rel_out, record = enclosing
        elsewhere = f"datasets/{out_dir.name}"
        raise DataError(f"--out {out} is inside {rel_out}/, which DVC tracks as one output in {record}: a dataset "
                        f"written there changes that output's hash, so every spec whose data.path is under {rel_out}/ "
                        f"no longer matches {record} and exits 2 until the new version is recorded;",
                        f"write it outside {rel_out} (e.g. --out {elsewhere}, then `dvc add {elsewhere}`), or pass "
                        f"--inside-tracked to write it there and then record the new version with `dvc add {rel_out}` "
                        f"(and commit {record}). Nothing was written.")
    if all(records):
        shards = find_shards(sources)
        manifest = build_shards(shards, tok, out_dir, text_key=text_key, base_dir=project, force=force, workers=workers,
                                progress=progress)
    else:
        manifest = build(text_corpus([Path(sources[0])]), tok, out_dir, base_dir=project, force=force)
    return {**_summary(manifest, out_dir), "dvc_add": _dvc_add_hint(project, out_dir, enclosing)}


def _tokenizer_spec(tokenizer: str | None, kind: TokenizerKind | None, merges: str | None,
                    vocab_size: int | None) -> TokenizerSpec:
    """--tokenizer and its kind as a spec's [data.tokenizer]: a Hugging Face model directory (as `mcx import-hf`
    brings one) means its tokenizer.json; a file's kind is huggingface unless given."""
    if kind in ("huggingface", "sentencepiece", "gpt2") and not tokenizer:
        raise DataError(f"--tokenizer-kind {kind} needs --tokenizer FILE;", "or leave the kind out to train a BPE on the corpus.")
    if tokenizer and Path(tokenizer).is_dir():
        inside = Path(tokenizer) / "tokenizer.json"
        if kind not in (None, "huggingface"):
            raise DataError(f"--tokenizer {tokenizer} is a directory, which mcx reads as a Hugging Face model's "
                            f"(its tokenizer.json), but --tokenizer-kind is {kind};",
                            "name the tokenizer file itself for that kind, or leave --tokenizer-kind out.")
        if not inside.is_file():
            has = ", ".join(sorted(p.name for p in Path(tokenizer).iterdir())[:8]) or "nothing"
            raise DataError(f"--tokenizer {tokenizer} is a directory without a tokenizer.json (it holds: {has});",
                            "give a Hugging Face model directory with its tokenizer.json, or the tokenizer file itself "
                            "(a SentencePiece .model with --tokenizer-kind sentencepiece).")
        tokenizer = str(inside)
    return TokenizerSpec(kind=kind or ("huggingface" if tokenizer else "bpe"), path=tokenizer, merges=merges,
                         vocab_size=vocab_size or 8192)


def _enclosing_output(project: Path, out_dir: Path) -> tuple[str, str] | None:
    """(output, its .dvc or dvc.lock file), project-relative, when ``out_dir`` lies inside another
    DVC-tracked output (``data/mine`` inside ``data``, which ``data.dvc`` tracks); else None."""
    root, full = norm(project), norm(out_dir)
    found = find_out(full)
    if found is None or found.path == full or not found.path.is_relative_to(root):
        return None
    return found.path.relative_to(root).as_posix() or ".", found.record.relative_to(root).as_posix()


def _dvc_add_hint(project: Path, out_dir: Path, enclosing: tuple[str, str] | None) -> str | None:
    """The `dvc add` that records the prepared dataset (its enclosing output's new version, if any)."""
    root, full = norm(project), norm(out_dir)
    if not full.is_relative_to(root) or not (root / ".dvc").is_dir():
        return None
    if enclosing is not None:
        rel_out, record = enclosing
        return (f"{full.relative_to(root).as_posix()} is inside {rel_out}: record the new version of {rel_out} with "
                f"`dvc add {rel_out}` and commit {record}")
    rel = full.relative_to(root).as_posix()
    return f"track it with DVC: `dvc add {rel}` (then commit {rel}.dvc and the .gitignore beside it)"


def ensure_dataset(project: Path, data: DataSpec, *, remote: str | None = None,
                   progress: Progress | None = None) -> Path:
    """The spec's dataset on disk, and its tokenizer files: present, else pulled from the DVC remote (the output
    that holds each, as the run ID hashes it) and checked file by file against its record, else (the quickstart)
    rebuilt; ``progress`` hears which. Returns the dataset's directory; for a mixture, ``project``, where its
    components' paths start (each component present or pulled alike; D60)."""
    if data.path is None:
        for key, value, prefix in data.datasets().values():
            if not (project / value / "manifest.json").exists():
                why = _pulled(project, key, value, remote=remote, progress=progress)
                if why is not None:
                    raise DataError(f"{key} = {value!r} is not on disk and could not be pulled ({why});",
                                    "run `dvc pull` with its remote configured, or build it with `mcx data prepare "
                                    f"SOURCE --out {value}`.")
            check_dataset(project / value, prefix)
        path = project
    else:
        path = _dataset(project, data, data.path, remote=remote, progress=progress)
    for key, tok_value in (("data.tokenizer.path", data.tokenizer.path), ("data.tokenizer.merges", data.tokenizer.merges)):
        if tok_value is not None and not (project / tok_value).exists():
            why = _pulled(project, key, tok_value, remote=remote, progress=progress)
            if why is not None:
                raise DataError(f"{key} = {tok_value!r} is not on disk and could not be pulled ({why});",
                                f"run `dvc pull` with its remote configured, or put the file at {tok_value}.")
    return path


def _dataset(project: Path, data: DataSpec, value: str, *, remote: str | None, progress: Progress | None) -> Path:
    """``data.path`` (``value``) present, pulled or (the quickstart) rebuilt."""
    path = project / value
    if (path / "manifest.json").exists():
        check_dataset(path, data.prefix)
        return path
    pulled_error = _pulled(project, "data.path", value, remote=remote, progress=progress)
    if (path / "manifest.json").exists():
        check_dataset(path, data.prefix)
        return path
    if path.resolve() == (project / quickstart_recipe().path).resolve():
        prepare_quickstart(project)
        checked = _verify_quickstart(project)
        if progress is not None:
            progress(Note(lead="data", text=f": rebuilt the quickstart dataset at {value} (it could not be pulled: "
                                            f"{pulled_error}){'; it matches data.dvc' if checked else ''}"))
        return path
    raise DataError(f"dataset data.path = {value!r} is not on disk and could not be pulled ({pulled_error});",
                    "run `dvc pull` with its remote configured, or build it with `mcx data prepare SOURCE --out "
                    f"{value}`.")


def _pulled(project: Path, key: str, value: str, *, remote: str | None, progress: Progress | None) -> str | None:
    """Pull the DVC output that holds ``value`` (the spec's ``key``; a .dvc file's by its record, a dvc.lock
    stage's by a pointer to its md5) and check it (DataError where damaged); why it is still not there, None where
    it is now."""
    out = find_out(project / value)
    if out is None:
        return "no .dvc file or dvc.lock output tracks it"
    record, name = shown_path(out.record, norm(project)), ensure_remote(project, remote)
    try:
        if out.record.suffix == ".dvc":
            restore(project, dvc_file=out.record, remote=remote)
        else:
            restore(project, md5=out.value, path=out.path, remote=remote)
    except Exception as exc:  # an empty remote is normal on a fresh machine; the quickstart is rebuilt then
        if cache_object(out, out.value) is None:
            return f"neither the DVC cache nor the remote {name!r} holds the version {record} records"
        return " ".join((exc.message if isinstance(exc, DataError) else str(exc)).split())
    check_pulled(project, out, remote=name, again=f"`dvc pull {record}`")
    if not (project / value).exists():
        return f"the version of {out.path.name} that {out.record.name} records holds nothing there"
    if progress is not None:
        progress(Note(lead="data", text=f": pulled {record}'s output from DVC remote {name!r} for {key} = "
                                        f"{value!r}; its files match the record"))
    return None


def check_pulled(project: Path, out: DvcOut, *, remote: str, again: str) -> None:
    """Compare each file of a DVC output just pulled with its record, by content: DVC copies a remote's damaged
    object into its cache and the workspace without a word, and `dvc status` then trusts it. Damaged files are
    removed from the workspace and the cache (their content is not their name's), and a DataError names them,
    ``remote`` (its name) and how to fetch again once it is mended (``again``). The hashes are kept (FileHashes),
    so the run's fingerprint reads again only the files written in the pull's last seconds (racy ones)."""
    if out.hash_name != "md5":
        return
    is_dir = out.value.endswith(".dir")
    listing = recorded_listing(out) if is_dir else None  # None for a directory: its listing itself is damaged
    expected = {out.path / rel: md5 for rel, md5 in listing.items()} if listing is not None else {out.path: out.value}
    hashes = FileHashes.for_project(project)
    try:
        damaged = sorted(p for p, md5 in expected.items()
                         if (is_dir and listing is None) or not p.is_file() or hashes.hash(p, "md5") != md5)
    finally:
        hashes.save()
    if not damaged:
        return
    for p in damaged:
        for f in (p, cache_object(out, expected[p])):
            if f is not None and not f.is_dir():
                f.unlink(missing_ok=True)
    root = norm(project)
    what = "the directory listing" if is_dir and listing is None else f"{len(damaged)} file{'s' * (len(damaged) != 1)}"
    where, shown = shown_path(out.path, root), shown_paths(damaged, root)
    raise DataError(f"{what} pulled from DVC remote {remote!r} for {where} differ{'s' * (len(damaged) == 1)} "
                    f"from the recorded md5 ({shown}): the remote's copy is damaged; mcx removed "
                    f"{'it' if len(damaged) == 1 else 'them'} here and from the DVC cache;",
                    "put the recorded version on the remote again from a machine that has it intact (delete the "
                    "damaged objects there, then `dvc push`: it skips objects the remote holds), then "
                    f"{again} here.")


def with_fetched_data(planned: PlanResult, root: Path) -> PlanResult:
    """``planned`` with each data path it knew only by its DVC record (not here when planned) identified again
    now that the run has brought it: checked by content, its record's info says so; an identity other than the
    planned one is a DataError (exit 2) before anything trains, and so is a dataset holding token ids past the
    vocabulary (``token_id_problems``, which planning could not check while the data was not here)."""
    from attrs import evolve

    data = planned.record.data
    stale = [path for path in data.paths.values() if not path.pulled]
    if not stale:
        return planned
    paths = data_paths(planned.spec.data)
    warnings, fresh = list(planned.record.warnings), list[str]()
    for was in stale:
        key, value = paths[was.name]
        part = content_identity(root, value, key, fresh, require_data=True)
        if part["id"] != was.id:
            raise DataError(f"{key} = {value!r}: the data here is {part['id']}, but the run was planned with "
                            f"{was.id} (its DVC record changed meanwhile);", "run again.")
        data = data.with_path(DataPath(name=was.name, id=was.id, info=part["info"]))
        stale_warning = f"data: {not_pulled_warning(key, value, str(was.record))}"
        warnings = [w for w in warnings if w != stale_warning]
    datasets = [path.name for path in stale if path.name in planned.spec.data.datasets()]
    if datasets:  # their largest token ids, as planning data that was here records them
        hashes = FileHashes.for_project(root)
        try:
            tops = {name: largest_token_id(planned.spec.data, root, hashes, name) for name in datasets}
        finally:
            hashes.save()
        for name, top in tops.items():
            if top is not None:
                dataset = data.paths[name]
                data = data.with_path(DataPath(name=name, id=dataset.id, info={**dataset.info, "max_token_id": top}))
    record = evolve(planned.record, data=data, warnings=(*warnings, *(f"data: {w}" for w in fresh)))
    problems = token_id_problems(planned.spec, root, record)
    if problems:
        raise SpecError(problems)
    return evolve(planned, record=record)


def _verify_quickstart(project: Path) -> bool:
    """Whether the rebuilt quickstart was checked against data.dvc (DataError where it differs)."""
    if not (project / "data.dvc").exists():
        return False
    others = {p.name for p in (project / "data").iterdir()} - {"quickstart"}
    if others:  # data.dvc hashes all of data/; other datasets there change it legitimately
        return False
    check = verify_against_dvc(project)
    if not check.matches:
        raise DataError(f"the rebuilt quickstart dataset hashes to {check.actual.md5}, but data.dvc records "
                        f"{check.expected.md5};", "install the environment from the lockfile (./dev env) so megatron-core "
                        "and tokenizers match, then run `mcx data prepare --force`.")
    return True


def tracked_outputs(project: Path, data: DataSpec, data_id: dict[str, Any]) -> dict[Path, tuple[str, str]]:
    """The DVC outputs that hold the recorded data: project-relative output path -> (md5, spec key).

    A data identity ``{"source": "dvc", "value": md5, "subpath": "quickstart"}`` for
    ``data.path = "data/quickstart"`` names version md5 of the output ``data``.
    """
    root = norm(project)
    outs: dict[Path, tuple[str, str]] = {}
    for name, (key, value) in data_paths(data).items():
        ident = data_id.get(name) or {}
        if ident.get("source") != "dvc" or not ident.get("value"):
            continue
        full = norm(root / value)
        out = full
        sub = ident.get("subpath")
        for _ in Path(sub).parts if sub else ():
            out = out.parent
        if (sub and out / sub != full) or (out != root and root not in out.parents):
            continue  # not where the record says; the identity check after a restore reports it
        outs.setdefault(out.relative_to(root), (ident["value"], key))
    return outs


@frozen
class DataVersion:
    """One DVC-tracked data version a run trains on: the spec key naming it, its path there, the DVC output
    holding it (project-relative) and that output's md5."""

    spec: str
    path: str
    output: str
    md5: str

    def to_dict(self) -> dict[str, str]:
        """As a checkpoint pointer records it: ``{"spec": "data.path", "path": "data/quickstart", "output": "data",
        "md5": "....dir"}`` (not "key": records are redacted by name, and "key" reads as a secret)."""
        return {"spec": self.spec, "path": self.path, "output": self.output, "md5": self.md5}


def data_versions(project: Path, data: DataSpec, data_id: dict[str, Any]) -> tuple[DataVersion, ...]:
    """The DVC-tracked data versions a run trains on, as its checkpoint pointers record them."""
    values = dict(data_paths(data).values())
    return tuple(DataVersion(spec=key, path=values[key], output=rel.as_posix(), md5=md5)
                 for rel, (md5, key) in tracked_outputs(project, data, data_id).items())


def keep_dataset(project: Path, data: DataSpec, data_id: dict[str, Any], *, remote: str | None,
                 progress: Progress) -> None:
    """Keep the DVC-tracked data a run trains on in the DVC cache and on the remote, by hash, so that
    `mcx reproduce` can restore it after the workspace moved on.

    DataError when the workspace is not the version DVC records (a same-size edit the fingerprint's
    size check cannot see); any other failure (an unreachable remote) is a warning: the run goes on.
    """

    for rel, (md5, key) in tracked_outputs(project, data, data_id).items():
        try:
            keep_version(project, project / rel, md5=md5, remote=remote)
        except DataError:
            raise
        except Exception as exc:  # an McxError or one of DVC's own: the data stays usable, the run goes on
            progress(Note(level="warning", text=f"{key}: version {md5} of {rel} not saved to DVC ({exc}); "
                                                "`mcx reproduce` can restore it only from where it is already kept"))
