"""The `xlaport verify` command: a thin front over eval/verify/."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import EXIT_USAGE, OutputFormat, TargetOption, no_evidence_here

from ..check.report import performance_lines


class ReferenceMode(StrEnum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"
    none = "none"


def render_text(report) -> str:
    """Verdict, runs and every reason, for the terminal."""
    data = report.to_dict()
    lines = [f"xlaport verify: level {data['level']} (required {data['required']}): {data['status'].upper()}"]
    for ref in data.get("references") or []:
        lines.append(
            f"  reference {ref['kind']} on {ref['device']}: {ref['loss_points']} loss points"
            + (", decides the verdict" if ref["decides"] else ", fallback (shown, not deciding)")
            + f"; level against it {ref['level']}"
            + (" (cached)" if ref["cached"] else "")
        )
    run = data.get("migrated_run")
    if run:
        lines.append(
            f"  migrated  {run['device']}: exit {run['returncode']}, {len(run['curves']['loss']['values'])} "
            f"loss points, {run['wall_s']:.1f} s"
        )
    for gate in data.get("stops") or []:
        mark = "STOP" if gate["stopped"] else "ok  "
        lines.append(f"  gate {gate['gate']:<11} {mark} {gate['reason']}")
    lines.append("  reasons:")
    lines += [f"    - {reason}" for reason in data["reasons"]]
    if data["improvements"]:
        lines.append("  improvements over the reference (reported, not failures):")
        lines += [f"    + {item}" for item in data["improvements"]]
    performance = performance_lines(data.get("check") or {})
    if performance:
        lines.append("  the migrated run's time (costs time, not correctness):")
        lines += [f"    * {line}" for line in performance]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Adds the command to the root app."""

    @app.command(
        "verify",
        epilog="Exit codes: 0 the claimed level reaches --require; 1 it does not (or a fail-fast stop); "
        "3 inconclusive (too few steps, differences within the noise or the original's run-to-run spread, no "
        "usable reference); 2 usage error.",
    )
    def verify_command(
        original: Annotated[Path, typer.Argument(help="The original (CUDA) project folder.")],
        migrated: Annotated[Path, typer.Argument(help="The migrated project folder.")],
        command: Annotated[list[str], typer.Argument(help="After `--`: the command, e.g. python train.py --steps 40.")],
        require: Annotated[str | None, typer.Option(help="Level the migration must reach: L0, L2, L3 or L4.")] = None,
        claim: Annotated[str | None, typer.Option(help='The stated goal, e.g. "accuracy>=0.95".')] = None,
        metric: Annotated[str | None, typer.Option(help="Evaluation metric that stands for the goal.")] = None,
        higher_better: Annotated[list[str] | None, typer.Option(help="Metric names where higher is better.")] = None,
        lower_better: Annotated[list[str] | None, typer.Option(help="Metric names where lower is better.")] = None,
        log_file: Annotated[
            str | None, typer.Option(help="JSON/JSONL/CSV the script writes (relative to its folder).")
        ] = None,
        loss_pattern: Annotated[str | None, typer.Option(help="Regex for the loss, with a `value` group.")] = None,
        metric_pattern: Annotated[
            str | None, typer.Option(help="Regex for metrics: `value` and `name` groups.")
        ] = None,
        loss_tolerance: Annotated[float | None, typer.Option(help="Relative last-25% loss difference (0.05).")] = None,
        metric_tolerance: Annotated[float | None, typer.Option(help="Absolute metric difference (0.01).")] = None,
        metric_noise: Annotated[float | None, typer.Option(help="Known evaluation noise of the metric.")] = None,
        min_steps: Annotated[int | None, typer.Option(help="Fewer aligned loss points are inconclusive (20).")] = None,
        warmup_steps: Annotated[int | None, typer.Option(help="XLA warm-up steps (2).")] = None,
        full_run_steps: Annotated[int | None, typer.Option(help="Steps of the real run, to project its time.")] = None,
        budget_hours: Annotated[float | None, typer.Option(help="Stop when the projected full run exceeds it.")] = None,
        price_reference: Annotated[float | None, typer.Option(help="$/hour of the reference machine.")] = None,
        price_migrated: Annotated[float | None, typer.Option(help="$/hour of the target machine.")] = None,
        reference: Annotated[
            ReferenceMode | None,
            typer.Option(help="Run the original on cuda, cpu, auto, or none (only --reference-log)."),
        ] = None,
        reference_log: Annotated[
            list[Path] | None,
            typer.Option(
                exists=True,
                dir_okay=False,
                help="JSON/JSONL/CSV of a GPU run of the original (loss per step, metrics, step_time_s, device, "
                "price_per_hour): the reference the verdict uses; the run of the original here is the fallback. "
                "Repeat it for more recorded runs of the original: their spread is its run-to-run noise.",
            ),
        ] = None,
        repeat_reference_s: Annotated[
            float | None,
            typer.Option(
                help="Seconds for a second run of the original, to measure its run-to-run spread (does it fix its "
                "seed?): the whole run when shorter, the steps logged in that time otherwise; 0 = never (120)."
            ),
        ] = None,
        spread_z: Annotated[
            float | None,
            typer.Option(help="Without a fixed seed, a difference must exceed this many run-to-run deviations (5)."),
        ] = None,
        reference_cache: Annotated[Path | None, typer.Option(help="Folder to keep and reuse reference runs.")] = None,
        timeout: Annotated[float | None, typer.Option(help="Seconds per run (600).")] = None,
        migrated_arg: Annotated[
            list[str] | None,
            typer.Option(
                help="An argument added to the migrated run only (repeat it), e.g. --migrated-arg=--device "
                "--migrated-arg=xla where the device comes from the command line (kb XLA233)."
            ),
        ] = None,
        json_out: Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")] = None,
        html_out: Annotated[Path | None, typer.Option("--html", help="Write the HTML report here.")] = None,
        plots: Annotated[Path | None, typer.Option(help="Also save the plots as PNG files in this folder.")] = None,
        format: Annotated[OutputFormat, typer.Option("--format", help="What to print.")] = OutputFormat.text,
        target: TargetOption = "torch_xla",
    ) -> None:
        """Grade a migration L0–L4 against a reference run of the original code (see the exit codes below)."""
        no_evidence_here(target, 3)  # inconclusive: not a failure of the migration, and never a pass
        from .api import verify
        from .config import VerifyUsageError, load_config
        from .page import save_plots, write_report

        directions = {name: "higher" for name in higher_better or []} | {name: "lower" for name in lower_better or []}
        try:
            config, config_file = load_config(migrated, original)
            config = config.with_overrides(
                require=require,
                claim=claim,
                metric=metric,
                metric_directions={**config.metric_directions, **directions} if directions else None,
                log_file=log_file,
                loss_pattern=loss_pattern,
                metric_pattern=metric_pattern,
                loss_tolerance=loss_tolerance,
                metric_tolerance=metric_tolerance,
                metric_noise=metric_noise,
                min_steps=min_steps,
                warmup_steps=warmup_steps,
                full_run_steps=full_run_steps,
                budget_hours=budget_hours,
                price_reference=price_reference,
                price_migrated=price_migrated,
                reference=reference.value if reference else None,
                reference_log=str(reference_log[0]) if reference_log else None,
                reference_log_repeats=[str(p) for p in reference_log[1:]] if reference_log else None,
                repeat_reference_s=repeat_reference_s,
                spread_z=spread_z,
                reference_cache=str(reference_cache) if reference_cache else None,
                timeout_s=timeout,
                migrated_args=[*config.migrated_args, *migrated_arg] if migrated_arg else None,
            )
            report = verify(original, migrated, command, config)
        except (VerifyUsageError, FileNotFoundError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        report.config_file = config_file
        write_report(report, html_path=html_out, json_path=json_out)
        if plots is not None:
            save_plots(report, plots)
        if format is OutputFormat.json:
            typer.echo(report.to_json())
        else:
            typer.echo(render_text(report))
        raise typer.Exit(report.exit_code)
