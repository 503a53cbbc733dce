"""`xlaport check`: each planted fault in tests/programs/ is caught with the right reason; clean loops get L2.

The programs run for real under torch_xla (PJRT_DEVICE=CPU) in child processes. Each child pays a few
seconds to import torch_xla, so the module starts the programs its selected tests need two at a time,
and every test waits only for its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.eval.check import (
    CheckReport,
    build_report,
    check_source,
    parse_compilation_analysis,
    render_text,
    run_check,
)
from xlaport.eval.sandbox import SandboxResult

from xlaport.cli import app

PROGRAMS = Path(__file__).parent / "programs"
XLAPORT = Path(sys.executable).with_name("xlaport")
TORCH_PROGRAMS = [
    "clean_launch",
    "clean_loader",
    "step_styles",
    "fault_varlen",
    "fault_read_shapes",
    "perf_item",
    "perf_grad_scaler",
    "perf_reads",
    "fault_mask",
    "fault_fallback",
    "fault_stale_optimizer",
    "fault_kept_param_list",
    "fault_nan",
    "fault_no_barrier",
    "fault_cpu_device",
    "fault_growing_reads",
    "clean_checked_layers",
]
JSON_KEYS = {
    "exit_code", "level", "reasons", "fallback_ops", "host_reads", "compiles_total", "compiles_after_warmup",
    "host_transfers_per_step", "nan", "stale_optimizer_params", "params_off_device", "steps", "per_step",
    "wall_s", "startup_s", "compile_s", "run_s", "error", "recompile_sources",
}  # fmt: skip
# the device named on the command line, as a user without a GPU ran the original
DEVICE_FLAG_RUNS = {  # test name: (script in device_flag/, its arguments)
    "device_flag_argparse": ("train_args", ["--device", "cpu", "--steps", "40"]),
    "device_flag_overrides_a_global": ("train_globals", ["--device=cpu", "--lr=0.05"]),
}
REASON_KINDS = {
    "fallback": "fell back to the CPU",
    "recompile": "repeated compilation",
    "nan": "NaN/Inf",
    "stale": "does not hold the model's parameters",
    "off_device": "not on the XLA device",
    "no_barrier": "no step barrier",
}


def reason_kinds(report: CheckReport) -> set[str]:
    kinds = {kind for kind, text in REASON_KINDS.items() if any(text in reason for reason in report.reasons)}
    assert len(kinds) == len(report.reasons), report.reasons  # every reason is one known kind
    return kinds


def line_of_flag(text: str) -> int:
    lines = (PROGRAMS / "device_flag" / "train_globals.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(text))


def line_of(program: str, text: str) -> int:
    lines = (PROGRAMS / f"{program}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def run_cli_json(program: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [str(XLAPORT), "check", str(PROGRAMS / f"{program}.py"), "--format", "json", "--timeout", "300"],
        capture_output=True,
        text=True,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        timeout=400,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def runs(request):
    """Starts, two at a time, the torch programs that this session's selected tests ask for."""
    wanted = {item.name.removeprefix("test_") for item in request.session.items if item.module is request.module}
    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[str, Future] = {}
    if "clean_sync_cli" in wanted:
        futures["clean_sync_cli"] = pool.submit(run_cli_json, "clean_sync")
    for name in TORCH_PROGRAMS:
        if name in wanted:
            futures[name] = pool.submit(run_check, PROGRAMS / f"{name}.py", timeout_s=300)
    for name, (script, args) in DEVICE_FLAG_RUNS.items():
        if name in wanted:
            futures[name] = pool.submit(run_check, PROGRAMS / "device_flag" / f"{script}.py", args, timeout_s=300)
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.slow
def test_clean_sync_cli(runs):
    exit_code, data = runs["clean_sync_cli"].result()
    assert exit_code == 0, data["reasons"]
    assert JSON_KEYS <= data.keys()
    assert data["level"] == "L2" and data["reasons"] == []
    assert data["exit_code"] == 0 and data["error"] is None
    assert data["steps"] == 10
    # AdamW: one graph without optimizer state, one with it, then cache hits only
    assert [s["compiles"] for s in data["per_step"]] == [1, 1] + [0] * 8
    assert data["compiles_total"] == 2 and data["compiles_after_warmup"] == 0
    assert data["fallback_ops"] == {} and data["nan"] is False
    # the step closure reads the loss once per step, after the graph ran: not charged to the step
    assert data["host_transfers_per_step"] == 0 and data["item_sites"] == []
    assert [s["closure_transfers"] for s in data["per_step"][1:]] == [1] * 9
    assert data["stale_optimizer_params"] == [] and data["params_off_device"] == []
    assert set(data["per_step"][0]) >= {"compiles", "transfers", "fallbacks", "host_reads"}
    parts = data["startup_s"] + data["compile_s"] + data["run_s"]
    assert parts == pytest.approx(data["wall_s"], abs=0.01) and data["compile_s"] > 0


