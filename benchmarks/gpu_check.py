"""Everything that needs a GPU, in one command that fits a nine-minute lease: ``make gpu-check``.

    python3 benchmarks/gpu_check.py [--out DIR] [--budget 540] [--steps a,b] [--timeout STEP=SECONDS]
    python benchmarks/gpu_check.py --dry-run     # on the CPU, tiny sizes, Triton's interpreter

The steps (STEPS below) run in order of value, each a subprocess with its own timeout, so that a
lease cut short still leaves the most useful results. Before each step the summary marks it
``running``; after it, the step's status, seconds and a note are written at once, so a killed run
keeps what finished. A step that needs more seconds than the budget has left is skipped and
recorded as such; a step whose tool is missing (no CUDA, no compute-sanitizer, no nbval) is
recorded as skipped with the reason, never as passed. ``--steps`` (or ``GPU_CHECK_STEPS``, names
separated by commas) reruns only the named steps; the others are listed as ``not selected``.

The output folder (``--out``; by default ``$OUT/gpu-check`` where the device tool sets ``OUT``,
else ``gpu-check-results/``) holds at most seven files, within what the device tool brings back:
``summary.md`` (one row per step: status, seconds, note), ``facts.json``, ``smoke.md``,
``microbench.md``, ``bench_rotary.md``, ``bench_attention.md`` and ``steps.log`` (every step's
command and output, the end of each kept).

The Python packages the GPU machine lacks (nbval, ipykernel and their needs, the pinned
hypothesis, Liger-Kernel) travel as wheels in ``.whl/`` (``make gpu-wheels``); the ``wheels``
step installs them into a temporary folder put on every later step's ``PYTHONPATH``.

The dry run (tests/test_gpu_check.py) runs every step as far as the CPU allows, so that this
script cannot rot between GPU sessions: the smoke cases in the interpreter, the microbenchmark's
contenders once untimed, one kernel test; the rest is recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
KERNEL_TESTS = ["tests/test_triton_rotary.py", "tests/test_kernel_exactness.py", "tests/test_fused_attention.py",
                "tests/test_operators_hostile.py", "tests/test_rotated_last.py"]
NOTEBOOKS = ["notebooks/09_precision.ipynb", "notebooks/18_kernels.ipynb", "notebooks/19_rope_inside_attention.ipynb"]
ATTENTION_LENGTHS = ["1024", "4096", "16384"]
SKIPPED = 3  # the exit status of a step's script that found nothing to run on (its last line: "SKIP: why")
LOG_TAIL = 400_000  # characters of each step's output kept in steps.log
DRY_RUN_BUDGET = 120.0  # a cap for a loaded CI machine; the dry run itself takes about 30 s of one core


@dataclasses.dataclass
class Step:
    name: str
    need: float  # seconds it takes on an H100 (an estimate until measured): not started with less left
    timeout: float
    writes: str


STEPS = [
    Step("facts", 5, 30, "facts.json: GPU, driver, CUDA, torch, Triton, Python, transformers, commit, date"),
    Step("wheels", 10, 60, "installs .whl/ into a temporary folder on the later steps' PYTHONPATH"),
    Step("smoke", 60, 150, "smoke.md: every kernel variant once against float64 references"),
    Step("launches", 15, 90, "steps.log: kernels per call at decode (torch.profiler), each must be 1"),
    Step("microbench", 30, 90, "microbench.md: the rotary kernel against a copy of the same bytes"),
    Step("kernel-tests", 150, 240, "the kernel and operator test files on CUDA (pytest, xdist)"),
    Step("sanitizer", 60, 150, "compute-sanitizer memcheck over benchmarks/sanitize_rotary.py"),
    Step("nbval", 60, 150, "chapters 09, 18 and 19 under nbval on the GPU"),
    Step("bench-rotary", 60, 150, "bench_rotary.md: bench_rotary.py --quick (Liger when carried)"),
    Step("bench-attention", 90, 180, "bench_attention.md: bench_attention.py, S = 1k, 4k, 16k"),
    Step("other-tests", 60, 300, "the rest of tests/ on CUDA (not test_book_render.py)"),
]


class Skip(Exception):
    """A step that cannot run here; the message is the reason recorded."""


@dataclasses.dataclass
class Context:
    out: Path
    dry_run: bool
    cuda: bool
    env: dict
    tmp: Path
    budget: float
    start: float = dataclasses.field(default_factory=time.monotonic)
    step_env: dict = dataclasses.field(default_factory=dict)  # variables for the current step alone

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)


def pytest_command(ctx: Context, targets: list[str], *, workers: int = 8, per_test: int = 120,
                   dist: str = "load") -> list[str]:
    """pytest with xdist workers (a worker whose CUDA context died is replaced: tests/conftest.py)
    and a per-test timeout, each where its plugin is installed; ``dist="loadfile"`` keeps a file's
    tests on one worker (a notebook's cells depend on the cells before them)."""
    command = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets]
    if ctx.cuda and has_module("xdist", ctx):
        command += ["-p", "xdist", "-n", str(workers), "--dist", dist, "--max-worker-restart", "8"]
    if has_module("pytest_timeout", ctx):
        command += ["-p", "pytest_timeout", "--timeout", str(per_test)]
    return command


