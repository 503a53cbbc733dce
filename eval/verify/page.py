"""The verify report as JSON and as one self-contained HTML page with its plots embedded (base64 PNG).

Plots follow the study's figures: (a) training loss of both runs overlaid, with the deciding reference's
noise band (where a correct migration's curve may lie), (b) the evaluation metric per evaluation, (c) step
time, (d) XLA compilations per step of the migrated run. They are drawn with matplotlib's object API on the
Agg canvas (no pyplot, no display, no global state). The page says which references were used (a recorded
GPU log, the run of the original here), what the band is, and why the verdict is what it is.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from matplotlib.figure import Figure

from xlaport.files import atomic_write
from xlaport.htmlpage import bullets, esc, fmt, page, row

from ..check.report import performance_lines
from .curves import Series, parse_claim, reference_band
from .report import VerifyReport

REFERENCE_COLOR = "#1f77b4"
FALLBACK_COLOR = "#7f7f7f"
MIGRATED_COLOR = "#d62728"
STATUS_COLORS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#ef6c00"}


def _label(run: dict | None, fallback: str) -> str:
    if not run:
        return fallback
    role = "fallback reference" if fallback == "fallback_run" else run["role"]
    return f"{role} on {run['device']}" + (", cached" if run.get("cached") else "")


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def band_of(data: dict) -> dict | None:
    """The deciding reference's noise band (steps, low, high, noise, z, window), or None without a reference loss."""
    loss = ((data.get("reference_run") or {}).get("curves") or {}).get("loss") or {}
    if not loss.get("values"):
        return None
    z = (data.get("config") or {}).get("noise_z", 2.0)
    others = tuple(
        Series("loss", run["curves"]["loss"]["steps"], run["curves"]["loss"]["values"])
        for run in data.get("repeat_runs") or []
        if run["curves"]["loss"]["values"]
    )  # further runs of the original (its run-to-run spread): the band covers them too
    return reference_band(Series("loss", loss["steps"], loss["values"]), z, others=others).to_dict()