@pytest.mark.slow
def test_clean_loader(runs):
    report = runs["clean_loader"].result()
    assert report.level == "L2", report.reasons
    # 40 samples / batch 4: the loader's sync before the first batch launches nothing and is no step
    assert report.steps == 10
    assert report.compiles_after_warmup == 0 and report.host_transfers_per_step == 0


@pytest.mark.slow
def test_clean_launch(runs):
    report = runs["clean_launch"].result()
    assert report.level == "L2", report.reasons
    assert report.steps == 6 and report.compiles_total == 1
    assert any("worker process" in note for note in report.notes)  # measured in the spawned worker
    assert report.stdout_tail == "worker 0 done"


@pytest.mark.slow
def test_step_styles(runs):
    report = runs["step_styles"].result()
    assert report.exit_code == 0, report.error
    assert report.steps == 12
    assert report.fallback_ops == {} and report.host_transfers_per_step == 0


@pytest.mark.slow
def test_fault_varlen(runs):
    report = runs["fault_varlen"].result()
    assert report.level == "L0" and reason_kinds(report) == {"recompile"}
    assert [s.compiles for s in report.per_step] == [1] * 8
    assert report.compiles_after_warmup == 8 - report.steps_warmup
    top = report.recompile_sources[0]
    assert top.compiles == 6 and top.steps == [2, 3, 4, 5, 6, 7]
    assert top.location.endswith(f"fault_varlen.py:{line_of('fault_varlen', 'torch_xla.sync()')}")
    assert top.cause == "user torch_xla.sync"


@pytest.mark.slow
def test_fault_read_shapes(runs):
    # a host read whose value sets a shape changes the computation step by step: still repeated compilation
    report = runs["fault_read_shapes"].result()
    assert report.level == "L0" and reason_kinds(report) == {"recompile"}, report.reasons
    assert report.compiles_after_warmup >= 3
    read = next(f for f in report.performance if f.kind == "host_sync")
    assert read.site.endswith(f"fault_read_shapes.py:{line_of('fault_read_shapes', 'positive = int(')}")
    assert read.code == "XLA402" and read.every_step


@pytest.mark.slow
def test_perf_item(runs):
    # `.item()` logging every step costs a host sync per step but computes the same numbers: L2, and the
    # performance finding names the line, its measured cost and the fix
    report = runs["perf_item"].result()
    assert report.level == "L2" and report.reasons == []
    assert report.host_transfers_per_step == 1
    assert all(s.host_reads == 1 for s in report.per_step)
    assert report.host_reads == 8 and report.fallback_ops == {}
    where = f"perf_item.py:{line_of('perf_item', 'print(')}"
    [site] = report.item_sites
    assert site["location"].endswith(where) and site["count"] == 8
    [finding] = [f for f in report.performance if f.kind == "host_sync"]
    assert finding.site.endswith(where) and finding.when == "every step" and finding.every_step
    assert finding.code == "XLA401" and "add_step_closure" in finding.fix
    assert finding.count == 8 and finding.steps == list(range(8))
    assert 0 < finding.share < 1 and finding.ms_per_step > 0
    assert report.performance[0] is finding  # the per-step cost comes first
    text = render_text(report)
    assert f"host sync every step: `.item()` at {finding.site}" in text and "% of the step time" in text
    # .item() before the sync runs the forward as its own graph: two graphs in step 0, then cache hits
    assert [s.compiles for s in report.per_step] == [2] + [0] * 7
    assert report.compiles_after_warmup == 0
    # where the time goes: the three parts add up to the steps' wall time, the host waits are the reads'
    for split in report.time_split:
        assert split.trace_s + split.compile_s + split.host_wait_s == pytest.approx(split.wall_s, abs=0.01)
    after = report.time_split[-1]
    assert after.scope == "after warm-up" and after.steps == 6 and after.compile_s == 0
    assert after.host_wait_s == pytest.approx(finding.ms_per_step * 6 / 1000, abs=0.002)
    assert report.time_split[0].compile_s == pytest.approx(report.compile_s, abs=0.01)
    assert "where the time goes (after warm-up, 6 step(s)" in text


@pytest.mark.slow
def test_perf_grad_scaler(runs):
    # a kept GradScaler reads its inf check on the host before every optimizer step: L2 with a finding
    report = runs["perf_grad_scaler"].result()
    assert report.level == "L2" and report.reasons == [], report.reasons
    assert report.steps == 9 and report.compiles_after_warmup == 0
    finding = report.performance[0]
    assert finding.kind == "host_sync" and finding.every_step and finding.code == "XLA502"
    assert finding.site.endswith(f"perf_grad_scaler.py:{line_of('perf_grad_scaler', 'scaler.step(opt)')}")
    assert finding.what.startswith("GradScaler's inf check") and "--unsafe-fixes" in finding.fix
    assert finding.share > 0


