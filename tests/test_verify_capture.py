"""Where verify finds a program's loss: its stdout, its stderr (Python `logging`'s default stream, tqdm's bar) and
the files the run wrote (a `logging.FileHandler`'s train.log, a log.txt, CSV, JSON lines), in the formats programs
use. The slow tests run small programs of our own, each logging one way, as real child processes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from xlaport.eval.verify import curves as cv
from xlaport.eval.verify.api import verify
from xlaport.eval.verify.assess import no_loss_message
from xlaport.eval.verify.config import VerifyConfig
from xlaport.eval.verify.runs import capture_curves, run_reference

LOSSES = [2.0, 1.6, 1.3, 1.1, 0.95, 0.9]


# --- the parsers, on text ----------------------------------------------------------------------------------


def test_tqdm_bar_redrawn_with_carriage_returns_gives_one_point_per_count():
    # what tqdm's set_postfix writes: each redraw starts with \r; the same count is drawn again with a new loss
    bars = [f"\r 50%|#####     | {n}/6 [00:01<00:01,  4.1it/s, loss={v:.3f}]" for n, v in enumerate(LOSSES)]
    redrawn = "".join(bars[:3]) + bars[2].replace("loss=1.300", "loss=1.250") + "".join(bars[3:]) + "\n"
    lines = [line for line in redrawn.replace("\r", "\n").splitlines() if line.strip()]
    curves = cv.parse_text("\n".join(lines))
    assert curves.loss.steps == [0, 1, 2, 3, 4, 5]
    assert curves.loss.values == [2.0, 1.6, 1.25, 1.1, 0.95, 0.9]


def test_a_printed_table_with_a_loss_column():
    # a header naming the columns once, then one row of numbers per epoch (a value-iteration repository's log)
    rows = [f"{e:>10} | {v:>10} | {0.5:>10} | {3.2:>10}" for e, v in enumerate(LOSSES, start=1)]
    text = "\n".join(["     Epoch | Train Loss | Train Error | Epoch Time", *rows, "Test Accuracy: 12.50%"])
    curves = cv.parse_text(text)
    assert curves.loss.values == LOSSES and curves.loss.steps == [1, 2, 3, 4, 5, 6]
    spaced = "\n".join(["step    loss      lr", *(f"{i}    {v}    0.001" for i, v in enumerate(LOSSES))])
    assert cv.parse_text(spaced).loss.values == LOSSES
    assert not len(cv.parse_text("| epoch | val_loss |\n| 1 | 0.5 |").loss)  # an evaluation's loss is not it


def test_a_new_tqdm_bar_each_epoch_continues_the_steps():
    # a bar per epoch counting samples (t.update(len(inputs))): 8, 16, 24 of 24, then again
    epochs = [[(8, 0.5), (16, 0.4), (24, 0.35)], [(8, 0.3), (16, 0.28), (24, 0.25)]]
    text = "\n".join(
        f"epoch: {e}/1: {n * 4}%|##   | {n}/24 [00:01<00:02,  5.1it/s, loss={v}]"
        for e, bar in enumerate(epochs)
        for n, v in bar
    )
    curves = cv.parse_text(text)
    assert curves.loss.steps == [8, 16, 24, 32, 40, 48] and curves.loss.values == [0.5, 0.4, 0.35, 0.3, 0.28, 0.25]


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("| epoch 001 | step 10 | loss 1.234 | lr 0.001 |", 1.234),
        ("Epoch: [0][3/10]----Batch Time 0.120 (0.118)----Loss 0.4321 (0.5000)", 0.4321),
        ("INFO:root:- Train metrics: accuracy: 0.250 ; loss: 1.875", 1.875),
        ("2026-12-04 05:00:00,123 - trainer - INFO - epoch 3 train_loss=0.75", 0.75),
    ],
)
def test_more_common_loss_formats(line, value):
    assert cv.parse_text(line).loss.values == [value]


def test_csv_with_settings_written_above_the_table_and_a_loss_column_by_another_name(tmp_path):
    # a logger that writes its arguments as rows, a blank row, then the table (a real repository's CSVLogger does)
    text = "dataset,cifar10\nepochs,3\n\nepoch,loss_train,test_acc\n0,2.0,0.1\n1,1.5,0.2\n2,1.2,0.3\n"
    curves = cv.parse_log_file(tmp_path / "run.csv", text)
    assert curves.loss.values == [2.0, 1.5, 1.2]
    assert curves.metrics["test_acc"].values == [0.1, 0.2, 0.3] and "loss_train" not in curves.metrics


def test_json_lines_with_a_slashed_loss_key(tmp_path):
    text = "\n".join(f'{{"step": {i}, "train/loss": {v}}}' for i, v in enumerate(LOSSES))
    assert cv.parse_log_file(tmp_path / "metrics.jsonl", text).loss.values == LOSSES


def test_the_stream_with_the_most_loss_points_wins_and_gives_the_timing():
    out = ("Checkpoint Directory exists!", cv.Timing(step_s=None))
    err = ("\n".join(f"INFO:root:step {i} loss: {v}" for i, v in enumerate(LOSSES)), cv.Timing(step_s=0.5))
    curves, timing, _, read = capture_curves({"stdout": out, "stderr": err}, {}, VerifyConfig())
    assert curves.loss.values == LOSSES and curves.source == "stderr" and timing.step_s == 0.5
    assert read[:2] == ["stdout (1 lines)", "stderr (6 lines)"] and "file written by the run" in read[2]


def test_no_loss_message_says_what_was_read():
    message = no_loss_message("reference", VerifyConfig(), ["stdout (3 lines)", "stderr (40 lines)", "out/notes.txt"])
    assert "read: stdout (3 lines), stderr (40 lines), out/notes.txt" in message
    assert "tqdm postfix" in message and "logging records" in message and "CSV file with a loss column" in message


# --- real runs of small programs of our own ----------------------------------------------------------------

# Each program "trains" for six steps with losses LOSSES and logs them one way; none prints a loss to stdout.
PROGRAMS = {
    "logging_to_stderr": """
        import logging
        logging.basicConfig(level=logging.INFO)  # a StreamHandler on stderr: Python's default
        log = logging.getLogger("trainer")
        print("Checkpoint Directory exists!")
        for step, loss in enumerate(LOSSES):
            log.info("Epoch %d - loss: %.4f", step, loss)
    """,
    "logging_to_a_file": """
        import logging, os
        os.makedirs("experiments/base", exist_ok=True)
        log = logging.getLogger()
        log.setLevel(logging.INFO)
        log.addHandler(logging.FileHandler("experiments/base/train.log"))
        for step, loss in enumerate(LOSSES):
            log.info("- Train metrics: accuracy: 0.5 ; loss: %.4f", loss)
    """,
    "log_txt_by_hand": """
        with open("log.txt", "w") as log:
            for step, loss in enumerate(LOSSES):
                print(f"| epoch {step:03d} | loss {loss:.3f} | lr 0.001 |", file=log, flush=True)
    """,
    "tqdm_postfix": """
        from tqdm import tqdm
        bar = tqdm(range(len(LOSSES)), mininterval=0)
        for step in bar:
            bar.set_postfix(loss=f"{LOSSES[step]:.4f}")
    """,
    "csv_with_a_loss_column": """
        import csv, os
        os.makedirs("logs", exist_ok=True)
        with open("logs/run.csv", "w", newline="") as f:
            f.write("lr,0.1\\n\\n")
            writer = csv.DictWriter(f, fieldnames=["epoch", "loss_train", "test_acc"])
            writer.writeheader()
            for step, loss in enumerate(LOSSES):
                writer.writerow({"epoch": step, "loss_train": loss, "test_acc": 0.1 * step})
    """,
    "json_lines": """
        import json
        with open("metrics.jsonl", "w") as f:
            for step, loss in enumerate(LOSSES):
                f.write(json.dumps({"step": step, "train_loss": loss}) + "\\n")
    """,
    "running_average_on_stdout": """
        for step, loss in enumerate(LOSSES):
            print(f"Epoch: [0][{step}/6]----Batch Time 0.100 (0.100)----Loss {loss:.4f} ({loss + 0.5:.4f})")
    """,
}
SILENT = """
    import sys
    print("starting")
    print("warming up", file=sys.stderr)
    with open("notes.txt", "w") as f:
        f.write("done\\n")
