"""probe: synthesize inputs for targets from signatures and first layers, and try them once on the ORIGINAL."""

from __future__ import annotations

import importlib
import inspect
import signal
from typing import Any

from .side import enter_project
from .values import MARK, flatten, load_inputs, to_side, weighted_sum

TRIAL_TIMEOUT_S = 60
BATCH = 4


# forward/function parameter names that mean "integer ids" or "class labels"
ID_NAMES = {"idx", "ids", "input_ids", "tokens", "token_ids", "indices"}
LABEL_NAMES = {"y", "target", "targets", "label", "labels"}


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


def _tried(inputs: dict, call, note: str, what: str) -> dict:
    """{"inputs", "note"} when one trial of `call` on `inputs` works, else {"reason"}: `what` ({shown}: the
    inputs) raised."""
    try:
        _trial(inputs, call)
    except Exception as exc:
        shown = ", ".join(_describe(a) for a in inputs["args"])
        return {
            "reason": f"{what.format(shown=shown)} raised {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (record a real run with --record)"
        }
    return {"inputs": inputs, "note": note}


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
    return _tried(inputs, lambda _inputs, a, k: model(*a, **k), note, "forward({shown}) on synthesized inputs")


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
    return _tried(
        inputs,
        lambda _inputs, a, k: func(*a, **k),
        "synthesized from the signature",
        "calling it with synthesized inputs ({shown})",
    )


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