@pytest.mark.slow
def test_perf_reads(runs):
    # three rhythms of host reads in a correct loop: each located and reported as what it is
    report = runs["perf_reads"].result()
    assert report.level == "L2" and report.reasons == [], report.reasons
    assert report.steps == 12 and report.compiles_after_warmup == 0
    by_site = {f.site.rpartition("/")[2]: f for f in report.performance if f.kind == "host_sync"}
    forward = by_site[f"perf_reads.py:{line_of('perf_reads', 'if self.ready[0] == 0')}"]
    logging = by_site[f"perf_reads.py:{line_of('perf_reads', 'print(')}"]
    checkpoint = by_site[f"perf_reads.py:{line_of('perf_reads', 'torch.save(')}"]
    # the comparison inside forward reads every step: located at its line, ranked first, with its cost
    assert report.performance[0] is forward and forward.every_step and forward.when == "every step"
    assert forward.code == "XLA405" and forward.count == 12 and forward.share > 0
    # the print after the barrier of steps 0, 5, 10 is read before the next barrier: steps 1, 6, 11
    assert not logging.every_step and logging.when == "in steps 1, 6, 11 (every 5 steps)"
    assert logging.count == 3 and logging.share is None
    # the checkpoint copies its 4 tensors once, after the last step: an event, not a per-step cost
    assert checkpoint.when == "once, after the last step" and checkpoint.count == 4 and not checkpoint.steps
    assert report.host_transfers_per_step == 1
    assert report.transfers_total - sum(s.transfers for s in report.per_step) == 4


@pytest.mark.slow
def test_device_flag_argparse(runs):
    report = runs["device_flag_argparse"].result()
    assert report.level == "L0" and reason_kinds(report) == {"off_device"}, report.reasons
    reason = report.reasons[0]
    assert reason.startswith("ran on the CPU, not on the XLA device")
    assert "the command line: `--device cpu` chose the cpu device" in reason
    assert "`--migrated-arg=--device --migrated-arg=xla`" in reason and "XLA233" in reason


@pytest.mark.slow
def test_device_flag_overrides_a_global(runs):
    # `device = "xla"` in the script is replaced by `--device=cpu` through the executed overrides file:
    # the flag is the cause, and the overridden line is not blamed
    report = runs["device_flag_overrides_a_global"].result()
    assert report.level == "L0" and reason_kinds(report) == {"off_device"}, report.reasons
    reason = report.reasons[0]
    assert "the command line: `--device=cpu` chose the cpu device" in reason
    assert "`--migrated-arg=--device=xla`" in reason
    assert 'device = "xla"' not in reason and f"train_globals.py:{line_of_flag('device = ')}" not in reason


@pytest.mark.slow
def test_fault_mask(runs):
    report = runs["fault_mask"].result()
    assert report.level == "L0"
    assert report.fallback_ops.get("aten::nonzero", 0) >= 8  # once per step at least
    assert "fallback" in reason_kinds(report)
    assert any("aten::nonzero" in reason for reason in report.reasons)


@pytest.mark.slow
def test_fault_fallback(runs):
    report = runs["fault_fallback"].result()
    assert report.level == "L0"
    assert report.fallback_ops == {"aten::bincount": 8}
    assert all(s.fallbacks == {"aten::bincount": 1} for s in report.per_step)
    # the fallback copies the labels to the host each step: that is the fallback's cost, not a host read
    assert reason_kinds(report) == {"fallback"}
    assert not [f for f in report.performance if f.kind == "host_sync"]
    assert report.compiles_after_warmup == 0


@pytest.mark.slow
def test_a_fallback_that_only_xla_cpu_takes_does_not_refuse_l2(tmp_path):
    """A U-Net decoder's `F.interpolate(..., mode="nearest")`: torch_xla lowers its backward on TPU only (on any
    other device, XLA:CPU included, it calls the CPU fallback), so a check run on XLA:CPU read 8 fallbacks as L0
    (pytorch-ddpm). The fallbacks stay in the report, with a note that says the TPU lowers them."""
    tmp_path.chmod(0o755)  # the sandbox user reads the script
    script = tmp_path / "upsample_train.py"
    script.write_text(
        "import torch\nimport torch.nn.functional as F\nimport torch_xla\n\n"
        "device = torch_xla.device()\ntorch.manual_seed(0)\n"
        "conv = torch.nn.Conv2d(3, 3, 3, padding=1).to(device)\n"
        "opt = torch.optim.SGD(conv.parameters(), lr=0.01)\nx = torch.randn(2, 3, 8, 8).to(device)\n"
        "for step in range(6):\n"
        "    opt.zero_grad()\n"
        "    y = F.interpolate(conv(x), scale_factor=2, mode='nearest')\n"
        "    y.pow(2).mean().backward()\n"
        "    opt.step()\n"
        "    torch_xla.sync()\n"
    )
    report = run_check(script)
    assert report.fallback_ops.get("aten::upsample_nearest2d_backward", 0) >= 6
    assert report.level == "L2", report.reasons
    assert any("upsample_nearest2d_backward" in note and "TPU" in note for note in report.notes), report.notes