def plot_loss(data: dict) -> bytes:
    """(a) Training loss per step of the runs, the reference's noise band around it, the last 25% shaded."""
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    drawn = False
    band = band_of(data)
    if band and band["steps"]:
        ax.fill_between(
            band["steps"],
            band["low"],
            band["high"],
            color=REFERENCE_COLOR,
            alpha=0.15,
            lw=0,
            label=f"reference noise band (±{band['window']} steps, ±{band['z']:g}σ, σ={band['noise']:.3g})",
        )
    for key, color, style in (
        ("fallback_run", FALLBACK_COLOR, "--"),
        ("reference_run", REFERENCE_COLOR, "-"),
        ("migrated_run", MIGRATED_COLOR, "-"),
    ):
        run = data.get(key)
        loss = (run or {}).get("curves", {}).get("loss", {})
        if loss.get("values"):
            ax.plot(loss["steps"], loss["values"], color=color, ls=style, lw=1.4, label=_label(run, key))
            drawn = True
    for index, run in enumerate(data.get("repeat_runs") or []):
        loss = run["curves"]["loss"]
        if loss["values"]:
            label = "other run(s) of the original (its spread)" if index == 0 else None
            ax.plot(loss["steps"], loss["values"], color=REFERENCE_COLOR, ls=":", lw=1.0, alpha=0.8, label=label)
    comparison = data.get("loss")
    if drawn and comparison and comparison.get("steps_compared"):
        steps = data["migrated_run"]["curves"]["loss"]["steps"]
        tail = max(2, -(-comparison["steps_compared"] // 4))
        if len(steps) >= tail:
            ax.axvspan(steps[-tail], steps[-1], color="grey", alpha=0.12, label="last 25% (compared)")
        for key, color in (("ref_tail_mean", REFERENCE_COLOR), ("mig_tail_mean", MIGRATED_COLOR)):
            if comparison.get(key) is not None:
                ax.axhline(comparison[key], color=color, ls=":", lw=1)
        if comparison.get("departs_at_step") is not None and comparison.get("verdict") == "worse":
            ax.axvline(comparison["departs_at_step"], color="black", ls=":", lw=0.8, label="leaves the band")
        if comparison.get("separates_at_step") is not None:
            ax.axvline(comparison["separates_at_step"], color="black", ls="--", lw=0.8, label="curves separate")
    if not drawn:
        _empty(ax, "no training loss captured")
    else:
        ax.set_xlabel("training step")
        ax.set_ylabel("training loss")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax.set_title("(a) Training loss", loc="left", fontsize=10)
    return _png(fig)


def plot_metric(data: dict) -> bytes:
    """(b) The primary evaluation metric at each evaluation of both runs, with the claim's threshold."""
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    metrics = data.get("metrics") or []
    name = metrics[0]["name"] if metrics else None
    drawn = False
    for key, color, marker in (("reference_run", REFERENCE_COLOR, "o"), ("migrated_run", MIGRATED_COLOR, "s")):
        run = data.get(key)
        series = ((run or {}).get("curves", {}).get("metrics", {}) or {}).get(name) if name else None
        if series and series.get("values"):
            xs = list(range(len(series["values"])))
            ax.plot(xs, series["values"], color=color, marker=marker, ms=4, lw=1.2, label=_label(run, key))
            drawn = True
    claim = data.get("claim")
    if drawn and claim:
        threshold = _claim_value(claim["claim"])
        if threshold is not None:
            ax.axhline(threshold, color="black", ls="--", lw=0.8, label=f"claim {claim['claim']}")
    if not drawn:
        _empty(ax, "no evaluation metric captured")
    else:
        ax.set_xlabel("evaluation (in order)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(name)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax.set_title(f"(b) {name or 'Evaluation metric'} per evaluation", loc="left", fontsize=10)
    return _png(fig)


def _claim_value(text: str) -> float | None:
    try:
        return parse_claim(text).value
    except ValueError:
        return None


def plot_step_time(data: dict) -> bytes:
    """(c) Seconds per step of both runs (log scale: compilation steps are orders of magnitude slower)."""
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    drawn = False
    for key, color in (("reference_run", REFERENCE_COLOR), ("migrated_run", MIGRATED_COLOR)):
        run = data.get(key)
        per_step = ((run or {}).get("timing") or {}).get("per_step_s") or []
        if per_step and max(per_step) > 0:
            ax.plot(range(len(per_step)), per_step, color=color, lw=1.2, label=_label(run, key))
            step_s = run["timing"].get("step_s")
            if step_s:
                ax.axhline(step_s, color=color, ls=":", lw=1)
            drawn = True
    if not drawn:
        _empty(ax, "no step times")
    else:
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds per step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    ax.set_title("(c) Step time (dotted: median after warm-up)", loc="left", fontsize=10)
    return _png(fig)


def plot_compiles(data: dict) -> bytes:
    """(d) XLA graph compilations per step of the migrated run, warm-up steps shaded."""
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    check = data.get("check") or {}
    per_step = check.get("per_step") or []
    if per_step:
        ax.bar([s["index"] for s in per_step], [s["compiles"] for s in per_step], color=MIGRATED_COLOR, width=0.8)
        warmup = check.get("steps_warmup", 0)
        if warmup:
            ax.axvspan(-0.5, warmup - 0.5, color="grey", alpha=0.15, label=f"warm-up ({warmup} steps)")
            ax.legend(fontsize=8)
        ax.set_xlabel("XLA step (one torch_xla.sync)")
        ax.set_ylabel("compilations")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3, axis="y")
    else:
        _empty(ax, "no XLA steps recorded")
    total = check.get("compiles_total")
    ax.set_title(
        f"(d) Compilations per step (total {total}, after warm-up {check.get('compiles_after_warmup')})",
        loc="left",
        fontsize=10,
    )
    return _png(fig)


def render_plots(report: VerifyReport | dict) -> dict[str, bytes]:
    """The four plots as PNG bytes, by file name."""
    data = report.to_dict() if isinstance(report, VerifyReport) else report
    return {
        "loss.png": plot_loss(data),
        "metric.png": plot_metric(data),
        "step_time.png": plot_step_time(data),
        "compiles.png": plot_compiles(data),
    }


def save_plots(report: VerifyReport | dict, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, png in render_plots(report).items():
        path = folder / name
        path.write_bytes(png)
        paths.append(path)
    return paths


# --- HTML (the page and its shared pieces: xlaport/htmlpage.py) ---------------------------------


def _reason_class(reason: str, data: dict) -> str:
    if reason.startswith("L3: the goal holds") or "holds:" in reason:
        return "good"
    if reason.startswith(("L3:", "L0:", "stopped")):
        return {"fail": "fail", "inconclusive": "undecided"}.get(data["status"], "")
    return ""


def render_html(report: VerifyReport | dict) -> str:
    """One self-contained page: verdict, every reason, L1 numbers, claim, L4 numbers, runs, plots."""
    data = report.to_dict() if isinstance(report, VerifyReport) else report
    color = STATUS_COLORS.get(data["status"], "#555")
    parts = [
        "<h1>xlaport verify</h1>",
        f"<p><span class='badge' style='background:{color}'>{esc(data['status'].upper())}</span> "
        f"claimed level <b>{esc(data['level'])}</b>, required <b>{esc(data['required'])}</b> "
        f"(exit code {data['exit_code']}; {data['wall_s']:.1f} s)</p>",
        f"<p>original <code>{esc(data['original'])}</code><br>migrated <code>{esc(data['migrated'])}</code><br>"
        f"command <code>{esc(' '.join(data['command']))}</code></p>",
    ]
    if data.get("stopped"):
        parts.append(f"<p><b>Stopped early:</b> {esc(data['stopped'])}</p>")
    parts += _why_section(data)
    parts += _references_section(data)
    parts.append("<h2>Reasons</h2><ul>")
    parts += [f"<li class='{_reason_class(r, data)}'>{esc(r)}</li>" for r in data["reasons"]]
    parts.append("</ul>")
    if data.get("improvements"):
        parts.append("<h2>Improvements over the reference (reported, not failures)</h2><ul>")
        parts += [f"<li class='good'>{esc(r)}</li>" for r in data["improvements"]]
        parts.append("</ul>")

    parts.append("<h2>Plots</h2><div class='plots'>")
    for name, png in render_plots(data).items():
        parts.append(f"<img alt='{esc(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    parts.append("</div>")

    loss = data.get("loss")
    if loss:
        parts.append("<h2>L1: training loss</h2><table>")
        parts.append(row(["", "reference", "migrated", "difference"], header=True))
        parts.append(
            row(["first logged loss", loss["ref_initial"], loss["mig_initial"], _pct(loss["initial_rel_diff"])])
        )
        parts.append(row(["final loss", loss["ref_final"], loss["mig_final"], ""]))
        parts.append(
            row(["mean of last 25%", loss["ref_tail_mean"], loss["mig_tail_mean"], _pct(loss["tail_rel_diff"])])
        )
        parts.append(row(["trend (Spearman vs step)", loss["ref_trend"], loss["mig_trend"], ""]))
        parts.append("</table><table style='margin-top:.5em'>")
        for key in (
            "verdict",
            "steps_compared",
            "curve_distance",
            "curve_spearman",
            "separates_at_step",
            "tail_noise_se",
            "ref_step_noise",
        ):
            parts.append(row([key, loss[key]]))
        parts.append("</table>")
    if data.get("metrics"):
        parts.append("<h2>L1: evaluation metrics</h2><table>")
        parts.append(row(["metric", "direction", "reference", "migrated", "gain", "noise", "verdict"], header=True))
        for m in data["metrics"]:
            direction = "higher better" if m["higher_is_better"] else "lower better"
            parts.append(
                row([m["name"], direction, m["ref_final"], m["mig_final"], m["gain"], m["noise"], m["verdict"]])
            )
        parts.append("</table>")
    if data.get("claim"):
        claim = data["claim"]
        parts.append("<h2>L3: stated claim</h2><table>")
        for key in ("claim", "reference", "migrated", "holds", "inherited", "verdict", "reason"):
            parts.append(row([key, claim.get(key)]))
        parts.append("</table>")
    if data.get("performance"):
        parts.append("<h2>L4: time and cost</h2><table>")
        for key, value in data["performance"].items():
            parts.append(row([key, value]))
        parts.append("</table>")

    parts.append("<h2>Runs</h2><table>")
    parts.append(row(["run", "device", "command", "exit", "wall s", "steps", "loss from", "cached"], header=True))
    for key in ("reference_run", "migrated_run"):
        run = data.get(key)
        if run:
            parts.append(
                row(
                    [
                        run["role"],
                        run["device"],
                        " ".join(run["argv"]),
                        run["returncode"],
                        run["wall_s"],
                        len(run["curves"]["loss"]["values"]),
                        run["curves"]["source"],
                        run["cached"],
                    ]
                )
            )
    parts.append("</table>")
    for key in ("reference_run", "migrated_run"):
        run = data.get(key)
        if run and (run.get("error") or run.get("stdout_tail")):
            parts.append(
                f"<p>{esc(run['role'])} output (tail):</p><pre>{esc(run.get('error') or run['stdout_tail'])}</pre>"
            )
    check = data.get("check")
    if check:
        parts.append("<h2>L2: XLA execution check</h2><table>")
        for key in (
            "level",
            "pjrt_device",
            "steps",
            "compiles_total",
            "compiles_after_warmup",
            "host_transfers_per_step",
            "fallback_ops",
            "nan",
            "stale_optimizer_params",
            "wall_s",
            "startup_s",
            "compile_s",
            "run_s",
        ):
            parts.append(row([key, check.get(key)]))
        parts.append("</table>")
        performance = performance_lines(check)
        if performance:
            parts.append(bullets(performance))
    parts.append("<h2>Settings</h2><pre>" + esc("\n".join(f"{k} = {v!r}" for k, v in data["config"].items())))
    parts.append("</pre>" + (f"<p>from {esc(data['config_file'])}</p>" if data.get("config_file") else ""))
    return page(f"xlaport verify: {data['level']} ({data['status']})", parts)


def _why_section(data: dict) -> list[str]:
    """The reasons that decided the verdict (failures and open questions, or what holds), then every smoke gate."""
    deciding = [r for r in data["reasons"] if _reason_class(r, data) in ("fail", "undecided")]
    if not deciding:
        deciding = [r for r in data["reasons"] if r.startswith(("L3: the goal holds", "L4:", "L3: judged"))]
    parts = [f"<h2>Why this verdict ({esc(data['status'])}, level {esc(data['level'])})</h2><ul>"]
    parts += [f"<li class='{_reason_class(r, data) or 'good'}'>{esc(r)}</li>" for r in deciding]
    parts.append("</ul>")
    if data.get("stops"):
        parts.append("<p>Smoke gates (only NaN/inf stops on the migrated run alone; the others hold it against the "
                     "reference's curve and noise band):</p><table>")  # fmt: skip
        parts.append(row(["gate", "stopped", "reason", "held against"], header=True))
        parts += [row([g["gate"], g["stopped"], g["reason"], g.get("against")]) for g in data["stops"]]
        parts.append("</table>")
    return parts


def _references_section(data: dict) -> list[str]:
    """Each reference used (recorded GPU log, run of the original here) and the noise band of the deciding one."""
    references = data.get("references") or []
    if not references:
        return ["<h2>References</h2><p>No usable reference: nothing to compare against.</p>"]
    parts = ["<h2>References</h2><table>"]
    parts.append(
        row(["reference", "device", "source", "role", "loss points", "level against it", "loss", "metrics", "s/step"],
             header=True)
    )  # fmt: skip
    for ref in references:
        metrics = ", ".join(f"{name} {verdict}" for name, verdict in ref["metric_verdicts"].items())
        role = "decides the verdict" if ref["decides"] else "fallback: shown, not deciding"
        parts.append(
            row([ref["kind"] + (" (cached)" if ref["cached"] else ""), ref["device"], ref["source"], role,
                  ref["loss_points"], ref["level"], ref["loss_verdict"], metrics, ref["step_s"]])
        )  # fmt: skip
    parts.append("</table>")
    band = references[0]["noise"]
    parts.append(
        f"<p>The noise band of the deciding reference (shaded in plot (a)): at each step, the lowest and highest "
        f"reference loss within ±{band['window']} steps, widened by {band['z']:g}× the reference's step-to-step "
        f"noise over its last 25% (σ = {fmt(band['step_noise'])}). A spike the original has too stays inside it; "
        "the migrated run is only stopped for divergence when it rises far above the band and stays above it.</p>"
    )
    spread = data.get("spread")
    if spread:
        firsts = ", ".join(fmt(v) for v in spread["first_losses"])
        if spread["seeded"]:
            what = f"the program fixes its seed: its runs log the same first loss ({firsts})"
        else:
            what = (
                f"the program does not fix its seed: its runs log first losses {firsts} and differ by "
                f"{spread['rel_sd']:.2%} of the loss at a step, {spread['tail_rel_sd']:.2%} over the last 25%; the "
                "migrated run is held against the center of these runs, and a difference inside their spread is "
                "randomness, not the migration"
            )
        parts.append(f"<p>Run-to-run spread ({esc(spread['source'])}, {spread['runs']} runs): {esc(what)}.</p>")
    return parts


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2%}"


def write_report(
    report: VerifyReport, html_path: Path | None = None, json_path: Path | None = None, mode: int | None = None
) -> None:
    """Writes the HTML page and/or the JSON (atomically, so a reader never sees half a file); `mode`: the files'
    mode (default: a new file's usual one)."""
    if json_path is not None:
        atomic_write(Path(json_path), report.to_json() + "\n", mode=mode)
    if html_path is not None:
        atomic_write(Path(html_path), render_html(report), mode=mode)
