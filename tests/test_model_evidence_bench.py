"""The model-evidence benchmark's own judgement: when a finding's site counts as gone, and which host syncs a
check run leaves at it. The runs themselves are measured by bench/model_evidence.py, not here."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "model_evidence.py"
_spec = importlib.util.spec_from_file_location("model_evidence_bench", BENCH)
evidence = importlib.util.module_from_spec(_spec)
sys.modules["model_evidence_bench"] = evidence  # dataclasses resolve their module by name
_spec.loader.exec_module(evidence)

MIGRATED = textwrap.dedent(
    """\
    import torch
    import torch_xla


    def train(model, loader, opt):
        total = 0.0
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            total += loss.item()
            torch_xla.sync()
        return total
    """
)
LINE = MIGRATED.splitlines().index("        total += loss.item()") + 1
SITE = evidence.Site("train.py", LINE, "XLA401", "train")


def test_the_migrated_file_reports_the_site():
    assert evidence.still_reported(SITE, MIGRATED, MIGRATED)


def test_a_rewrite_that_keeps_the_value_on_the_device_closes_it():
    fixed = MIGRATED.replace("total = 0.0", "total = torch.zeros(())").replace(
        "total += loss.item()", "total += loss.detach()"
    )
    assert not evidence.still_reported(SITE, MIGRATED, fixed)


def test_moving_the_read_to_another_line_of_the_function_does_not_close_it():
    moved = MIGRATED.replace("        total += loss.item()\n", "        value = loss.item()\n        total += value\n")
    assert evidence.still_reported(SITE, MIGRATED, moved)


def test_only_every_step_syncs_inside_the_function_count_and_other_open_sites_are_left_out():
    check = {
        "host_syncs": [
            {"site": f"/tmp/run/proj/train.py:{LINE}", "every_step": True},
            {"site": "/tmp/run/proj/train.py:14", "every_step": False},  # once, after the loop
            {"site": f"/tmp/run/proj/other.py:{LINE}", "every_step": True},
        ]
    }
    assert evidence.sync_left(check, SITE, MIGRATED, open_lines=set()) == [f"train.py:{LINE}"]
    assert evidence.sync_left(check, SITE, MIGRATED, open_lines={"total += loss.item()"}) == []


def test_the_manifest_holds_at_least_30_findings_of_real_programs_with_commits():
    programs = evidence.load_manifest()
    findings = [f for p in programs for f in p.findings]
    assert len(findings) >= 30
    assert all(len(p.commit) == 40 for p in programs)
    assert {f.code for f in findings} <= {f"XLA{n}" for n in range(401, 420)} | {"XLA517"}