@pytest.mark.slow
def test_fault_stale_optimizer(runs):
    report = runs["fault_stale_optimizer"].result()
    assert report.exit_code == 0  # the silent failure: nothing raises
    assert report.level == "L0" and reason_kinds(report) == {"stale"}
    assert len(report.stale_optimizer_params) == 1
    assert "SGD" in report.stale_optimizer_params[0] and "2 of 2" in report.stale_optimizer_params[0]
    assert report.params_off_device == []  # the model itself did move
    assert "build it after model.to(device)" in report.reasons[0]  # the plain case keeps its advice
    assert "kept" not in report.reasons[0]


@pytest.mark.slow
def test_fault_kept_param_list(runs):
    """GCNII's layout: `self.params1 = list(self.convs.parameters())` in __init__, the optimizer built from it
    AFTER model.to(device). "Build it after model.to(device)" was wrong advice there: it already was. The
    reason names the kept lists and the fixes that apply (a property, XLA316, or building the list after)."""
    report = runs["fault_kept_param_list"].result()
    assert report.level == "L0" and reason_kinds(report) == {"stale"}
    assert len(report.stale_optimizer_params) == 2, report.stale_optimizer_params
    body, head = report.stale_optimizer_params
    assert "2 of 2" in body and "Net.body_params" in body and "Net.head_params" not in body
    assert "Net.head_params" in head
    reason = report.reasons[0]
    assert "build it after model.to(device)" not in reason, reason
    assert "XLA316" in reason and "property" in reason, reason


@pytest.mark.slow
def test_fault_nan(runs):
    report = runs["fault_nan"].result()
    assert report.level == "L0" and reason_kinds(report) == {"nan"}
    assert report.nan
    assert "non-finite values in last loss" in report.nan_details
    assert any("read nan" in detail and "fault_nan.py" in detail for detail in report.nan_details)


@pytest.mark.slow
def test_fault_no_barrier(runs):
    # the step goes through GradScaler.step, so no barrier: the check stops the run within a few steps
    report = runs["fault_no_barrier"].result()
    assert report.level == "L0" and report.stopped == "no_barrier", report.reasons
    assert reason_kinds(report) == {"no_barrier"}
    assert "goes through GradScaler.step" in report.reasons[0]
    assert f"fault_no_barrier.py:{line_of('fault_no_barrier', 'scaler.step(optimizer)')}" in report.reasons[0]
    assert "growing from" in report.reasons[0] and report.compiles_total >= 5
    assert report.wall_s <= 60 and not report.timed_out and report.error is None


@pytest.mark.slow
def test_fault_growing_reads(runs):
    # no optimizer: the evidence is the host read compiling an ever-larger graph each iteration
    report = runs["fault_growing_reads"].result()
    assert report.level == "L0" and report.stopped == "no_barrier", report.reasons
    assert reason_kinds(report) == {"no_barrier"} and "each of a bigger graph" in report.reasons[0]
    assert f"fault_growing_reads.py:{line_of('fault_growing_reads', '.item()')}" in report.reasons[0]
    assert report.wall_s <= 60


@pytest.mark.slow
def test_clean_checked_layers(runs):
    # host reads inside the first forward pass compile growing graphs before any optimizer step: one step's
    # work, not a loop without a barrier (issue #24: a RealNVP trainer was stopped as L0 in its first step)
    report = runs["clean_checked_layers"].result()
    assert report.level == "L2" and report.reasons == [], report.reasons
    assert report.steps == 8 and report.stopped is None and report.compiles_after_warmup == 0


@pytest.mark.slow
def test_fault_cpu_device(runs):
    # the model stays on the CPU (torch.accelerator knows nothing of XLA): stopped after a few optimizer steps
    report = runs["fault_cpu_device"].result()
    assert report.level == "L0" and report.stopped == "off_xla", report.reasons
    assert reason_kinds(report) == {"off_device"}
    assert report.reasons[0].startswith("ran on the CPU, not on the XLA device")
    where = f"fault_cpu_device.py:{line_of('fault_cpu_device', 'device = torch.accelerator')}"
    assert where in report.reasons[0] and report.wall_s <= 60


