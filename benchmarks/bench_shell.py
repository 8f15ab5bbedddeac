"""The shell tool's cost for a no-op ``true``: in the bubblewrap sandbox, without it, and as weald ran it before.

One call is ``invoke(shell, ctx, {"command": "true"})`` on a trio loop, from
the call to its result (bash started, run, its output captured, its process
group checked and reaped). Contenders, each in a worker process of its own,
in interleaved rounds so that load hits them alike:

- ``before (REF)``: the shell tool of another checkout (default ``main``),
  with process groups only and in its bubblewrap sandbox;
- ``process groups``: this checkout with ``[tools.shell] sandbox = "off"``
  (forked by the spawner thread, with a parent-death signal);
- ``bwrap sandbox``: this checkout with the sandbox on: ``bwrap`` with user,
  PID, IPC and network namespaces, a read-only root, a fresh /dev and /proc,
  a private /tmp and the hidden paths mounted over, the protected paths
  read-only (the project has no ``weald.toml`` or ``.weald``: each call makes
  and removes their placeholders), its options read from a memory file;
- for scale, ``bash -c true`` run by ``subprocess.run`` and by ``bwrap`` with
  the same options, outside weald;
- ``options``: what the sandbox costs weald itself per call, without running
  anything: the bubblewrap options for a project that is a git repository
  without ``weald.toml`` (the hidden and protected paths looked at, the
  placeholders made and removed, the options file written), this checkout
  and ``before`` side by side.

The target: the sandbox costs at most 10 ms more than ``before`` without it.

Run: ``python benchmarks/bench_shell.py [--quick] [--before REF]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, checkout, summary, verdict

TARGET_MS = 10.0


def _worker(mode: str, n: int) -> None:
    """In a worker process: ``n`` timed calls (after a warm-up), printed as JSON milliseconds."""
    import trio
    from weald.tools import SessionServices, ToolConfig, ToolContext, invoke
    from weald.tools.shell import shell

    if mode == "options":
        print(json.dumps(_options_samples(n)))
        return
    if mode in ("subprocess", "bwrap-direct"):
        argv = ["bash", "-c", "true"]
        if mode == "bwrap-direct":
            from weald.tools._bwrap import SandboxPolicy, bwrap_argv, default_hidden_paths, sandbox_status

            project = Path(tempfile.mkdtemp(prefix="bench-shell-"))
            policy = SandboxPolicy(project=project, workdir=project, hidden=default_hidden_paths())
            argv = bwrap_argv(str(sandbox_status().bwrap), policy, argv)
        for _ in range(5):
            subprocess.run(argv, check=True)
        out = []
        for _ in range(n):
            began = time.perf_counter()
            subprocess.run(argv, check=True)
            out.append((time.perf_counter() - began) * 1e3)
        print(json.dumps(out))
        return

    root = Path(tempfile.mkdtemp(prefix="bench-shell-"))
    (root / "project").mkdir()
    options = {"shell": {"sandbox": "off" if mode == "off" else "auto"}}
    ctx = ToolContext(
        working_dir=root / "project",
        session=SessionServices(output_dir=root / "out"),
        config=ToolConfig(options=options),
    )

    async def measure() -> list[float]:
        for _ in range(5):
            assert (await invoke(shell, ctx, {"command": "true"})).ok
        out = []
        for _ in range(n):
            began = time.perf_counter()
            result = await invoke(shell, ctx, {"command": "true"})
            out.append((time.perf_counter() - began) * 1e3)
            assert result.ok, result.output
        if mode == "bwrap":
            assert result.data["sandbox"] == "bwrap", result.data
        return out

    print(json.dumps(trio.run(measure)))
    shutil.rmtree(root, ignore_errors=True)


def _options_samples(n: int) -> list[float]:
    """Milliseconds to make one command's sandbox options (and, where this checkout has them, its placeholders)."""
    from weald.tools import _bwrap

    root = Path(tempfile.mkdtemp(prefix="bench-shell-options-"))
    project = root / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    fields = {"project": project, "workdir": project, "hidden": _bwrap.default_hidden_paths()}

    def once() -> None:
        if not hasattr(_bwrap, "bwrap_options"):  # before: the options on bwrap's command line
            _bwrap.bwrap_argv("bwrap", _bwrap.SandboxPolicy(**fields), ["true"])
            return
        from weald.tools._protected import Placeholders

        placeholders = Placeholders()
        policy = _bwrap.SandboxPolicy(**fields, private=(root / "state",))
        os.close(_bwrap.options_file(_bwrap.bwrap_options(policy, placeholders)))
        placeholders.release()

    for _ in range(20):
        once()
    out = []
    for _ in range(n * 5):
        began = time.perf_counter()
        once()
        out.append((time.perf_counter() - began) * 1e3)
    shutil.rmtree(root, ignore_errors=True)
    return out


