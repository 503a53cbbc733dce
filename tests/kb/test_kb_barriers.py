"""Step barriers wherever the step is (issue 9, item 3): through `GradScaler.step`, helper functions and
methods, class-based trainers; loaders that accelerate prepared are left alone. Applied by the default
(safe) fixes: a barrier after the optimizer update keeps the program's numbers (item 5)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from xlaport.kb import fix_source, lint_source

STEPS = Path(__file__).parent.parent / "fixtures" / "steps"
CASES = sorted(p for p in STEPS.iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_default_fix_places_one_barrier_per_step(case: Path):
    source = (case / "input.py").read_text()
    fixed = fix_source(source, str(case / "input.py")).fixed  # default: safe fixes only
    assert fixed == (case / "expected.py").read_text()
    ast.parse(fixed)
    assert fix_source(fixed).fixed == fixed, "not idempotent"
    assert "XLA406" not in {f.code for f in lint_source(fixed)}


def barrier_lines(source: str) -> list[int]:
    return [f.line for f in lint_source(source) if f.code == "XLA406"]


def test_finding_points_at_the_step_or_the_helper_call():
    assert barrier_lines((STEPS / "scaler_step" / "input.py").read_text()) == [20]  # grad_scaler.step(opt)
    assert barrier_lines((STEPS / "helper_method" / "input.py").read_text()) == [21]  # self._one_batch(...)
    assert barrier_lines((STEPS / "trainer_class" / "input.py").read_text()) == [26]  # self.training_step(...)


def test_two_optimizer_steps_in_one_iteration_get_one_barrier():
    source = (
        "import torch\n"
        "for real in loader:\n"
        "    d_loss = critic(real).mean()\n"
        "    d_loss.backward()\n"
        "    opt_d.step()\n"
        "    g_loss = -critic(gen(z)).mean()\n"
        "    g_loss.backward()\n"
        "    opt_g.step()\n"
    )
    fixed = fix_source(source).fixed
    assert fixed.count("torch_xla.sync()") == 1
    assert fixed.splitlines()[-1] == "    torch_xla.sync()"


def test_barrier_runs_whenever_any_update_ran():
    # the last update is optional: a barrier inside its `if` would leave the iterations without it unbounded
    source = (
        "import torch\n"
        "for images, captions in loader:\n"
        "    loss = decoder(encoder(images), captions)\n"
        "    loss.backward()\n"
        "    dec_optimizer.step()\n"
        "    if enc_optimizer is not None:\n"
        "        enc_optimizer.step()\n"
        "    meter.update(loss.item())\n"
    )
    lines = fix_source(source).fixed.splitlines()
    assert lines[lines.index("        enc_optimizer.step()") + 1] == "    torch_xla.sync()"
    # a scaled step or a plain one, whichever branch runs: one barrier after the `if`
    source = (
        "import torch\n"
        "for x, y in loader:\n"
        "    model(x, y).backward()\n"
        "    if scaler is not None:\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "    else:\n"
        "        optimizer.step()\n"
        "    optimizer.zero_grad()\n"
    )
    fixed = fix_source(source).fixed
    assert fixed.count("torch_xla.sync()") == 1
    lines = fixed.splitlines()
    assert lines[lines.index("        optimizer.step()") + 1] == "    torch_xla.sync()"


def test_no_barrier_for_code_that_never_trains():
    # a helper that steps but is never called from a loop; a scheduler step; an RL environment step
    source = (
        "import torch\n"
        "def update(opt, loss):\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "for epoch in range(3):\n"
        "    scheduler.step()\n"
        "    obs = env.step(action)\n"
    )
    assert barrier_lines(source) == []


def test_helper_that_syncs_itself_needs_no_barrier():
    source = (
        "import torch_xla\n"
        "def train_step(batch):\n"
        "    model(batch).sum().backward()\n"
        "    optimizer.step()\n"
        "    torch_xla.sync()\n"
        "for batch in batches:\n"
        "    train_step(batch)\n"
    )
    assert barrier_lines(source) == []


def test_accelerate_prepared_loader_is_never_wrapped_again():
    # on XLA accelerate's prepared loader is already a device loader; MpDeviceLoader around it yields 0 batches
    source = (STEPS / "accelerate_loader" / "input.py").read_text()
    assert fix_source(source, unsafe=True).fixed == source
    assert not {"XLA406", "XLA408"} & {f.code for f in lint_source(source)}


SCALER_ON_DEVICE_VARIABLE = (
    "import torch\n"
    "device_type = 'cuda' if use_gpu else 'cpu'\n"
    "scaler = torch.amp.GradScaler(device_type)\n"
    "for x in loader:\n"
    "    scaler.scale(model(x)).backward()\n"
    "    scaler.step(opt)\n"
    "    scaler.update()\n"
)


def test_gradscaler_removal_follows_the_device_type():
    # default: the scaler stays (dropping loss scaling changes numbers) and gets its barrier
    default = fix_source(SCALER_ON_DEVICE_VARIABLE).fixed
    assert "scaler.update()\n    torch_xla.sync()\n" in default
    # --unsafe-fixes: a scaler on the training device's variable goes, like torch.cuda.amp.GradScaler()
    unsafe = fix_source(SCALER_ON_DEVICE_VARIABLE, unsafe=True).fixed
    assert "scaler" not in unsafe
    assert "model(x).backward()\n    opt.step()\n    torch_xla.sync()\n" in unsafe


def test_optimizer_wrapper_step_method_gets_a_barrier():
    source = "for batch in loader:\n    loss = model(batch)\n    loss.backward()\n    optimizer.step_and_update_lr()\n"
    assert barrier_lines(source) == [4]


def test_default_fix_keeps_loss_scaling_and_says_why():
    # dropping loss scaling changes the numbers (XLA502 is unsafe): the default keeps the scaler, puts the
    # barrier after scaler.update(), and the finding left says what the kept scaler costs and what removes it
    source = (STEPS / "amp_scaler_kept" / "input.py").read_text()
    result = fix_source(source, "train.py")
    for line in ("scaler = GradScaler()", "scaler.scale(loss).backward()", "scaler.step(optimizer)"):
        assert line in result.fixed
    assert result.fixed.count("torch_xla.sync()") == 1
    assert "        scaler.update()\n        torch_xla.sync()\n" in result.fixed
    left = [f for f in result.remaining if f.code == "XLA502"]
    assert left and all(f.fix == "unsafe" and f.fixable for f in left)
    assert "host every step" in left[0].message and "--unsafe-fixes" in left[0].message
    unsafe = fix_source(source, "train.py", unsafe=True).fixed
    assert "GradScaler" not in unsafe and 'torch.autocast("xla", dtype=torch.bfloat16)' in unsafe


def test_scaler_left_by_hand_names_one_line_of_code():
    # an optional scaler (None unless fp16 is asked for): the message quotes the line, not the comment above it
    source = (
        "import torch\n"
        "# loss scaling for fp16 runs\n"
        "scaler = None\n"
        "if use_fp16:\n"
        "    scaler = torch.cuda.amp.GradScaler()\n"
        "if scaler is None:\n"
        "    loss.backward()\n"
        "else:\n"
        "    scaler.scale(loss).backward()\n"
    )
    messages = [f.message for f in lint_source(source) if f.code == "XLA502"]
    assert messages and all("\n" not in m and "#" not in m for m in messages), messages


def test_unbound_scaler_is_disabled_unless_the_code_trains_in_float16():
    source = "import torch\nscaler = torch.cuda.amp.GradScaler() if use_amp else None\n"
    fixed = fix_source(source, unsafe=True).fixed
    assert "GradScaler(enabled=False)" in fixed
    # float16 without loss scaling underflows: left by hand, as for a bound scaler, until XLA503 moves the model
    # to bfloat16 (then the next pass disables the scaler)
    half = source + "model = model.half()\n"
    assert [f.fixable for f in lint_source(half) if f.code == "XLA502"] == [False]
    fixed = fix_source(half, unsafe=True).fixed
    assert "model.bfloat16()" in fixed and "GradScaler(enabled=False)" in fixed


def test_a_barrier_is_not_added_twice_in_a_row_but_the_programs_own_stay():
    # steps/event_timer: XLA406's barrier after `opt.step()` and the timer's before `end = time.perf_counter()`
    # meet; one is kept. Two barriers the program wrote itself are its own business.
    source = (
        "import torch\nimport torch_xla\n"
        "for x in loader:\n    y = x.cuda()\n    torch_xla.sync()\n    torch_xla.sync()\n"
    )
    fixed = fix_source(source).fixed
    assert "x.cuda()" not in fixed
    assert fixed.count("torch_xla.sync()") == 2