@pytest.mark.slow
def test_short_cpu_run_that_exits_cleanly_is_l0_and_never_validated():
    from xlaport.serve.checks import run_xla_check
    from xlaport.serve.results import verdict

    # through the pipeline's validation adapter, as `migrate --validate` runs it
    run = run_xla_check(PROGRAMS / "fault_cpu_device.py", ["3"], timeout_s=300, memory_mb=8192)
    assert run.passed is False and verdict([run])[0] == "rejected"
    report = CheckReport(**{**run.report, "per_step": [], "recompile_sources": []})
    assert report.exit_code == 0 and report.stopped is None
    assert report.level == "L0" and reason_kinds(report) == {"off_device"}, report.reasons
    assert report.reasons[0].startswith("ran on the CPU, not on the XLA device: 3 optimizer step(s)")


@pytest.mark.slow
def test_memory_limit_names_the_limit_the_peak_and_the_phase():
    report = run_check(PROGRAMS / "fault_memory.py", timeout_s=300, memory_mb=1500)
    assert report.memory_exceeded and report.level == "none" and report.peak_rss_mb >= 1500
    assert len(report.reasons) == 1, report.reasons
    assert report.reasons[0].startswith("did not finish: killed by the memory limit of 1500 MB (peak ")
    assert "last phase: after importing torch_xla" in report.reasons[0]


def test_child_killed_by_a_signal_says_how_far_it_got_and_its_peak():
    # the study's case: the graph grew until LLVM could not allocate memory and the child died with SIGSEGV
    result = SandboxResult(-11, "", "LLVM ERROR: out of memory\nAllocation failed", wall_s=305.0, peak_rss_mb=7012.0)
    events = [
        {"event": "start", "t": 0.0, "pid": 7},
        {"event": "script_start", "t": 0.1, "pid": 7},
        {"event": "torch_xla_imported", "t": 3.0, "pid": 7},
        {"event": "heartbeat", "t": 300.0, "pid": 7, "steps": 0, "optimizer_steps": 2, "compiles": 41,
         "graph_nodes": 91234, "rss_mb": 6900.0},
    ]  # fmt: skip
    report = build_report(Path("train.py"), [], 2, 600, result, events, [], 0.0, "CPU", memory_mb=8192)
    assert report.level == "none" and report.exit_code == -11
    assert report.compiles_total == 41
    (reason,) = report.reasons
    assert "killed by signal SIGSEGV" in reason and "LLVM ERROR: out of memory" in reason
    assert "before the first XLA step: 41 graph compilation(s) so far, the last graph had 91234 nodes" in reason
    assert "peak memory 7012 MB" in reason


def _steps_events(walls: list[float], reads_per_step: list[list[dict]], after_last: list[dict]) -> list[dict]:
    """The events of a finished run whose steps took `walls` seconds and made `reads_per_step`."""
    events = [{"event": "start", "t": 0.0, "pid": 7}, {"event": "torch_xla_imported", "t": 1.0, "pid": 7}]
    t = 1.0
    for index, (wall, reads) in enumerate(zip(walls, reads_per_step, strict=True)):
        t += wall
        events.append(
            {"event": "step", "t": t, "pid": 7, "index": index, "compiles": int(index == 0), "compile_s": 0.0,
             "execute_s": 0.001, "transfers": len(reads), "host_reads": len(reads), "fallbacks": {},
             "closure_transfers": 0, "host_wait_s": sum(r["wait_s"] for r in reads), "reads": reads}
        )  # fmt: skip
    totals = {"compiles": 1, "compile_s": 0.0, "transfers": 99, "host_reads": 99, "fallbacks": {}}
    events.append(
        {"event": "end", "t": t, "pid": 7, "totals": totals, "nonfinite_tensors": [], "nonfinite_reads": [],
         "reads_after_last_step": after_last, "optimizer_steps": len(walls)}
    )  # fmt: skip
    events.append({"event": "script_end", "t": t, "pid": 7})
    return events


