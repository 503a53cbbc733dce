"""The child side of `xlaport check`: runs one unmodified script under torch_xla and records per-step metrics.

Usage (eval/check/run.py starts it by path through the sandbox): `python runner.py SCRIPT [ARGS...]` with
`XLAPORT_CHECK_OUT` naming the JSON-lines file to write. Only the standard library, torch, torch_xla and
the check's own light modules (the probe in probe.py) are used here, so the child pays for nothing else.

How it measures without changing what the script computes:
- Nothing is patched until the script itself imports torch_xla (an import hook waits for it), so a
  script that never imports it runs untouched and the time until then is "start-up".
- A step ends at each `torch_xla.sync()`. `xm.mark_step()`, `MpDeviceLoader` and
  `xm.optimizer_step(..., barrier=True)` all call it, so wrapping `torch_xla.sync` counts each once.
  A sync with no graph run since the last step (nothing pending: e.g. the loader's sync before its first
  batch, or a second barrier right after a first) is not a step; its counters roll into the next one.
- Counters are read after each sync; reads made by `xm.add_step_closure` closures (which run inside the
  sync, on values already computed) are measured separately and not charged to the step.
- Every wrapper calls the original with the same arguments. The only added device work (the NaN/Inf
  check of the parameters and of the last loss) runs once at exit, after the final counter snapshot.
- Worker processes (`torch_xla.launch`, `xmp.spawn`, any Python child) get the same probe through a
  `sitecustomize.py` put first on their PYTHONPATH; every event carries its process id.
- Fail fast: a watchdog thread reads the counters a few times a second (reads only) and kills the run's
  process group as soon as the loop shows it can never end a step on the XLA device: STALL_STEPS
  optimizer steps with no step barrier in between (the graph grows each iteration; typical when the step
  goes through GradScaler.step), compilations of ever-larger graphs with no barrier, or OFF_XLA_STEPS
  optimizer steps on parameters that are not on the XLA device. It writes a "stopped" event with the
  reason first, and a heartbeat each second so a run killed from outside still says how far it got.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import runpy
import sys

from xlaport.eval.check.probe import Probe, Recorder, StepLimitReached

RUNNER_FILE = os.path.abspath(__file__)
MAIN_PID_VAR = "XLAPORT_CHECK_MAIN_PID"  # set by the runner for its descendants
SITECUSTOMIZE = """\
# Written by xlaport check: loads its probe into Python processes that the checked script starts.
import importlib.util, os, sys
if os.environ.get("{main_pid_var}") and os.environ["{main_pid_var}"] != str(os.getpid()):
    _spec = importlib.util.spec_from_file_location("_xlaport_check_runner", {runner!r})
    _runner = importlib.util.module_from_spec(_spec)
    sys.modules["_xlaport_check_runner"] = _runner
    _spec.loader.exec_module(_runner)
    _runner.install_in_worker()
# then the sitecustomize this one hides (another tool's hook), as if this one were not there
if {site_dir!r} in sys.path:
    sys.path.remove({site_dir!r})
_this = sys.modules.pop("sitecustomize")
try:
    import sitecustomize
except ImportError:
    sys.modules["sitecustomize"] = _this
"""


class TorchXlaImportHook(importlib.abc.MetaPathFinder):
    """Calls `on_import` right after `import torch_xla` finishes, whoever imports it."""

    def __init__(self, on_import) -> None:
        self.on_import = on_import

    def find_spec(self, name, path=None, target=None):
        if name != "torch_xla":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        on_import = self.on_import

        def exec_then_hook(module):
            exec_module(module)
            on_import()

        spec.loader.exec_module = exec_then_hook
        return spec


def _install(recorder: Recorder, at_exit: bool) -> list[Probe]:
    """Patches torch_xla in this process as soon as something imports it."""
    probes: list[Probe] = []

    def on_torch_xla_imported() -> None:
        try:
            probe = Probe(recorder)
            probe.install()
        except Exception as exc:  # a probe bug must not break the script: it runs unmeasured
            recorder.emit("probe_error", error=f"{type(exc).__name__}: {exc}")
            return
        probes.append(probe)
        if at_exit:  # a worker's script code ends inside multiprocessing, not in our main()
            atexit.register(probe.finish)
        recorder.emit("torch_xla_imported")

    sys.meta_path.insert(0, TorchXlaImportHook(on_torch_xla_imported))
    return probes


def install_in_worker() -> None:
    """Entry point for the sitecustomize of processes started by the checked script."""
    recorder = Recorder(os.environ["XLAPORT_CHECK_OUT"])
    recorder.emit("worker_start", parent=os.environ.get(MAIN_PID_VAR))
    _install(recorder, at_exit=True)


def _hook_workers(out_path: str) -> None:
    """Puts a sitecustomize.py first on PYTHONPATH so Python children load the probe too."""
    site_dir = os.path.join(os.path.dirname(os.path.abspath(out_path)), "site")
    os.makedirs(site_dir, exist_ok=True)
    source = SITECUSTOMIZE.format(main_pid_var=MAIN_PID_VAR, runner=RUNNER_FILE, site_dir=site_dir)
    with open(os.path.join(site_dir, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(source)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site_dir, os.environ.get("PYTHONPATH")) if p)
    os.environ[MAIN_PID_VAR] = str(os.getpid())


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: runner.py SCRIPT [ARGS...] | runner.py -m MODULE [ARGS...]")
    out_path = os.environ["XLAPORT_CHECK_OUT"]
    recorder = Recorder(out_path)
    recorder.emit("start")
    _hook_workers(out_path)
    probes = _install(recorder, at_exit=False)
    module = sys.argv[2] if sys.argv[1] == "-m" and len(sys.argv) > 2 else None
    if module is not None:
        sys.argv = [module, *sys.argv[3:]]  # run_module puts the module's file first, as `python -m` does
        sys.path[0] = os.getcwd()  # as `python -m MODULE` would have it: sibling packages import
    else:
        script = os.path.abspath(sys.argv[1])
        sys.argv = [script, *sys.argv[2:]]
        sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` would have it
    recorder.emit("script_start")
    outcome: object = None
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except StepLimitReached as exc:  # the check asked for this many steps: a clean end, not the script's error
        outcome = f"stopped after {exc.args[0]} steps (--max-steps)"
    except SystemExit as exc:
        outcome = exc.code
        raise
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        recorder.emit("script_end", outcome=repr(outcome))
        if probes:
            probes[0].finish(outcome)


if __name__ == "__main__":
    main()
