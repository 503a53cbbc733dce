"""The child-process side of `xlaport testgen`: runs user code, so xlaport's own process never imports it.

    python -m xlaport.eval.testgen_worker run JOB.json      one side of the differential tests of one file
    python -m xlaport.eval.testgen_worker probe JOB.json    synthesize and trial inputs for targets (ORIGINAL)
    python -m xlaport.eval.testgen_worker record JOB.json -- SCRIPT ARGS... | -m MODULE ARGS...

The ORIGINAL side runs with the CUDA→CPU shim and never imports torch_xla; the MIGRATED side runs on
`torch_xla.device()`. Inputs are built on the CPU from a seed (or loaded from a recording) and only then
moved to the side's device, so both sides see the same numbers.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import runpy
import signal
import socket
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xlaport.eval.tied_weights import shared_groups

MARK = "__xlaport__"  # key of an input spec dict (a literal dict argument never has it)
TRIAL_TIMEOUT_S = 60
BATCH = 4
INPUT_KEYS = {"init_args": list, "init_kwargs": dict, "args": list, "kwargs": dict}  # in materializing order

# forward/function parameter names that mean "integer ids" or "class labels"
ID_NAMES = {"idx", "ids", "input_ids", "tokens", "token_ids", "indices"}
LABEL_NAMES = {"y", "target", "targets", "label", "labels"}


# ---------------------------------------------------------------- inputs


def materialize(value: Any, generator) -> Any:
    """Turns input specs into CPU tensors, in order, from one seeded generator."""
    import torch

    if isinstance(value, dict) and MARK in value:
        kind = value[MARK]
        if kind == "randn":
            dtype = getattr(torch, value.get("dtype", "float32"))
            return torch.randn(value["shape"], generator=generator).to(dtype)
        if kind == "randint":
            return torch.randint(value["low"], value["high"], value["shape"], generator=generator)
        if kind == "device":
            return value  # replaced per side by to_side
        raise ValueError(f"unknown input spec {kind!r}")
    if isinstance(value, list):
        return [materialize(v, generator) for v in value]
    if isinstance(value, dict):
        return {k: materialize(v, generator) for k, v in value.items()}
    return value


def load_inputs(spec: dict, seed: int) -> dict:
    """{"args", "kwargs", "init_args", "init_kwargs"} on the CPU, from a spec or a recording."""
    import torch

    if spec.get("recorded"):
        # the user's own recording (it may hold arbitrary picklable objects, so not weights_only)
        data = torch.load(spec["recorded"], map_location="cpu", weights_only=False)
    else:
        generator = torch.Generator().manual_seed(seed)
        data = {key: materialize(spec.get(key) or empty(), generator) for key, empty in INPUT_KEYS.items()}
    return {key: data.get(key) or empty() for key, empty in INPUT_KEYS.items()}


def to_side(value: Any, device, device_arg: Any) -> Any:
    """Moves tensors (and modules) to the side's device; the device marker becomes `device_arg`."""
    import torch

    if isinstance(value, dict) and value.get(MARK) == "device":
        return device_arg
    if isinstance(value, torch.device) and value.type in ("cuda", "cpu"):
        # a device recorded under the shim, where the CPU stands for CUDA: the side's device
        return device_arg if isinstance(device_arg, torch.device) else torch.device(device_arg)
    if isinstance(value, torch.Tensor | torch.nn.Module):
        return value.to(device)
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(to_side(v, device, device_arg) for v in value)
    if isinstance(value, dict):
        return {k: to_side(v, device, device_arg) for k, v in value.items()}
    return value


def module_parameters(values: list) -> list[tuple[Any, list]]:
    """(module, its parameters) for the modules among `values`, taken before they move."""
    import torch

    return [(v, list(v.named_parameters(remove_duplicate=False))) for v in values if isinstance(v, torch.nn.Module)]


def follow_moved_parameters(values: list, before: list[tuple[Any, list]]) -> None:
    """Optimizers among the arguments hold the parameters of module arguments; a move to XLA replaced
    those by new ones, so point the optimizers at the moved parameters (as building them after the move would)."""
    import torch

    new_by_old = {}
    for module, params in before:
        now = dict(module.named_parameters(remove_duplicate=False))
        new_by_old.update({id(p): now[name] for name, p in params if name in now})
    for value in values:
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                group["params"] = [new_by_old.get(id(p), p) for p in group["params"]]


