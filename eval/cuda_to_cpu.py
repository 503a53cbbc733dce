"""Runs CUDA-era PyTorch code unchanged on a CPU-only machine, so that it can serve as the reference.

`install()` patches torch in the current process; `python -m xlaport.eval.cuda_to_cpu SCRIPT [ARGS...]`
(or `-m MODULE [ARGS...]`) installs it and runs the script as `__main__`.

What "CUDA" means under the shim: the CPU. Decisions, chosen to keep the ORIGINAL program's path and
its numerics as close as the CPU allows:

- `torch.cuda.is_available()` is True, so code takes its CUDA branch; every CUDA device is the CPU
  (`device_count()` is 1, `current_device()` is 0).
- Tensors: factories with `device="cuda"`, `.cuda()`, `.to("cuda")`, `.to(0)`, `torch.device("cuda")`
  used as a context manager or default device all land on the CPU. This goes through a
  `TorchFunctionMode`, which sees every torch call of the thread that called `install()`.
- fp16 autocast (the default dtype of CUDA autocast) is turned off: the program runs in fp32. CUDA's
  fp16 autocast keeps fp32 accumulation, so fp32 is its closest CPU equivalent; CPU fp16 kernels round
  differently and are slow. bf16 autocast becomes CPU bf16 autocast (same rounding of inputs).
  TF32 flags are accepted and ignored: the reference is full fp32.
- `GradScaler` is disabled: scale is 1, `scale(loss)` returns the loss, `step(opt)` calls `opt.step()`.
- `torch.cuda.manual_seed(_all)` seeds the CPU generator (the "CUDA" generator is the CPU one);
  random numbers therefore differ from a real GPU's, but runs are reproducible.
- `dist.init_process_group("nccl")` uses gloo; `DistributedDataParallel(device_ids=...)` drops the ids;
  `nn.DataParallel` wraps the module as it does on a machine without a GPU (forward calls the module).
- `torch.load` of CUDA checkpoints maps them to the CPU.
- `torch.accelerator` reports CUDA (one device); `DataLoader(pin_memory=True)` does not pin.
- `torch.cuda.synchronize/empty_cache/set_device/memory_*/Event` are CPU equivalents or no-ops;
  `pin_memory()` returns the tensor itself; `torch.backends.cudnn` flags already work on the CPU.

- Legacy `torch.cuda.FloatTensor`-style types are the CPU ones (`torch.FloatTensor`, ...).

Not covered (fails or differs loudly): tensors still report `is_cuda == False` and
`device.type == "cpu"`; `x.type("torch.cuda.FloatTensor")` by string; CUDA streams and graphs; custom CUDA
kernels/extensions (triton, apex); tensors created in other threads than the installing one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import runpy
import sys
import time
import types
from typing import Any

import torch
import torch.cuda.amp
import torch.distributed as dist
import torch.nn.parallel
import torch.utils.data
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_installed: dict[str, Any] = {}


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def _map_device(device: object) -> object:
    """A CUDA device (or a bare index, which torch reads as a CUDA ordinal) becomes the CPU."""
    if _is_cuda(device) or (isinstance(device, int) and not isinstance(device, bool)):
        return _CPU
    return device


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA devices to the CPU in every torch call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            return args[0].to(_CPU)
        if name == "pin_memory" and args and isinstance(args[0], torch.Tensor):
            return args[0]
        kwargs.pop("pin_memory", None)  # factories: pinned memory needs a real GPU
        if "device" in kwargs:
            kwargs["device"] = _map_device(kwargs["device"])
        if name == "to" and len(args) > 1:
            # Tensor.to(0) means cuda:0; elsewhere ints are sizes, so only `to` maps them
            args = (args[0], _map_device(args[1]), *args[2:])
        # a device name stays a name: `torch.device("cuda", 0)` becomes `torch.device("cpu", 0)`
        args = tuple((("cpu" if isinstance(a, str) else _CPU) if _is_cuda(a) else a) for a in args)
        return func(*args, **kwargs)


def _cpu_autocast_args(dtype: torch.dtype | None, enabled: bool) -> tuple[str, torch.dtype, bool]:
    dtype = dtype or torch.float16  # CUDA autocast's default
    if dtype == torch.bfloat16:
        return "cpu", torch.bfloat16, enabled
    return "cpu", torch.bfloat16, False  # fp16 on CUDA ≈ fp32 on the CPU (see module docstring)


class _Autocast(torch.amp.autocast_mode.autocast):
    """`torch.autocast` that turns a CUDA request into its CPU counterpart."""

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True, cache_enabled=None):
        if device_type == "cuda":
            device_type, dtype, enabled = _cpu_autocast_args(dtype, enabled)
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _CudaAmpAutocast(_Autocast):
    """`torch.cuda.amp.autocast(enabled, dtype, cache_enabled)`."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _DisabledGradScaler(torch.amp.GradScaler):
    """A GradScaler that never scales: scale(loss) is loss, step(opt) is opt.step()."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__("cpu", enabled=False)


class _CudaAmpGradScaler(_DisabledGradScaler):
    pass


class _Event:
    """`torch.cuda.Event` on the host clock: record() notes the time, elapsed_time() gives ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self._time: float | None = None

    def record(self, stream: object = None) -> None:
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        if self._time is None or end._time is None:
            raise RuntimeError("Event.elapsed_time: both events must be recorded first")
        return (end._time - self._time) * 1000.0