"""


def _run_program(tmp_path: Path, body: str, config: VerifyConfig | None = None):
    tree = tmp_path / "tree"
    tree.mkdir()
    source = f"LOSSES = {LOSSES!r}\n" + textwrap.dedent(body)
    (tree / "train.py").write_text(source)
    config = config or VerifyConfig(reference="cpu", timeout_s=120)
    return run_reference(tree, "train.py", [], config, tmp_path / "scratch"), config


@pytest.mark.slow
@pytest.mark.parametrize("way", sorted(PROGRAMS))
def test_the_loss_is_found_where_the_program_logs_it(tmp_path, way):
    (tmp_path / "scratch").mkdir()
    record, _ = _run_program(tmp_path, PROGRAMS[way])
    assert record.ok, record.error
    found = record.curves.loss
    if way == "tqdm_postfix":  # the bar's last redraw, at 6/6, shows the last postfix again: one point per count
        assert found.steps == list(range(7)) and found.values[-1] == found.values[-2]
        found = cv.Series("loss", found.steps[:-1], found.values[:-1])
    assert found.values == pytest.approx(LOSSES, abs=1e-3), (way, record.read, record.curves.source)


@pytest.mark.slow
def test_a_run_that_logs_no_loss_says_what_was_read(tmp_path):
    (tmp_path / "scratch").mkdir()
    record, config = _run_program(tmp_path, SILENT)
    assert record.ok and not len(record.curves.loss)
    assert record.read == ["stdout (1 lines)", "stderr (1 lines)", "notes.txt"]
    message = no_loss_message("reference", config, record.read)
    assert "read: stdout (1 lines), stderr (1 lines), notes.txt" in message and "`train_loss=1.23`" in message


MIGRATION_ORIGINAL = """
import logging