def test_host_syncs_are_performance_findings_located_and_costed_never_reasons():
    log = {"site": "/w/train.py:9", "kind": "item", "count": 1, "wait_s": 0.004}
    scaler = {"site": "/w/train.py:12 (GradScaler.step: inf check)", "kind": "item", "count": 1, "wait_s": 0.002}
    evaluation = {"site": "/w/train.py:30", "kind": "cpu", "count": 5, "wait_s": 0.05}
    checkpoint = {"site": "/w/train.py:40", "kind": "cpu", "count": 20, "wait_s": 0.3}
    reads = [[log, scaler] + ([evaluation] if i in (3, 6) else []) for i in range(8)]
    walls = [0.01] * 8
    walls[3] = walls[6] = 0.06
    result = SandboxResult(0, "", "", wall_s=5.0, peak_rss_mb=100.0)
    report = build_report(
        Path("/w/train.py"), [], 2, 600, result, _steps_events(walls, reads, [checkpoint]), [], 0.0, "CPU"
    )
    assert report.level == "L2" and report.reasons == []
    assert report.host_transfers_per_step == 2  # the typical step: the evaluation's 5 copies are events
    kinds = [(f.kind, f.site, f.when) for f in report.performance]
    assert kinds == [
        ("host_sync", "/w/train.py:9", "every step"),
        ("host_sync", "/w/train.py:12", "every step"),
        ("host_sync", "/w/train.py:40", "once, after the last step"),
        ("host_sync", "/w/train.py:30", "in steps 3, 6 (every 3 steps)"),
    ]
    log_finding, scaler_finding, checkpoint_finding, eval_finding = report.performance
    # 6 steps after warm-up, 0.16 s in all, 4 ms of it per step at the logging line
    assert log_finding.ms_per_step == pytest.approx(4.0) and log_finding.share == pytest.approx(0.024 / 0.16)
    assert log_finding.code == "XLA401" and scaler_finding.code == "XLA502"
    assert checkpoint_finding.count == 20 and checkpoint_finding.share is None
    assert "300.0 ms per event, 20 read(s) each" in checkpoint_finding.what
    assert "50.0 ms per event, 5 read(s) each" in eval_finding.what and eval_finding.code == "XLA404"
    assert report.time_split[-1].host_wait_s == pytest.approx(0.136)
    text = render_text(report)
    assert "why not L2" not in text and "performance (costs time, not correctness" in text
    assert "per-step ms (tracing and dispatch/compiling/host waits): 4/0/6 4/0/6 4/0/6 4/0/56 " in text


def test_scaler_read_only_after_the_last_step_is_one_event():
    # a checkpoint saving `scaler.state_dict()` after training: the GradScaler's site is renamed for the finding,
    # and counting its events by the new name found none (ZeroDivisionError on a real ViT training program)
    scaler = {"site": "/w/train.py:12 (GradScaler.step: inf check)", "kind": "item", "count": 2, "wait_s": 0.002}
    result = SandboxResult(0, "", "", wall_s=5.0, peak_rss_mb=100.0)
    events = _steps_events([0.01] * 4, [[] for _ in range(4)], [scaler])
    report = build_report(Path("/w/train.py"), [], 2, 600, result, events, [], 0.0, "CPU")
    [finding] = [f for f in report.performance if f.kind == "host_sync"]
    assert finding.site == "/w/train.py:12" and finding.when == "once, after the last step"
    assert "2.0 ms per event, 2 read(s) each" in finding.what and finding.code == "XLA502"


def test_slow_step_and_one_off_compile_are_performance_findings():
    reads = [[] for _ in range(8)]
    walls = [0.01] * 8
    walls[5] = 0.5  # nothing read, nothing compiled: the script did something slow in that step
    events = _steps_events(walls, reads, [])
    events[2 + 6].update(compiles=1, compile_s=0.2)  # step 6 compiles once, then cached
    result = SandboxResult(0, "", "", wall_s=5.0, peak_rss_mb=100.0)
    report = build_report(Path("/w/train.py"), [], 2, 600, result, events, [], 0.0, "CPU")
    assert report.level == "L2" and report.reasons == []
    assert {(f.kind, f.when) for f in report.performance} == {
        ("slow_step", "once, in step 5"),
        ("compile", "once, in step 6"),
    }


def test_device_flag_names_the_command_line_choice():
    from xlaport.eval.check.events import device_flag

    assert "`--device cpu` chose" in device_flag(["--steps", "3", "--device", "cpu"], "cpu", "args.device")
    assert "`--migrated-arg=--device=xla`" in device_flag(["--device=cpu"], "cpu", "device")
    assert "`--dev=cpu`" in device_flag(["--dev=cpu"], "cpu", "opts.dev")  # the name passed to .to()
    assert "`--no-cuda` switch" in device_flag(["--no-cuda"], "cpu", None)
    assert device_flag(["--out", "cpu", "--device", "cuda"], "cpu", "device") is None


def test_crash_reports_error_text():
    report = run_check(PROGRAMS / "fault_crash.py")
    assert report.level == "none" and report.exit_code == 1
    assert report.reasons == [
        "exited with code 1: FileNotFoundError: config not found: train.yaml "
        '(at fault_crash.py:5 `raise FileNotFoundError(f"config not found: {path}")`)'  # the user's failing line
    ]
    assert 'fault_crash.py", line' in report.error and "eval/check/runner.py" not in report.error
    assert not report.torch_xla_imported and report.steps == 0
    assert any("--workdir" in note for note in report.notes)  # the hint for relative paths


