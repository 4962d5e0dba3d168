"""How long `mcx sync` takes to give up on a tracking server that cannot be reached (D50).

Records --runs runs (a parent record, two stages, 90 metrics lines each) for a server URI that is
down, then times `mcx sync` against it in two ways a server can be away:

- ``refused``: nothing listens on the port (the server process stopped): connection refused;
- ``silent``: something accepts the connection and never answers (a hung server, a dead proxy):
  each request waits out MLFLOW_HTTP_REQUEST_TIMEOUT.

each under mcx's own client limits (MLFLOW_HTTP_REQUEST_* unset) and under MLflow's defaults set
explicitly by the user (--user-env: 7 retries with backoff factor 2, 120 s timeout). Each `mcx sync`
runs as a subprocess and is stopped after --limit seconds (reported as ">= limit").

Usage: python benchmarks/sync_outage.py [--runs 10] [--limit 600] [--user-env] [--mcx PYTHONPATH]
(``--mcx /path/to/checkout`` times another checkout's mcx, e.g. the commit before D50). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MLFLOW_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "120"}


def record_offline(project: Path, uri: str, runs: int) -> None:
    """``runs`` run directories whose records are all spooled for ``uri`` (as `mcx run` leaves them)."""
    from mcx.spec.load import dump_spec, load_spec
    from mcx.track.recorder import RunRecorder

    spec = dump_spec(load_spec(REPO / "experiments" / "tiny.toml"))
    for i in range(runs):
        rid = f"{i:012x}"
        rdir = project / ".mcx" / "runs" / rid
        rdir.mkdir(parents=True)
        (rdir / "spec.toml").write_text(spec)
        (rdir / "fingerprint.json").write_text(json.dumps({"run_id": rid}))
        rec = RunRecorder.for_run(project, rdir, tracking_uri=uri)
        rec.start(launcher="local")
        for stage in ("smoke", "full"):
            (rdir / stage).mkdir()
            rec.start_stage(stage)
            with open(rdir / stage / "metrics.jsonl", "w") as f:
                for step in range(1, 91):
                    f.write(json.dumps({"kind": "train", "step": step, "loss": 10 / step, "time": 1.7e9 + step}) + "\n")
            (rdir / stage / "result.json").write_text(json.dumps({"status": "finished", "passed": True, "steps": 90}))
            rec.finish_stage(stage)
        rec.finish("finished")


def time_sync(project: Path, env: dict[str, str], limit: float, mcx_path: str | None) -> dict:
    env = {**env, **({"PYTHONPATH": mcx_path} if mcx_path else {})}
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "mcx", "sync", "--json"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "at_least_s": limit}
    out = {"seconds": round(time.monotonic() - t0, 1), "exit": proc.returncode}
    try:
        doc = json.loads(proc.stdout)
        out["pending_runs"] = sum(r["state"] == "pending" for r in doc["runs"])
        if doc.get("unreachable"):  # D50 and later: how long the one failed request waited
            out["waited_s"] = doc["unreachable"][0]["waited_s"]
    except (ValueError, KeyError):
        out["stdout"] = proc.stdout[-300:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--limit", type=float, default=600)
    ap.add_argument("--user-env", action="store_true", help="also time with MLflow's defaults set explicitly")
    ap.add_argument("--mcx", default=None, help="PYTHONPATH of the mcx to time (default: this checkout)")
    args = ap.parse_args()

    silent = socket.socket()  # listens (the kernel accepts connections) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused_port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    envs = {"mcx-limits": base, **({"mlflow-defaults": {**base, **MLFLOW_DEFAULTS}} if args.user_env else {})}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way, uri in (("refused", f"http://127.0.0.1:{refused_port}"),
                         ("silent", f"http://127.0.0.1:{silent.getsockname()[1]}")):
            project = Path(tmp) / way
            record_offline(project, uri, args.runs)
            for name, env in envs.items():
                results[f"{way}/{name}"] = time_sync(project, env, args.limit, args.mcx)
    print(json.dumps({"runs": args.runs, "mcx": args.mcx or str(REPO), "results": results}, indent=1))


if __name__ == "__main__":
    main()