import torch

# (not basicConfig: `import torch_xla` calls logging.basicConfig() itself, so a later one does nothing)
log = logging.getLogger()
log.setLevel(logging.INFO)
log.addHandler(logging.StreamHandler())
torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8).to(device), torch.randn(64, 1).to(device)
for step in range(24):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    {barrier}
    log.info("step %d train_loss=%.5f", step, loss.item())
"""


@pytest.mark.slow
def test_verify_compares_a_loss_logged_to_stderr_by_both_runs(tmp_path):
    original, migrated = tmp_path / "original", tmp_path / "migrated"
    original.mkdir(), migrated.mkdir()
    (original / "train.py").write_text(MIGRATION_ORIGINAL.replace("{barrier}", "pass"))
    moved = MIGRATION_ORIGINAL.replace('torch.device("cuda")', "torch_xla.device()")
    moved = moved.replace("import torch\n", "import torch\nimport torch_xla\n", 1)
    (migrated / "train.py").write_text(moved.replace("{barrier}", "torch_xla.sync()"))
    report = verify(original, migrated, ["python", "train.py"], VerifyConfig(reference="cpu", min_steps=10))
    assert report.loss is not None and report.loss.steps_compared == 24, report.reasons
    assert report.capture["reference"]["loss_source"] == "stderr" == report.capture["migrated"]["loss_source"]
    assert report.level == "L3", report.reasons


LOGGED_AFTER_TORCH_XLA = """
import logging

import torch
import torch_xla

logging.basicConfig(level=logging.INFO, format="%(message)s")
logging.info("step 0 loss: 1.2345")
"""


@pytest.mark.slow
def test_a_migrated_program_keeps_its_logging_config_with_the_fix(tmp_path):
    """`import torch_xla` calls logging.basicConfig() itself: the program's own call did nothing and its loss
    lines (INFO) never reached stderr, so verify found no loss in the migrated run. XLA714 adds force=True."""
    import subprocess
    import sys

    from xlaport.kb import fix_source

    def stderr_of(source: str) -> str:
        (tmp_path / "train.py").write_text(source)
        env = {"PJRT_DEVICE": "CPU", "PATH": "/usr/bin:/bin"}
        run = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        return run.stderr

    assert "loss: 1.2345" not in stderr_of(LOGGED_AFTER_TORCH_XLA)
    fixed = fix_source(LOGGED_AFTER_TORCH_XLA, "train.py").fixed
    assert "force=True" in fixed and "step 0 loss: 1.2345" in stderr_of(fixed)