def test_a_crash_whose_message_is_longer_than_the_kept_lines_is_named_by_its_exception(tmp_path):
    """A sparse tensor moved to XLA raises NotImplementedError with a message of ~60 lines (every dispatch key's
    registration): the reason named the message's last line (`PythonDispatcher: registered at ...`), not the
    error. The exception's own line stays in the kept text, whatever follows it."""
    tmp_path.chmod(0o755)  # the sandbox user reads the script
    script = tmp_path / "move_sparse.py"
    script.write_text(
        "import torch\n"
        "import torch_xla\n"
        "adjacency = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2))\n"
        "adjacency = adjacency.to(torch_xla.device())\n"
    )
    report = run_check(script)
    assert report.level == "none" and report.exit_code == 1
    assert report.reasons[0].startswith(
        "exited with code 1: NotImplementedError: Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors'"
    ), report.reasons
    assert report.reasons[0].endswith("(at move_sparse.py:4 `adjacency = adjacency.to(torch_xla.device())`)")
    assert len(report.error.splitlines()) <= 30  # still a short excerpt, not the whole message


def test_timeout():
    report = run_check(PROGRAMS / "fault_hang.py", timeout_s=2)
    assert report.timed_out and report.level == "none" and report.exit_code is None
    assert report.reasons[0].startswith("did not finish: timed out after 2 s")
    assert report.wall_s < 30


