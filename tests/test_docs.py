"""The documentation's evidence stays in the repository and stays current (docs/decisions.md D55): every
result file is one docs/benchmarks.md cites, every calibration file is described where it came from,
and nothing cites a file outside the repository."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
CALIBRATION = ROOT / "benchmarks" / "calibration"


def _expand(token: str) -> list[str]:
    """A cited path with shell braces (``hf_export_{16,32}_layers_cpu.json``) as the paths it names."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [p for alt in m.group(1).split(",") for p in _expand(token[:m.start()] + alt + token[m.end():])]


def _cited_names(text: str) -> set[str]:
    """The file names (globs allowed) a page cites in backticks or plain, braces expanded."""
    tokens = re.findall(r"[\w{}*,./-]+\.json\b", text)
    return {Path(p).name for t in tokens for p in _expand(t)}


def test_every_result_file_is_one_benchmarks_md_cites() -> None:
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    cited = _cited_names(benchmarks)
    files = sorted(p for p in RESULTS.rglob("*") if p.is_file())
    assert files, "docs/results is empty"
    uncited = [str(p.relative_to(ROOT)) for p in files if not any(fnmatch.fnmatch(p.name, c) for c in cited)]
    assert uncited == [], f"not cited by docs/benchmarks.md (cite them, or remove them: git keeps them): {uncited}"
    in_tree = re.findall(r"(?<![:\w])docs/results/([\w{}*,./-]+\.json)", benchmarks)
    missing = [p for t in in_tree for p in _expand(t) if not any(f.match(p) for f in files)]
    assert missing == [], f"docs/benchmarks.md cites result files the tree does not hold: {missing}"


def test_every_calibration_file_is_described_and_read() -> None:
    readme = (CALIBRATION / "README.md").read_text(encoding="utf-8")
    fit = (ROOT / "benchmarks" / "steptime_fit.py").read_text(encoding="utf-8")
    files = sorted(p.name for p in CALIBRATION.glob("*.json"))
    assert len(files) == 11
    assert [f for f in files if f"`{f}`" not in readme] == []
    measured = re.findall(r'"(h200_[\w]+\.json)"', fit)
    assert len(measured) == 10 and set(measured) <= set(files)


def test_nothing_cites_a_file_outside_the_repository() -> None:
    # built from pieces, so this file does not cite them itself
    outside = re.compile("|".join(re.escape(s) for s in ("../" + "shared/", "/work" + "/", "device" + ".md",
                                                          "DEVELOPERS" + ".md")))
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("*.md")]
    sources = [p for d in ("mcx", "tests", "benchmarks") for p in (ROOT / d).rglob("*")
               if p.suffix in {".py", ".sh", ".toml"} and "__pycache__" not in p.parts]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in [*pages, *sources]
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if outside.search(line)]
    assert found == [], "cite docs/gpu.md (or another page of the repository) instead:\n" + "\n".join(found)
