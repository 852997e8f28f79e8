"""Instructions per no-op step, counted by valgrind's callgrind: the engine's own CPU cost,
repeatable to well under 1 % and unmoved by a busy machine (unlike steps/s).

Each scenario runs twice under ``valgrind --tool=callgrind`` in a fresh process on a fresh
SQLite file: once with ``--steps`` steps and once with twice as many; the difference of the
two totals over the difference of the steps is the cost of one step, start-up and warm-up
cancelled out. Scenarios: ``one`` (one job, ``Engine.run_until_idle`` with the default
budget of 10 steps a tick, as bench_steps' "sequential") and ``k16`` (16 jobs at once,
group committed). The issue 25 aim: a no-op step within 200 µs of CPU; this script gives
the instructions, bench_steps.py the CPU time.

Usage::

    python scripts/bench_instructions.py                 # both scenarios, 400 and 800 steps
    python scripts/bench_instructions.py --steps 1000 --scenario one --json
    python scripts/bench_instructions.py --variants plain,observed,signed  # the budgets

Needs valgrind (``apt-get install valgrind``). Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCENARIOS = {"one": 1, "k16": 16}

VARIANTS = ("plain", "observed", "signed")
"""plain: the engine alone; observed: Prometheus metrics kept and OpenTelemetry spans made
(an SDK provider, no exporter: issue 14's 10 % budget); signed: every event signed with a
throwaway Ed25519 key (issue 16's 10 % budget)."""

WORKLOAD = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {scripts!r})
from bench_steps import TENANT, WORKFLOW, TimingExecutor, bench_registry, sdk_tracer
from bench_steps import throwaway_signing_keys
from jobledger import Engine, EngineConfig

jobs, steps, variant = {jobs}, {steps}, {variant!r}
home = tempfile.mkdtemp()
url = f"sqlite:///{{home}}/jobs.db"
keys = throwaway_signing_keys(Path(home)) if variant == "signed" else None
config = EngineConfig(
    store_url=url, worker_id="bench", concurrency=jobs, max_steps_per_tick=10, signing_keys=keys
)
observed = variant == "observed"
engine = Engine.open(
    url,
    registry=bench_registry(),
    executor=TimingExecutor(),
    config=config,
    metrics=observed,
    tracer=sdk_tracer() if observed else None,
)
for n in range(jobs):
    engine.submit(TENANT, f"warm-{{n}}", WORKFLOW, input={{"steps": 20}})
engine.run_until_idle()
for n in range(jobs):
    engine.submit(TENANT, f"job-{{n}}", WORKFLOW, input={{"steps": steps // jobs}})
engine.run_until_idle()
assert all(engine.job(TENANT, f"job-{{n}}").status == "completed" for n in range(jobs))
engine.close()
"""


def instructions(jobs: int, steps: int, variant: str, workdir: Path) -> int:
    """Total instructions (Ir) of one run of the workload under callgrind."""
    script = workdir / f"workload-{jobs}-{steps}-{variant}.py"
    scripts = str(Path(__file__).resolve().parent)
    script.write_text(WORKLOAD.format(scripts=scripts, jobs=jobs, steps=steps, variant=variant))
    out = workdir / f"callgrind-{jobs}-{steps}-{variant}.out"
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"the workload failed under valgrind:\n{run.stderr[-3000:]}")
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="steps of the shorter run")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both")
    parser.add_argument(
        "--variants",
        default="plain",
        help=f"comma-separated, of {', '.join(VARIANTS)} (default plain); each other than "
        "plain is also given as its overhead over plain",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    names = list(SCENARIOS) if args.scenario == "both" else [args.scenario]
    report: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for variant in variants:
                counts = []
                for steps in (args.steps, 2 * args.steps):
                    print(f"{name} {variant}: {steps} steps under callgrind...", file=sys.stderr)
                    counts.append(instructions(SCENARIOS[name], steps, variant, Path(tmp)))
                key = name if variant == "plain" else f"{name}/{variant}"
                report[key] = (counts[1] - counts[0]) / args.steps
    if args.json:
        print(json.dumps({key: round(per) for key, per in report.items()}))
        return 0
    for key, per in report.items():
        name, _, variant = key.partition("/")
        line = f"{key}: {per / 1e6:.3f} M instructions per no-op step"
        if variant and name in report:
            line += f" ({100 * (per / report[name] - 1):+.1f} % over plain; budget 10 %)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