def test_cli_usage_errors(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["check", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2 and "no such script" in missing.output
    bad_option = runner.invoke(app, ["check", str(PROGRAMS / "fault_crash.py"), "--steps-warmup", "-1"])
    assert bad_option.exit_code == 2


def test_cli_passes_script_args_and_exit_code(tmp_path):
    script = tmp_path / "show_args.py"
    script.write_text("import os, sys\nprint(sys.argv[1:], os.getcwd())\nsys.exit(3 if '--fail' in sys.argv else 0)\n")
    workdir = tmp_path / "data"
    workdir.mkdir()
    result = CliRunner().invoke(
        app, ["check", str(script), "--format", "json", "--workdir", str(workdir), "--", "--lr", "3", "--fail"]
    )
    data = json.loads(result.output)
    assert result.exit_code == 1  # not L2
    assert data["exit_code"] == 3 and data["level"] == "none"
    assert data["stdout_tail"] == f"['--lr', '3', '--fail'] {workdir}"


def test_cli_env_reaches_the_run_and_a_shell_variable_does_not(tmp_path, monkeypatch):
    """The run gets an allowlist of the caller's environment: a variable the program needs (a tracker's mode,
    a data path) reaches it only through --env; a bad --env is a usage error."""
    script = tmp_path / "show_env.py"
    script.write_text("import os\nprint(os.environ.get('TRACKER_MODE'), os.environ.get('DATA_ROOT'))\n")
    monkeypatch.setenv("TRACKER_MODE", "from-the-shell")
    common = ["check", str(script), "--format", "json", "--workdir", str(tmp_path)]
    plain = json.loads(CliRunner().invoke(app, common).output)
    assert plain["stdout_tail"] == "None None"
    given = CliRunner().invoke(app, [*common, "--env", "TRACKER_MODE=disabled", "--env", "DATA_ROOT=a=b"])
    assert json.loads(given.output)["stdout_tail"] == "disabled a=b"
    bad = CliRunner().invoke(app, [*common, "--env", "TRACKER_MODE"])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output


def test_script_without_torch_xla_is_l0(tmp_path):
    # runs like `python SCRIPT`: its folder is importable, its working directory a fresh temporary one
    (tmp_path / "helper.py").write_text("GREETING = 'hello'\n")
    script = tmp_path / "plain.py"
    script.write_text(
        "import os\nfrom helper import GREETING\n"
        "print(GREETING, os.getcwd() != os.environ['XLAPORT_SCRIPT_DIR'], os.environ['XLAPORT_SCRIPT_DIR'])\n"
    )
    report = run_check(script, reveal=True)  # tmp_path is 0700: its owner shows it to the sandbox user
    assert report.level == "L0" and report.exit_code == 0, report.error
    assert report.reasons == ["the script never imported torch_xla, so nothing ran on the XLA device"]
    assert report.stdout_tail == f"hello True {tmp_path}"


def test_probe_reaches_python_children_and_keeps_their_sitecustomize(tmp_path):
    # torch_xla.launch / xmp.spawn workers are Python children: they must get the probe, and a
    # sitecustomize already on PYTHONPATH (verify's stdout stamps) must still run in them
    other_hook = tmp_path / "hook"
    other_hook.mkdir()
    (other_hook / "sitecustomize.py").write_text("MARK = 'other hook ran'\n")
    child = "import sys, sitecustomize; print(sitecustomize.MARK, '_xlaport_check_runner' in sys.modules)"
    report = check_source(
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n",
        env={"PYTHONPATH": str(other_hook)},
    )
    assert report.exit_code == 0, report.error
    assert report.stdout_tail == "other hook ran True"


def test_check_source():
    report = check_source("import sys\nprint(sys.argv[1:])\n", args=["--x", "1"])
    assert report.exit_code == 0 and report.stdout_tail == "['--x', '1']"
    assert report.script.endswith("script.py")


def test_parse_compilation_analysis():
    text = "\n".join(
        [
            "Compilation Analysis: " + "=" * 20,
            "Compilation Analysis: Compilation Cause",
            "Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync",
            "Compilation Analysis: Graph Info: ",
            "Compilation Analysis:   Graph Hash: 2a56",
            "Compilation Analysis: Python Frame Triggered Execution: ",
            "Compilation Analysis:   item (/venv/lib/python3.11/site-packages/torch/_tensor.py:12)",
            "Compilation Analysis:   <module> (/home/me/train.py:9)",
            "Compilation Analysis: " + "-" * 20,
            "Compilation Analysis: " + "=" * 20,
            "",
            "Post Compilation Analysis: " + "=" * 20,
            "Post Compilation Analysis: Graph input size: 0.000000 GB",
            "Post Compilation Analysis: " + "=" * 20,
        ]
    )
    [compilation] = parse_compilation_analysis(text)
    assert compilation.cause.startswith("most likely user code trying to access tensor value")
    assert compilation.location == "/home/me/train.py:9"


@pytest.mark.slow
def test_max_steps_stops_an_endless_loop_cleanly_and_grades_its_steps():
    report = run_check(PROGRAMS / "endless_loop.py", max_steps=6, timeout_s=300)
    assert report.steps == 6
    assert report.exit_code == 0 and not report.timed_out
    assert report.level == "L2", report.reasons
    assert any("--max-steps" in note for note in report.notes)
    assert "cleanup ran" in report.stdout_tail  # the script's own finally blocks still run


def test_every_file_of_the_child_side_is_a_child_file():
    """The probe's modules are its own frames, never the user's line: each must be in CHILD_FILES (issue 29)."""
    from xlaport.eval.check.events import CHILD_FILES, RUNNER

    child_side = {str(path) for path in RUNNER.parent.glob("probe*.py")} | {str(RUNNER)}
    assert child_side <= set(CHILD_FILES) and len(child_side) == 6


def test_new_graphs_of_a_first_epoch_end_settle_and_are_not_repeated_compilation():
    """A short epoch ending in a partial batch and an epoch-end metric compiles new graphs in a few steps of the
    first epoch, then the cache holds them (an unseen autoencoder script was refused L0 for it). Shapes that keep
    changing compile to the end of the run."""
    from types import SimpleNamespace

    from xlaport.eval.check.grade import compiles_keep_coming

    def report(compiling: set[int], steps: int = 28) -> SimpleNamespace:
        per_step = [SimpleNamespace(index=i, compiles=int(i in compiling), sync_site=None) for i in range(steps)]
        return SimpleNamespace(per_step=per_step, steps_warmup=2)

    assert not compiles_keep_coming(report({0, 1, 4, 5, 6}))  # the first epoch's end, then cached
    assert compiles_keep_coming(report({0, 1, 4, 9, 14, 19, 24}))  # a new shape every few steps
    assert compiles_keep_coming(report(set(range(28))))
    assert not compiles_keep_coming(report({0, 1, 20, 27}))  # two late new graphs (evaluation): a cost, once each
    # a late phase (generation after training) compiles its few graphs, then runs cached to the end
    assert not compiles_keep_coming(report({0, 1, 14, 15, 16}))
    assert compiles_keep_coming(report({0, 1, 14, 15, 16, 24}))  # ... unless it keeps compiling


def test_a_second_optimizer_loop_has_its_own_warm_up():
    """A GAN steps its critic at one barrier and its generator at another (two optimizers, n_dis critic steps per
    generator step): the generator's first two steps (graph without, then with optimizer state) come after the
    run's two warm-up steps. An unseen WGAN-GP was refused L0 for them. Compiles that keep coming at one barrier
    past its own first two still count."""
    from types import SimpleNamespace

    from xlaport.eval.check.grade import compiles_keep_coming

    critic, generator = "train.py:168", "train.py:186"

    def report(compiling: dict[int, str], steps: int = 8) -> SimpleNamespace:
        per_step = [
            SimpleNamespace(index=i, compiles=int(i in compiling), sync_site=compiling.get(i)) for i in range(steps)
        ]
        return SimpleNamespace(per_step=per_step, steps_warmup=2)

    # critic, critic, generator (new), critic (one checkpoint's copies), critic, generator (with its Adam state)
    gan = {0: critic, 1: critic, 2: generator, 3: critic, 5: generator}
    assert not compiles_keep_coming(report(gan))
    assert compiles_keep_coming(report({**gan, 6: critic, 7: critic}))  # the critic keeps compiling
    assert compiles_keep_coming(report({**gan, 6: generator, 7: generator}))  # so does the generator, later
    # a barrier the run does not name is no loop of its own
    assert compiles_keep_coming(report({0: critic, 1: critic, 2: None, 3: critic, 5: None}))
