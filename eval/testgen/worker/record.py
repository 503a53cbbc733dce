"""record: the first calls of each target during a real run of the original, saved as replayable inputs."""

from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from .side import block_network


def _snapshot(value: Any) -> Any:
    """A copy that later in-place updates of the run cannot change (tensors detached and cloned)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _snapshot(v) for k, v in value.items()}
    return value


def _call_arguments(frame, drop_self: bool) -> tuple[list, dict]:
    """The arguments of the call that `frame` starts, as (args, kwargs) that replay it."""
    code = frame.f_code
    names = code.co_varnames
    values = frame.f_locals
    count = code.co_argcount
    args = [values[n] for n in names[:count]]
    kwargs = {n: values[n] for n in names[count : count + code.co_kwonlyargcount]}
    index = count + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(values[names[index]])
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[names[index]])
    return (args[1:] if drop_self else args), kwargs


class Recorder:
    """Saves the first call of each target (functions, and `forward` of modules with their
    constructor arguments) while a real run goes on; a profile hook, removed once all are seen."""

    def __init__(self, targets: list[dict], out_dir: Path, script_module: str | None = None):
        self.out_dir = out_dir
        self.script_module = script_module  # the name the script run as __main__ is importable under
        self.wanted: dict[tuple[str, str], dict] = {}
        for item in targets:
            path = os.path.realpath(item["file"])
            if item["kind"] == "module":
                self.wanted[(path, f"{item['target']}.forward")] = item
                self.wanted[(path, f"{item['target']}.__init__")] = item
            else:
                self.wanted[(path, item["target"])] = item
        self.remaining = {f"{t['module']}:{t['target']}" for t in targets}
        self.init_args: dict[int, tuple[list, dict]] = {}
        self.index: dict[str, dict] = {}
        self.paths: dict[str, str] = {}

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        filename = self.paths.get(code.co_filename)
        if filename is None:
            filename = self.paths[code.co_filename] = os.path.realpath(code.co_filename)
        item = self.wanted.get((filename, code.co_qualname))
        if item is None:
            return
        key = f"{item['module']}:{item['target']}"
        if key not in self.remaining:
            return
        try:
            if item["kind"] == "module":
                self._module_call(frame, item, key, code.co_qualname.endswith(".__init__"))
            else:
                args, kwargs = _call_arguments(frame, drop_self=False)
                self._save(key, {"args": _snapshot(args), "kwargs": _snapshot(kwargs)})
        except Exception as exc:  # never break the user's run
            self.index[key] = {"reason": f"recording failed: {type(exc).__name__}: {exc}"}
            self.remaining.discard(key)
        if not self.remaining:
            sys.setprofile(None)

    def _module_call(self, frame, item: dict, key: str, is_init: bool) -> None:
        self_obj = frame.f_locals.get(frame.f_code.co_varnames[0])
        if type(self_obj).__name__ != item["target"]:
            return  # a subclass running this class's code
        args, kwargs = _call_arguments(frame, drop_self=True)
        if is_init:
            self.init_args.setdefault(id(self_obj), (_snapshot(args), _snapshot(kwargs)))
            return
        init_args, init_kwargs = self.init_args.get(id(self_obj), ([], {}))
        self._save(
            key,
            {"init_args": init_args, "init_kwargs": init_kwargs, "args": _snapshot(args), "kwargs": _snapshot(kwargs)},
        )

    def _save(self, key: str, data: dict) -> None:
        import torch

        path = self.out_dir / (key.replace(":", ".") + ".pt")
        if self.script_module:
            adopt_script_objects(self.script_module)
        local = _script_local_class(data)
        if local:
            # pickled by reference to `__main__`, which is another module in the replaying process
            self.index[key] = {
                "reason": f"recorded arguments hold a {local} object, a class defined in the script run as "
                "__main__; it cannot be replayed in another process (move the class into a module)"
            }
            self.remaining.discard(key)
            return
        try:
            torch.save(data, path)
            self.index[key] = {"path": str(path)}
        except Exception as exc:
            path.unlink(missing_ok=True)
            self.index[key] = {"reason": f"recorded arguments cannot be saved ({type(exc).__name__}: {exc})"}
        self.remaining.discard(key)


def adopt_script_objects(module_name: str) -> None:
    """Makes the classes and functions of the script running as `__main__` pickle by reference to
    `module_name` (its importable name), so a recording can be replayed by importing that module."""
    main = sys.modules["__main__"]
    sys.modules.setdefault(module_name, main)
    for value in list(vars(main).values()):
        if isinstance(value, type) or inspect.isfunction(value):
            if getattr(value, "__module__", None) == "__main__":
                value.__module__ = module_name


def _script_local_class(value, depth: int = 0) -> str | None:
    """The name of a class defined in `__main__` found in `value` (containers searched a few levels deep)."""
    if type(value).__module__ == "__main__":
        return type(value).__name__
    if depth < 4 and isinstance(value, (list, tuple, set)):
        items = value
    elif depth < 4 and isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = _script_local_class(item, depth + 1)
        if found:
            return found
    return None


def record(job: dict, argv: list[str]) -> int:
    """Runs `argv` (a script or -m module, with its arguments) under the shim, recording first calls."""
    from xlaport.eval import cuda_to_cpu

    os.environ.setdefault("USE_TORCH_XLA", "0")
    cuda_to_cpu.install()
    out_dir = Path(job["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    block_network()
    recorder = Recorder(job["targets"], out_dir, job.get("script_module"))
    status = 0
    sys.setprofile(recorder)
    try:
        if argv and argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0])), os.getcwd()]  # the script's folder first
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        sys.setprofile(None)
        (out_dir / "index.json").write_text(json.dumps(recorder.index, indent=2))
    return status