def has_module(name: str, ctx: Context) -> bool:
    """Whether ``name`` imports with the steps' PYTHONPATH (the carried wheels included)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([PY, "-c", probe], env=ctx.env, capture_output=True).returncode == 0


def commands(step: str, ctx: Context) -> list[list[str]]:
    """The commands of one step (run in order), or Skip with the reason."""
    out = ctx.out
    if step == "facts":
        return [[PY, __file__, "--facts", str(out / "facts.json")]]
    if step == "wheels":
        wheels = sorted(glob.glob(str(ROOT / ".whl" / "*.whl")))
        if not wheels:
            raise Skip("no .whl/ folder with wheels (make gpu-wheels here, then carry .whl)")
        if ctx.dry_run:
            raise Skip(f"dry run: {len(wheels)} cp312 wheels in .whl/, installed only on the GPU machine")
        site, jupyter = ctx.tmp / "site", ctx.tmp / "jupyter"
        ctx.env["PYTHONPATH"] = os.pathsep.join([str(site), ctx.env["PYTHONPATH"]])
        ctx.env["JUPYTER_PATH"] = str(jupyter / "share" / "jupyter")
        return [[PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                 "--upgrade", "--target", str(site), *wheels],
                [PY, "-m", "ipykernel", "install", "--prefix", str(jupyter), "--name", "python3"]]
    if step == "smoke":
        return [[PY, "benchmarks/gpu_smoke.py", "--out", str(out / "smoke.md"), *(["--tiny"] if ctx.dry_run else [])]]
    if step == "launches":
        return [[PY, __file__, "--launches"]]
    if step == "microbench":
        return [[PY, "benchmarks/gpu_microbench.py", "--out", str(out / "microbench.md")]]
    if step == "kernel-tests":
        if not ctx.cuda:  # one interpreted test keeps the command and tests/conftest.py's hook honest
            return [pytest_command(ctx, ["tests/test_triton_rotary.py::"
                                         "test_in_place_rotation_equals_out_of_place_and_keeps_the_tail"])]
        return [pytest_command(ctx, KERNEL_TESTS)]
    if step == "sanitizer":
        if not ctx.cuda:
            raise Skip("no CUDA")
        if not shutil.which("compute-sanitizer"):
            raise Skip("compute-sanitizer not on PATH")
        ctx.step_env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # a read past a tensor lands outside any block
        return [["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", PY,
                 "benchmarks/sanitize_rotary.py"]]
    if step == "nbval":
        if ctx.dry_run:
            raise Skip("dry run: make test runs every notebook under nbval on the CPU")
        if not (has_module("nbval", ctx) and has_module("ipykernel", ctx)):
            raise Skip("nbval or ipykernel not importable (make gpu-wheels here, then carry .whl)")
        return [pytest_command(ctx, ["--nbval", "--nbval-cell-timeout", "120", *NOTEBOOKS], workers=3, per_test=150,
                               dist="loadfile")]
    if step == "bench-rotary":
        if not ctx.cuda:
            raise Skip("no CUDA")
        return [[PY, "benchmarks/bench_rotary.py", "--quick", "--out", str(out / "bench_rotary.md")]]
    if step == "bench-attention":
        if not ctx.cuda:
            raise Skip("no CUDA (bench_attention.py --check runs in tests/test_fused_attention.py)")
        return [[PY, "benchmarks/bench_attention.py", "--lengths", *ATTENTION_LENGTHS,
                 "--out", str(out / "bench_attention.md")]]
    if step == "other-tests":
        if not ctx.cuda:
            raise Skip("no CUDA (make check and make test run these on the CPU)")
        ignored = [f"--ignore={path}" for path in [*KERNEL_TESTS, "tests/test_book_render.py"]]
        return [pytest_command(ctx, ["tests", *ignored])]
    raise ValueError(f"unknown step {step!r}")


def run_step(step: Step, ctx: Context, timeout: float, log) -> tuple[str, str]:
    """(status, note): pass, fail, timeout or skipped, and the output's last line or the reason."""
    ctx.step_env = {}
    try:
        argvs = commands(step.name, ctx)
    except Skip as why:
        log.write(f"skipped: {why}\n")
        return "skipped", str(why)
    deadline = time.monotonic() + timeout
    output = ""
    for argv in argvs:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        with tempfile.TemporaryFile("w+") as capture:
            # its own process group: a timeout ends the step's children too (xdist workers, the sanitized python)
            proc = subprocess.Popen(argv, cwd=ROOT, env={**ctx.env, **ctx.step_env}, stdout=capture,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            capture.seek(0)
            output = capture.read()
        log.write(output[-LOG_TAIL:] + ("\n" if output and not output.endswith("\n") else ""))
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        last = lines[-1][:200] if lines else ""
        if code is None:
            return "timeout", f"killed after {timeout:.0f} s; last line: {last}"
        if code == SKIPPED and last.startswith("SKIP:"):
            return "skipped", last.removeprefix("SKIP:").strip()
        if code != 0:
            return "fail", f"exit status {code}; {last}"
    return "pass", last + (" (dry run)" if ctx.dry_run else "")


def write_summary(ctx: Context, rows: dict[str, tuple[str, float | None, str]]) -> None:
    lines = [f"# make gpu-check {'(dry run, CPU) ' if ctx.dry_run else ''}"
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Budget {ctx.budget:.0f} s, {time.monotonic() - ctx.start:.0f} s used. Facts in facts.json, each step's "
             "output in steps.log.", "",
             "| step | status | seconds | note | writes |", "| --- | --- | --- | --- | --- |"]
    for step in STEPS:
        status, seconds, note = rows.get(step.name, ("pending", None, ""))
        cell = "" if seconds is None else f"{seconds:.1f}"
        lines.append(f"| {step.name} | {status} | {cell} | {note.replace('|', '/')} | {step.writes} |")
    (ctx.out / "summary.md").write_text("\n".join(lines) + "\n")


def facts(path: str) -> None:
    """The facts step (run as a subprocess): where and with what these results were made."""
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def run(argv, **kwargs):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=20, **kwargs).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None

    import torch

    commit = run(["git", "rev-parse", "HEAD"], cwd=ROOT)
    commit_file = ROOT / ".whl" / "COMMIT"  # written by make gpu-wheels: the device copy has no .git
    if commit is None and commit_file.exists():
        commit = commit_file.read_text().strip() + " (from .whl/COMMIT)"
    sources = hashlib.sha256()
    for file in sorted(ROOT.glob("rope/**/*.py")):  # identifies the kernels' code without git
        sources.update(file.relative_to(ROOT).as_posix().encode() + b"\0" + file.read_bytes())
    record = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "nvidia_smi": run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": version("triton"),
        "transformers": version("transformers"),
        "hypothesis": version("hypothesis"),
        "liger_kernel": version("liger-kernel"),
        "nbval": version("nbval"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "rope_sources_sha256": sources.hexdigest(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    Path(path).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"{record['gpu'] or 'no GPU'}, torch {record['torch']}, triton {record['triton']}, "
          f"commit {(commit or 'unknown')[:12]}")


DECODE_BATCHES = (1, 2, 4, 8)
"""The decode shapes of the launches step: these batches of one token, 32 query and 8 key heads of 128."""


def launches() -> int:
    """The launches step (run as a subprocess): the device work of one call at decode, counted by
    torch.profiler (every kernel, copy and fill on the GPU): ``torch.ops.rope.rotary`` and
    ``rotary_`` must run one kernel, a forward and backward pass two, for each batch of
    :data:`DECODE_BATCHES` and each dtype, once the frequencies were checked by an earlier call
    (rope/kernels/operators.py checks each tensor once). float32 q and k take float32 math, which
    checks fresh positions (a few small kernels): there the positions are those of the earlier call.
    Prints a line per case; exits 1 if any case launched another number of kernels, 3 (skipped)
    without CUDA (tests/test_decode_launches.py counts them in Triton's interpreter)."""
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA (tests/test_decode_launches.py counts the launches in Triton's interpreter)")
        return SKIPPED
    import rope
    import rope.kernels.operators  # registers torch.ops.rope.rotary and rotary_

    inv_freq = rope.inv_freq({"rope_theta": 500000.0}, 128)[0].cuda()
    wrong = 0
    for dtype, batch in ((d, b) for d in (torch.bfloat16, torch.float16, torch.float32) for b in DECODE_BATCHES):
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=dtype)
        k = torch.randn(batch, 1, 8, 128, device="cuda", dtype=dtype)
        positions = torch.randint(0, 2**20, (batch, 1), device="cuda")
        options = dict(positions=positions, inv_freq=inv_freq, interleaved=False, rotary_dim=128, scale=1.0,
                       conjugate=False)
        leaf_q, leaf_k = q.clone().requires_grad_(), k.clone().requires_grad_()
        grads = torch.randn_like(q), torch.randn_like(k)
        calls = {
            "rotary": (1, lambda: torch.ops.rope.rotary(q=q, k=k, **options)),
            "rotary_": (1, lambda: torch.ops.rope.rotary_(q=q, k=k, **options)),
            "forward and backward": (2, lambda: torch.autograd.grad(
                torch.ops.rope.rotary(q=leaf_q, k=leaf_k, **options), (leaf_q, leaf_k), grads)),
        }
        for name, (expected, call) in calls.items():
            call()  # checks the tensors, compiles the kernel
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                call()
                torch.cuda.synchronize()
            work = [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]
            wrong += len(work) != expected
            print(f"{'ok' if len(work) == expected else 'WRONG'} {name} {str(dtype).removeprefix('torch.')} "
                  f"batch {batch}: {len(work)} on the GPU (expected {expected}): {', '.join(work)}")
    print(f"decode: {'every call launched its one kernel per pass' if not wrong else f'{wrong} calls launched more'}")
    return 1 if wrong else 0


def parse_timeouts(items: list[str]) -> dict[str, float]:
    timeouts = {}
    for item in items:
        name, _, seconds = item.partition("=")
        if name not in {step.name for step in STEPS} or not seconds:
            raise SystemExit(f"--timeout: expected STEP=SECONDS with STEP one of the steps, got {item!r}")
        timeouts[name] = float(seconds)
    return timeouts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the results folder (default $OUT/gpu-check or gpu-check-results)")
    parser.add_argument("--budget", type=float, help=f"seconds for all steps (default 540; dry run {DRY_RUN_BUDGET})")
    parser.add_argument("--steps", default=os.environ.get("GPU_CHECK_STEPS", ""),
                        help="run only these steps, comma-separated (env GPU_CHECK_STEPS)")
    parser.add_argument("--timeout", action="append", default=[], metavar="STEP=SECONDS",
                        help="another timeout for a step (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU: interpreter, tiny sizes, short budget")
    parser.add_argument("--facts", metavar="PATH", help=argparse.SUPPRESS)  # the facts step's subprocess
    parser.add_argument("--launches", action="store_true", help=argparse.SUPPRESS)  # the launches step's subprocess
    args = parser.parse_args(argv)
    if args.facts:
        facts(args.facts)
        return 0
    if args.launches:
        return launches()
    selected = [name.strip() for name in args.steps.split(",") if name.strip()] or [step.name for step in STEPS]
    unknown = set(selected) - {step.name for step in STEPS}
    if unknown:
        parser.error(f"--steps: unknown {sorted(unknown)}; the steps are {[step.name for step in STEPS]}")
    timeouts = parse_timeouts(args.timeout)
    default_out = Path(os.environ["OUT"]) / "gpu-check" if os.environ.get("OUT") else ROOT / "gpu-check-results"
    out = (args.out or default_out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    if args.dry_run:  # the CPU, as CI has it: kernels in Triton's interpreter
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    cuda = not args.dry_run and importlib.util.find_spec("torch") is not None and subprocess.run(
        [PY, "-c", "import sys, torch; sys.exit(not torch.cuda.is_available())"], env=env).returncode == 0
    budget = args.budget if args.budget is not None else DRY_RUN_BUDGET if args.dry_run else 540.0
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, open(out / "steps.log", "a") as log:
        ctx = Context(out=out, dry_run=args.dry_run, cuda=cuda, env=env, tmp=Path(tmp), budget=budget)
        rows = {step.name: ("not selected", None, "") for step in STEPS if step.name not in selected}
        log.write(f"\n##### gpu_check {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
                  f"steps {','.join(selected)}, budget {budget:.0f} s, CUDA {cuda}\n")
        for step in STEPS:
            if step.name not in selected:
                continue
            need = 1.0 if args.dry_run else step.need  # the dry run's steps are all short
            if ctx.left() < need:
                rows[step.name] = ("skipped", None, f"budget: {max(ctx.left(), 0):.0f} s left, needs about {need:.0f}")
                write_summary(ctx, rows)
                continue
            rows[step.name] = ("running", None, "")
            write_summary(ctx, rows)
            log.write(f"\n=== {step.name}\n")
            start = time.monotonic()
            status, note = run_step(step, ctx, min(timeouts.get(step.name, step.timeout), ctx.left()), log)
            log.flush()
            rows[step.name] = (status, time.monotonic() - start, note)
            failed |= status in ("fail", "timeout")
            write_summary(ctx, rows)
            print(f"{step.name}: {status} ({time.monotonic() - start:.1f} s) {note}", flush=True)
    print(f"summary: {out / 'summary.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