class _DeviceContext(contextlib.nullcontext):
    """`torch.cuda.device(i)`: there is only one device."""

    def __init__(self, device: object = None):
        super().__init__()


def _cuda_functions() -> dict[str, Any]:
    def seed_cpu(seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    def properties(device: object = None) -> Any:
        return types.SimpleNamespace(
            name="cpu (xlaport cuda_to_cpu shim)", major=8, minor=0, total_memory=0, multi_processor_count=1
        )

    zero = lambda *args, **kwargs: 0  # noqa: E731
    nothing = lambda *args, **kwargs: None  # noqa: E731
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        # optimizers ask this on their CUDA path (graph capture never happens on the CPU)
        "is_current_stream_capturing": lambda: False,
        "init": nothing,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": nothing,
        "device": _DeviceContext,
        "get_device_name": lambda device=None: "cpu (xlaport cuda_to_cpu shim)",
        "get_device_capability": lambda device=None: (8, 0),
        "get_device_properties": properties,
        "is_bf16_supported": lambda *args, **kwargs: True,
        "synchronize": nothing,
        "empty_cache": nothing,
        "ipc_collect": nothing,
        "manual_seed": seed_cpu,
        "manual_seed_all": seed_cpu,
        "seed": lambda: torch.seed(),
        "seed_all": lambda: torch.seed(),
        "initial_seed": lambda: torch.initial_seed(),
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda state, device="cuda": torch.set_rng_state(state),
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state_all": lambda states: torch.set_rng_state(states[0]),
        "memory_allocated": zero,
        "max_memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_reserved": zero,
        "memory_cached": zero,
        "reset_peak_memory_stats": nothing,
        "reset_max_memory_allocated": nothing,
        "mem_get_info": lambda device=None: (0, 0),
        "memory_summary": lambda *args, **kwargs: "cuda_to_cpu shim: no CUDA memory",
        "Event": _Event,
    }


def _init_process_group(real, backend: str | None = None, *args: Any, **kwargs: Any):
    if backend and "nccl" in backend:
        backend = "gloo"
    return real(backend, *args, **kwargs)


def _torch_load(real, *args: Any, **kwargs: Any):
    location = kwargs.get("map_location")
    if location is None or _is_cuda(location):
        kwargs["map_location"] = _CPU
    return real(*args, **kwargs)


