"""The probe's placement checks (no device reads): the modules `Module.to` moved and the parameters it replaced,
the optimizers and their parameter groups, and the weight ties a move lost."""

from __future__ import annotations

import functools
import weakref

from xlaport.eval.check.probe_sites import user_site
from xlaport.eval.tied_weights import lost_groups, lost_ties_message, shared_groups

MAX_LISTED = 10
# grade.py tells the two causes apart by this mark: the plain advice (build the optimizer after the move) is wrong
# when the optimizer already was, from a list the module kept from before the move
KEPT_LIST_MARK = "a list of parameters the module kept before the move"
# the optimizer is seen at its first step, so whether it was built before or after the move is not known here:
# the advice holds either way
KEPT_LIST_CAUSE = (
    "they come from {} (" + KEPT_LIST_MARK + ", still holding the replaced copies): make it a property that "
    "lists the parameters when read (xlaport fix, rule XLA316) or build the list after model.to(device), and "
    "build the optimizer from it after the move"
)


class Placement:
    """Where the script's parameters are, as its moves and optimizers show it."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder
        self.optimizers: list = []  # strong refs: their parameters are checked for NaN at exit
        self.modules: list = []  # modules moved onto the XLA device by Module.to
        self.off_xla_moves: list[str | None] = []  # where Module.to left a module off the XLA device
        self.replaced: dict[int, weakref.ref] = {}  # parameters that a Module.to call replaced by new ones
        self.findings: dict[str, list[str]] = {"stale": [], "off_device": [], "untied": []}
        self.untied_by_moves: list[tuple[weakref.ref, str, list[list[str]]]] = []  # (module, its name, lost groups)

    def wrap_module_to(self, original):
        placement = self

        @functools.wraps(original)
        def to(module, *args, **kwargs):
            before = {id(p): p for p in module.parameters()}
            shared = shared_groups(module)
            result = original(module, *args, **kwargs)
            after = {id(p) for p in module.parameters()}
            lost = lost_groups(shared, module)
            if lost:  # judged at the next placement check: the program may tie them again right after the move
                placement.untied_by_moves.append((weakref.ref(module), type(module).__name__, lost))
            for key, param in before.items():
                if key not in after:
                    placement.replaced[key] = weakref.ref(param)
            devices = {p.device.type for p in module.parameters()}
            if "xla" in devices and all(m is not module for m in placement.modules):
                placement.modules.append(module)
            elif devices and "xla" not in devices and len(placement.off_xla_moves) < MAX_LISTED:
                placement.off_xla_moves.append(user_site())
                placement.recorder.emit(
                    "off_xla_move", module=type(module).__name__, device=sorted(devices)[0], site=user_site()
                )
            return result

        return to

    def add_optimizer(self, optimizer) -> None:
        """An optimizer seen for the first time: kept, and its groups checked now."""
        if any(o is optimizer for o in self.optimizers):
            return
        self.optimizers.append(optimizer)
        self.check()

    def is_replaced(self, param) -> bool:
        ref = self.replaced.get(id(param))
        return ref is not None and ref() is param

    def check(self) -> None:
        """Finds optimizer groups holding replaced parameters, parameters off the XLA device, and ties a move
        lost that the program has not restored since (`model.tie_weights()` right after the move is fine)."""
        for module_ref, name, lost in self.untied_by_moves:
            module = module_ref()
            still_lost = [group for group in lost if module is not None and lost_groups([group], module)]
            if still_lost:
                self._note("untied", lost_ties_message(name, still_lost))
        for number, optimizer in enumerate(self.optimizers):
            for group_index, group in enumerate(optimizer.param_groups):
                params = list(group["params"])
                stale = sum(self.is_replaced(p) for p in params)
                off = sum(p.device.type != "xla" and not self.is_replaced(p) for p in params)
                name = f"optimizer {number} ({type(optimizer).__name__}) param group {group_index}"
                if stale:
                    kept = self.kept_lists(params)
                    self._note(
                        "stale",
                        f"{name}: {stale} of {len(params)} parameters are not the model's parameters "
                        f"(the old copies that model.to(device) replaced; those never get gradients)"
                        + (f"; {KEPT_LIST_CAUSE.format(', '.join(kept))}" if kept else ""),
                    )
                if off:
                    devices = sorted({str(p.device) for p in params if p.device.type != "xla"})
                    self._note("off_device", f"{name}: {off} of {len(params)} parameters on {', '.join(devices)}")
        for module in self.modules:
            named = list(module.named_parameters())
            off_names = [n for n, p in named if p.device.type != "xla"]
            if off_names:
                shown = ", ".join(off_names[:5]) + (", ..." if len(off_names) > 5 else "")
                self._note(
                    "off_device",
                    f"{type(module).__name__}: {len(off_names)} of {len(named)} parameters not on the XLA device ({shown})",
                )

    def kept_lists(self, params: list) -> list[str]:
        """The list or tuple attributes of the moved modules (`self.params1 = list(self.convs.parameters())` in
        __init__) that hold replaced parameters of `params`: they kept the old copies through the move, so an
        optimizer built from them after the move is stale all the same."""
        wanted = {id(p) for p in params if self.is_replaced(p)}
        found: list[str] = []
        for module in self.modules:
            for path, sub in module.named_modules():
                for attr, value in vars(sub).items():
                    if isinstance(value, (list, tuple)) and any(id(v) in wanted for v in value):
                        owner = ".".join(filter(None, [type(module).__name__, path]))
                        if f"{owner}.{attr}" not in found:
                            found.append(f"{owner}.{attr}")
        return found[:MAX_LISTED]

    def _note(self, kind: str, message: str) -> None:
        if message not in self.findings[kind]:
            self.findings[kind].append(message)
            self.recorder.emit("placement", kind=kind, message=message)
