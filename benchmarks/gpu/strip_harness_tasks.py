"""Make lm-evaluation-harness's wheel small enough to travel beside Transformer Engine in one device call.

lm_eval-0.4.13-py3-none-any.whl (PyPI, 9.1 MB) is mostly its registry of bundled task configs: about 15,500
files under lm_eval/tasks/<task>/ (5.0 MB compressed, plus their zip headers and RECORD lines). The GPU tests
evaluate a local task directory (evals/quickstart_next_line, read through the harness's include_path), never a
registry task, so this copies the wheel without those folders (the harness's own code, lm_eval/tasks/*.py
included, byte-identical) and without their RECORD lines: about 0.5 MB. The harness then finds no registry
tasks, and a registry name fails as any unknown task does. docs/gpu.md says where it goes.

    python3 benchmarks/gpu/strip_harness_tasks.py ORIGINAL.whl OUT.whl
"""

from __future__ import annotations

import sys
import zipfile

TASKS = "lm_eval/tasks/"


def bundled_task_file(name: str) -> bool:
    """A file inside one of lm_eval/tasks/'s folders (a registry task's YAML, its data or helpers)."""
    return name.startswith(TASKS) and "/" in name[len(TASKS):]


def strip(src: str, dst: str) -> tuple[int, int]:
    """Write ``dst``: ``src`` without its bundled task configs; (files kept, files left out)."""
    kept = dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if bundled_task_file(info.filename):
                dropped += 1
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not bundled_task_file(line.split(",", 1)[0])).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            kept += 1
    return kept, dropped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    kept, dropped = strip(argv[0], argv[1])
    print(f"{argv[1]}: {kept} files kept, {dropped} bundled task files left out")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