LEGACY_TYPES = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
)


def _patch(owner: object, name: str, value: object) -> None:
    _installed.setdefault("saved", []).append((owner, name, getattr(owner, name, None)))
    setattr(owner, name, value)


def install() -> None:
    """Patches torch in this process so that CUDA code runs on the CPU. Calling it twice is harmless."""
    if _installed.get("mode") is not None:
        return
    for name, value in _cuda_functions().items():
        if isinstance(value, types.FunctionType):
            # one function object per name: torch._dynamo's trace rules key torch functions by identity
            value = types.FunctionType(value.__code__, value.__globals__, name, value.__defaults__, value.__closure__)
        _patch(torch.cuda, name, value)
    for name in LEGACY_TYPES:  # `torch.cuda.FloatTensor(n)`, `x.type(torch.cuda.LongTensor)`: the CPU types
        _patch(torch.cuda, name, getattr(torch, name))
    _patch(torch.cuda.amp, "autocast", _CudaAmpAutocast)
    _patch(torch.cuda.amp, "GradScaler", _CudaAmpGradScaler)
    _patch(torch, "autocast", _Autocast)
    _patch(torch.amp, "autocast", _Autocast)
    _patch(torch.amp, "GradScaler", _DisabledGradScaler)
    _patch(torch, "load", functools.partial(_torch_load, torch.load))
    # torch.accelerator is CUDA (that is, the CPU) too
    _patch(torch.accelerator, "is_available", lambda *args, **kwargs: True)
    _patch(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device("cuda"))
    _patch(torch.accelerator, "device_count", lambda: 1)
    _patch(torch.accelerator, "current_device_index", lambda: 0)
    _patch(torch.accelerator, "set_device_index", lambda *args, **kwargs: None)
    _patch(torch.accelerator, "synchronize", lambda *args, **kwargs: None)
    # a DataLoader pins memory in its own thread, which the torch function mode does not see
    real_loader_init = torch.utils.data.DataLoader.__init__

    @functools.wraps(real_loader_init)
    def loader_init(self, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False
        real_loader_init(self, *args, **kwargs)

    _patch(torch.utils.data.DataLoader, "__init__", loader_init)
    # DataParallel asks for the device type to scatter to; without one it only holds the module, as on a CPU host
    # (the module by its name: `torch.nn.parallel.data_parallel` is also a function of that package)
    _patch(sys.modules["torch.nn.parallel.data_parallel"], "_get_available_device_type", lambda: None)
    if dist.is_available():
        _patch(dist, "init_process_group", functools.partial(_init_process_group, dist.init_process_group))

        class _CpuDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
            def __init__(self, module, device_ids=None, output_device=None, *args: Any, **kwargs: Any):
                super().__init__(module, None, None, *args, **kwargs)

        _patch(torch.nn.parallel, "DistributedDataParallel", _CpuDistributedDataParallel)
    mode = CudaToCpuMode()
    mode.__enter__()  # stays on for the life of the process, like torch.set_default_device
    _installed["mode"] = mode


def uninstall() -> None:
    """Undoes `install()` (for tests that need a clean torch afterwards)."""
    mode = _installed.pop("mode", None)
    if mode is not None:
        mode.__exit__(None, None, None)
    for owner, name, value in reversed(_installed.pop("saved", [])):
        setattr(owner, name, value)


def run(argv: list[str]) -> None:
    """Runs `SCRIPT ARGS...` or `-m MODULE ARGS...` as `__main__` with the shim installed."""
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit("usage: python -m xlaport.eval.cuda_to_cpu SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    os.environ.setdefault("USE_TORCH_XLA", "0")  # keep accelerate & co. from importing torch_xla
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("error: -m needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = os.path.abspath(argv[0])
    if not os.path.isfile(script):
        raise SystemExit(f"error: no such script: {argv[0]}")
    sys.argv = [argv[0], *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run(sys.argv[1:])