def draws_random_numbers(module) -> bool:
    """Dropout layers with p > 0: the two sides' generators differ, so their results cannot match."""
    import torch.nn as nn

    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


# ---------------------------------------------------------------- outputs


def flatten(value: Any, path: str, into: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """{"output[0]": tensor, "output['loss']": 1.5, ...}: every leaf under a readable path."""
    import torch

    if depth > 8:
        into[path] = f"<{type(value).__name__}>"
    elif isinstance(value, torch.Tensor):
        into[path] = value
    elif value is None or isinstance(value, bool | int | float | str | complex):
        into[path] = value
    elif isinstance(value, torch.Size):
        into[path] = list(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            flatten(item, f"{path}[{key!r}]", into, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            flatten(getattr(value, field.name), f"{path}.{field.name}", into, depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            flatten(item, f"{path}[{i}]", into, depth + 1)
    else:
        into[path] = f"<{type(value).__name__}>"  # devices, modules, custom objects: compared by type only
    return into


def weighted_sum(outputs: dict[str, Any], seed: int):
    """sum(output * fixed random weights) over the float outputs that need grad (a plain sum gives
    zero gradients through softmax-like outputs)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    total = None
    for value in outputs.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad:
            weights = torch.randn(value.shape, generator=generator).to(value.device)
            term = (value.float() * weights).sum()
            total = term if total is None else total + term
    return total


# ---------------------------------------------------------------- one side of a test


def enter_project(root: str, argv: list[str]) -> None:
    """The working directory, sys.path and sys.argv that the recorded command saw: the tree root as the
    working directory, the script's folder first on sys.path, the command's arguments in sys.argv."""
    os.chdir(root)
    sys.path.insert(0, root)
    if argv and argv[0] != "-m":
        sys.path.insert(0, os.path.join(root, os.path.dirname(argv[0])))
    sys.argv = list(argv[1:] if argv[:1] == ["-m"] else argv) or [""]


class NetworkBlocked(OSError):
    """User code tried to reach the network while testgen ran it."""


def block_network() -> None:
    """Makes every connection to a non-local address fail: importing or replaying user code must not
    download anything (a data-preparation module fetching a data set, a model hub). The sandbox's network
    namespace already does this where Linux allows it; this holds where it does not."""

    def refuse(address) -> None:
        host = address[0] if isinstance(address, tuple) and address else address
        if isinstance(host, str) and (host in ("localhost", "::1") or host.startswith("127.")):
            return
        raise NetworkBlocked(f"network access is blocked while xlaport testgen runs user code (to {address!r})")

    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(address)
        return original_connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(address)
        return original_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


def _import(root: str, module: str, argv: list[str]):
    enter_project(root, argv)
    return importlib.import_module(module)


def _side_setup(side: str):
    """(device, device argument) for the side; installs the shim on the original side."""
    import torch

    if side == "original":
        from xlaport.eval import cuda_to_cpu

        cuda_to_cpu.install()
        return torch.device("cpu"), "cuda"
    import torch_xla
    import torch_xla.backends

    torch_xla.backends.set_mat_mul_precision("highest")  # on a TPU, fp32 matmuls otherwise use bf16 passes
    device = torch_xla.device()
    return device, device


def run_side(job: dict) -> dict:
    """Runs every case of the job on this side; {case name: {"outputs", "grads", "error"}} with CPU tensors."""
    results: dict[str, dict] = {}
    try:
        device, device_arg = _side_setup(job["side"])
        module = _import(job["root"], job["module"], job.get("argv", []))
    except BaseException as exc:  # noqa: BLE001 - import-time code is the user's
        error = _error_text(exc)
        return {case["name"]: {"outputs": {}, "grads": {}, "error": error} for case in job["cases"]}
    for case in job["cases"]:
        results[case["name"]] = run_case(job["side"], module, case, job["seed"], device, device_arg)
    return results


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc().splitlines(True)[-12:])


def run_case(side: str, module, case: dict, seed: int, device, device_arg) -> dict:
    """One target on this side: a module is built under `seed` (the migrated one then gets the
    original's weights), run in eval(), and back-propagated once through `weighted_sum`."""
    import torch

    result: dict[str, Any] = {"outputs": {}, "grads": {}, "error": None, "sharing": [], "notes": []}
    try:
        target = getattr(module, case["target"])
        inputs = load_inputs(case["inputs"], seed)
        if case["kind"] == "module":
            torch.manual_seed(seed)
            init_args = to_side(inputs["init_args"], "cpu", device_arg)
            init_kwargs = to_side(inputs["init_kwargs"], "cpu", device_arg)
            model = target(*init_args, **init_kwargs)
            if side == "original":
                torch.save(model.state_dict(), case["weights"])
            else:
                state = torch.load(case["weights"], map_location="cpu", weights_only=True)
                model.load_state_dict(state, strict=True)  # names must match: the migration kept the module
            model = model.to(device).eval()  # eval(): dropout would make the comparison random
            result["sharing"] = shared_groups(model)  # a move to XLA may untie weights (kb XLA314)
            args = to_side(inputs["args"], device, device_arg)
            kwargs = to_side(inputs["kwargs"], device, device_arg)
            outputs = flatten(model(*args, **kwargs), "output", {})
            loss = weighted_sum(outputs, seed)
            if loss is not None:
                loss.backward()
            result["grads"] = {f"grad[{name}]": p.grad for name, p in model.named_parameters() if p.grad is not None}
        else:
            torch.manual_seed(seed)
            before = module_parameters([*inputs["args"], *inputs["kwargs"].values()])
            args = to_side(inputs["args"], device, device_arg)
            kwargs = to_side(inputs["kwargs"], device, device_arg)
            follow_moved_parameters([*args, *kwargs.values()], before)
            outputs = flatten(target(*args, **kwargs), "output", {})
            # in-place changes to tensor arguments are results too, and so are the parameters of module
            # arguments (a training function's optimizer step) unless dropout draws on the device's generator
            for key, value in flatten(args, "args", {}).items():
                if isinstance(value, torch.Tensor):
                    outputs[f"{key} after the call"] = value
            for i, arg in enumerate(args):
                if isinstance(arg, torch.nn.Module):
                    if draws_random_numbers(arg):
                        result["notes"].append(
                            f"args[{i}] ({type(arg).__name__}) has dropout: its parameters after the call are not compared"
                        )
                        continue
                    for name, param in arg.named_parameters():
                        outputs[f"args[{i}].{name} after the call"] = param
        result["outputs"] = outputs
    except BaseException as exc:  # noqa: BLE001 - report anything the user code raised
        result["error"] = _error_text(exc)
    return _to_cpu(result)


def _to_cpu(result: dict) -> dict:
    import torch

    def cpu(value):
        return value.detach().cpu() if isinstance(value, torch.Tensor) else value

    try:
        result["outputs"] = {k: cpu(v) for k, v in result["outputs"].items()}
        result["grads"] = {k: cpu(v) for k, v in result["grads"].items()}
    except Exception as exc:  # a device error surfaces at the first read
        result["error"] = result["error"] or f"{type(exc).__name__} while reading results: {exc}"
        result["outputs"], result["grads"] = {}, {}
    return result


# ---------------------------------------------------------------- probe: synthesize inputs (ORIGINAL side)


def randn_spec(*shape: int) -> dict:
    return {MARK: "randn", "shape": list(shape), "dtype": "float32"}


def randint_spec(low: int, high: int, shape: tuple[int, ...] | list[int]) -> dict:
    return {MARK: "randint", "low": low, "high": high, "shape": list(shape)}


def _annotation_text(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)


def _literal_for(annotation: Any) -> Any:
    names = {int: 4, float: 0.5, bool: False, "int": 4, "float": 0.5, "bool": False}
    return names.get(annotation, inspect.Parameter.empty)


def _first_layer_input(model) -> tuple[dict, str, int] | None:
    """(input spec, explanation, size of the id vocabulary or 0) from the first layer with known input size."""
    import torch.nn as nn

    for layer in model.modules():
        shown = repr(layer).split("\n")[0]
        if isinstance(layer, nn.Linear):
            return randn_spec(BATCH, layer.in_features), f"first layer {shown}", 0
        if isinstance(layer, nn.Embedding | nn.EmbeddingBag):
            return randint_spec(0, layer.num_embeddings, (2, 8)), f"first layer {shown}", layer.num_embeddings
        if isinstance(layer, nn.modules.conv._ConvNd):
            spatial = {1: (32,), 2: (16, 16), 3: (8, 8, 8)}[len(layer.kernel_size)]
            return randn_spec(2, layer.in_channels, *spatial), f"first layer {shown}", 0
        if isinstance(layer, nn.LayerNorm):
            return randn_spec(2, 8, *layer.normalized_shape), f"first layer {shown}", 0
        if isinstance(layer, nn.BatchNorm1d):
            return randn_spec(BATCH, layer.num_features), f"first layer {shown}", 0
        if isinstance(layer, nn.BatchNorm2d | nn.GroupNorm):
            channels = getattr(layer, "num_features", None) or layer.num_channels
            return randn_spec(2, channels, 16, 16), f"first layer {shown}", 0
        if isinstance(layer, nn.RNNBase):
            shape = (2, 8, layer.input_size) if layer.batch_first else (8, 2, layer.input_size)
            return randn_spec(*shape), f"first layer {shown}", 0
    return None


def _last_linear_out(model) -> int:
    import torch.nn as nn

    outs = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)]
    return outs[-1] if outs else 2


def _param_spec(param: inspect.Parameter, first: dict | None, vocab: int, classes: int) -> Any:
    """A spec for one required parameter from its name and annotation; empty when there is none."""
    name = param.name.lower()
    literal = _literal_for(param.annotation)
    if literal is not inspect.Parameter.empty:
        return literal
    if (
        param.annotation not in (inspect.Parameter.empty, "Tensor", "torch.Tensor")
        and getattr(param.annotation, "__name__", "") != "Tensor"
    ):
        return inspect.Parameter.empty
    if name == "device":
        return {MARK: "device"}
    if name in ID_NAMES:
        return randint_spec(0, vocab or 16, (2, 8))
    if name in LABEL_NAMES:
        # one class id (< the last layer's width) per id of the input, or per row of a float input
        if first is not None and first[MARK] == "randint":
            return randint_spec(0, classes, first["shape"])
        batch = first["shape"][0] if first is not None else BATCH
        return randint_spec(0, classes, (batch,))
    if first is not None and first[MARK] == "randn":
        return dict(first)
    return randn_spec(BATCH, 8)


def _required(signature: inspect.Signature, skip_first: bool) -> list[inspect.Parameter]:
    params = list(signature.parameters.values())[1 if skip_first else 0 :]
    return [
        p for p in params if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _describe(spec: Any) -> str:
    if isinstance(spec, dict) and spec.get(MARK) == "randn":
        return f"randn{tuple(spec['shape'])}"
    if isinstance(spec, dict) and spec.get(MARK) == "randint":
        return f"randint({spec['low']}, {spec['high']}, {tuple(spec['shape'])})"
    return repr(spec)


def _trial(job_side_inputs: dict, call) -> None:
    """Runs the target once on synthesized inputs (forward and backward) under a time limit."""
    import torch

    def on_alarm(signum, frame):
        raise TimeoutError(f"no result within {TRIAL_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TRIAL_TIMEOUT_S)
    try:
        inputs = load_inputs(job_side_inputs, 0)
        args = to_side(inputs["args"], "cpu", "cuda")
        kwargs = to_side(inputs["kwargs"], "cpu", "cuda")
        outputs = flatten(call(inputs, args, kwargs), "output", {})
        loss = weighted_sum(outputs, 0)
        if loss is not None:
            loss.backward()
        if not any(isinstance(v, torch.Tensor | float | int) for v in outputs.values()) and not any(
            isinstance(a, torch.Tensor) for a in flatten(args, "args", {}).values()
        ):
            raise ValueError("returns nothing to compare (no tensor or number) and takes no tensor")
    finally:
        signal.alarm(0)


def probe_module(cls, seed: int) -> dict:
    import torch
    import torch.nn as nn

    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return {"reason": "not an nn.Module subclass at run time"}
    init_kwargs = {}
    missing = []
    for p in _required(inspect.signature(cls.__init__), skip_first=True):
        value = _literal_for(p.annotation)
        if value is inspect.Parameter.empty:
            missing.append(p.name)
        init_kwargs[p.name] = value
    if missing:
        return {
            "reason": f"constructor needs argument(s) {', '.join(missing)} that cannot be synthesized "
            f"(record a real run with --record)"
        }
    torch.manual_seed(seed)
    try:
        model = cls(**init_kwargs).eval()
    except Exception as exc:
        return {
            "reason": f"constructing {cls.__name__}({_kwargs_text(init_kwargs)}) raised {type(exc).__name__}: {exc}"
        }
    required = _required(inspect.signature(model.forward), skip_first=False)
    if not required:
        return {"reason": "forward() takes no required input"}
    found = _first_layer_input(model)
    first, note, vocab = found if found else (None, "", 0)
    args: list[Any] = []
    for i, p in enumerate(required):
        spec = first if i == 0 and first is not None else _param_spec(p, first, vocab, _last_linear_out(model))
        if spec is inspect.Parameter.empty:
            return {
                "reason": f"cannot synthesize forward argument {p.name!r} (annotation {_annotation_text(p.annotation)}); use --record"
            }
        if i == 0 and first is None:
            first = spec if isinstance(spec, dict) else None
            note = "no layer with a known input size; guessed from the parameter name"
        args.append(spec)
    inputs = {"init_kwargs": init_kwargs, "args": args}
    try:
        _trial(inputs, lambda _inputs, a, k: model(*a, **k))
    except Exception as exc:
        shown = ", ".join(_describe(a) for a in args)
        return {
            "reason": f"forward({shown}) on synthesized inputs raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (record a real run with --record)"
        }
    return {"inputs": inputs, "note": note}


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def probe_function(func) -> dict:
    if not callable(func) or isinstance(func, type):
        return {"reason": "not a function at run time"}
    if inspect.isgeneratorfunction(func) or inspect.iscoroutinefunction(func):
        return {"reason": "generator or coroutine function: only plain functions are driven"}
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        return {"reason": f"no signature: {exc}"}
    args: list[Any] = []
    first = None
    for p in _required(signature, skip_first=False):
        spec = _param_spec(p, first, 0, 8)
        if spec is inspect.Parameter.empty:
            return {
                "reason": f"cannot synthesize argument {p.name!r} (annotation {_annotation_text(p.annotation)}); use --record"
            }
        if p.kind == p.KEYWORD_ONLY:
            return {"reason": f"keyword-only argument {p.name!r} cannot be synthesized; use --record"}
        if first is None and isinstance(spec, dict) and spec.get(MARK) in ("randn", "randint"):
            first = spec
        args.append(spec)
    inputs = {"args": args}
    try:
        _trial(inputs, lambda _inputs, a, k: func(*a, **k))
    except Exception as exc:
        shown = ", ".join(_describe(a) for a in args)
        return {
            "reason": f"calling it with synthesized inputs ({shown}) raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (record a real run with --record)"
        }
    return {"inputs": inputs, "note": "synthesized from the signature"}


def probe(job: dict) -> dict:
    """{"module:target": {"inputs": spec, "note": str} | {"reason": str}} for every target."""
    from xlaport.eval import cuda_to_cpu

    cuda_to_cpu.install()
    enter_project(job["root"], job.get("argv", []))
    found: dict[str, dict] = {}
    for item in job["targets"]:
        key = f"{item['module']}:{item['target']}"
        try:
            obj = getattr(importlib.import_module(item["module"]), item["target"])
        except BaseException as exc:  # noqa: BLE001 - import-time code is the user's
            found[key] = {"reason": f"importing the original raised {type(exc).__name__}: {exc}"}
            continue
        try:
            found[key] = probe_module(obj, job["seed"]) if item["kind"] == "module" else probe_function(obj)
        except BaseException as exc:  # noqa: BLE001
            found[key] = {"reason": f"probing raised {type(exc).__name__}: {exc}"}
    return found


# ---------------------------------------------------------------- record: first calls of a real run


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


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("run", "probe", "record"):
        print(__doc__, file=sys.stderr)
        return 2
    command, job_path = argv[0], Path(argv[1])
    job = json.loads(job_path.read_text())
    if command != "run" or job["side"] == "original":
        os.environ.setdefault("USE_TORCH_XLA", "0")  # accelerate & co. would import torch_xla
    if command == "record":
        rest = argv[2:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return record(job, rest)
    block_network()
    if command == "probe":
        Path(job["result"]).write_text(json.dumps(probe(job), indent=2))
        return 0
    import torch

    torch.save(run_side(job), job["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