def _samples(mode: str, n: int, pythonpath: Path | None) -> list[float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "-n", str(n)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {mode} failed:\n{done.stderr[-3000:]}")
    samples: list[float] = json.loads(done.stdout.strip().splitlines()[-1])
    return samples


def run(quick: bool = False, before: str = "main") -> list[Row]:
    banner(f"bench_shell: a no-op `true` through the shell tool, sandboxed and not, beside {before}")
    rounds, n = (3, 20) if quick else (6, 40)
    baseline = checkout(before, "bench-shell-before-")
    contenders = {
        f"before ({before}), process groups": ("off", baseline / "pkg"),
        f"before ({before}), bwrap sandbox": ("bwrap", baseline / "pkg"),
        "process groups (sandbox off)": ("off", None),
        "bwrap sandbox": ("bwrap", None),
        "bash -c true, subprocess.run": ("subprocess", None),
        "bash -c true in bwrap, subprocess.run": ("bwrap-direct", None),
        f"options, before ({before})": ("options", baseline / "pkg"),
        "options (and placeholders)": ("options", None),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    try:
        for _ in range(rounds):
            for name, (mode, path) in contenders.items():
                samples[name].extend(_samples(mode, n, path))
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    p90 = {name: sorted(values)[int(len(values) * 0.9)] for name, values in samples.items()}
    base = medians[f"before ({before}), process groups"]
    print(f"\n{'one shell call of `true`':<44}{'median':>10}{'p90':>10}{'vs before':>12}")
    for name in contenders:
        print(f"{name:<44}{medians[name]:>7.2f} ms{p90[name]:>7.2f} ms{medians[name] - base:>+9.2f} ms")
    sandbox = medians["bwrap sandbox"]
    groups = medians["process groups (sandbox off)"]
    rows = [
        Row(
            "shell",
            "`true` in the bwrap sandbox, minus before",
            sandbox - base,
            "ms",
            f"<= {TARGET_MS:g} ms",
            verdict(sandbox - base, "<=", TARGET_MS),
            f"{sandbox:.2f} ms against {base:.2f} ms ({before})",
        ),
        Row(
            "shell",
            "`true` with process groups, minus before",
            groups - base,
            "ms",
            note=f"{groups:.2f} ms (the parent-death signal costs an exec of setpriv)",
        ),
        Row(
            "shell",
            "`true` in the bwrap sandbox, minus before's sandbox",
            sandbox - medians[f"before ({before}), bwrap sandbox"],
            "ms",
            note=f"{sandbox:.2f} ms against {medians[f'before ({before}), bwrap sandbox']:.2f} ms",
        ),
        Row("shell", "bwrap itself (outside weald)", medians["bash -c true in bwrap, subprocess.run"], "ms"),
        Row(
            "shell",
            "making one command's sandbox options, minus before",
            medians["options (and placeholders)"] - medians[f"options, before ({before})"],
            "ms",
            note=f"{medians['options (and placeholders)']:.2f} ms against "
            f"{medians[f'options, before ({before})']:.2f} ms",
        ),
    ]
    return summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--before", default="main", help="the git ref to compare with (default: main)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=40, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.n)
    else:
        run(quick=args.quick, before=args.before)


if __name__ == "__main__":
    main()
