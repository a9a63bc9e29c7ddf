"""Train the shipped policies of several GPUs at once, one process per (GPU, expert), and pick per GPU.

For each GPU and each imitation expert (``budget_plan``, ``fitting_plan``: :mod:`kdvfs.agents.learned.imitation`)
a run of ``configs/ppo/<gpu>.yaml`` with that expert is trained in its own process (one core each); per GPU
the run whose selected policy scores the higher return on the *training* steps (the score ``kdvfs train``
records; held-out steps play no part) is the one to ship. Writes every run folder under ``--out`` and
``--out/selection.json`` (scores, wall times, the choice, provenance)::

    python benchmarks/train_policies.py --out runs/policies --gpus h200 b200 --experts budget_plan fitting_plan
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from provenance import provenance

from kdvfs.envs.common.paths import REPO_ROOT

EXPERTS = ("budget_plan", "fitting_plan")


def run_one(gpu: str, expert: str, out: Path, timesteps: int | None) -> dict[str, object]:
    """Train ``gpu``'s config with ``expert`` into ``out/<gpu>-<expert>``; its summary and score."""
    folder = out / f"{gpu}-{expert}"
    folder.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((REPO_ROOT / "configs" / "ppo" / f"{gpu}.yaml").read_text())
    config["imitation"]["expert"] = expert
    config["checkpoint_every"] = 10**9
    (folder / "config-in.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "kd.py"), "train", "--gpu", gpu, "--config",
               str(folder / "config-in.yaml"), "--out", str(folder / "run"), "--no-progress"]
    command += ["--timesteps", str(timesteps)] if timesteps else []
    with (folder / "log.txt").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    summary_path = folder / "run" / "summary.json"
    if code != 0 or not summary_path.exists():
        return {"gpu": gpu, "expert": expert, "exit_code": code}
    summary = json.loads(summary_path.read_text())
    return {"gpu": gpu, "expert": expert, "exit_code": 0, "wall_s": summary["wall_s"],
            "selected": summary["selected"], "training_scores": summary["training_scores"],
            "score": summary["training_scores"][summary["selected"]], "held_out": summary["held_out"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", nargs="+", default=["h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti"])
    parser.add_argument("--experts", nargs="+", choices=EXPERTS, default=list(EXPERTS))
    parser.add_argument("--timesteps", type=int, default=None, help="instead of each config's")
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    runs = [(gpu, expert) for gpu in args.gpus for expert in args.experts]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda run: run_one(*run, args.out, args.timesteps), runs))
    chosen = {}
    for gpu in args.gpus:
        done = [r for r in results if r["gpu"] == gpu and r["exit_code"] == 0]
        if done:
            best = max(done, key=lambda r: float(r["score"]))  # type: ignore[arg-type]
            chosen[gpu] = f"{gpu}-{best['expert']}"
    record = {**provenance(" ".join(["python", *sys.argv])), "runs": results, "chosen": chosen}
    (args.out / "selection.json").write_text(json.dumps(record, indent=1) + "\n")
    for r in results:
        print(r["gpu"], r["expert"], r.get("exit_code"), r.get("training_scores"), r.get("selected"),
              round(float(r.get("wall_s", 0.0))))  # type: ignore[arg-type]
    print("chosen:", chosen)


if __name__ == "__main__":
    main()
