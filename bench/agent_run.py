"""An agent-style run: one whole repository driven to a verified state with the MCP tools alone (issue 31).

The "agent" is a fixed policy that decides each next call from the previous tools' outputs only (no hand edit of
any file or tool input beyond the arguments it chooses); it talks to `xlaport mcp` over stdio through the python
mcp client, as a coding agent would. Every call is logged with its arguments and the gist of its result.

Policy, in order, until verify passes or the call budget is spent:
1. migrate_repo(src, dst, validate_cmd=CMD, verify_cmd=CMD): the migrated copy, validated and verified (one run).
2. verify found no loss in the output: read the migrated run's output from the verify report, take the first line
   holding the word loss and a number, and verify again with a loss_pattern made from it.
3. a finding says the device comes from the command line (`--device xla`): verify again with migrated_args.
4. items left for a human that have an unsafe fix, or a rejected validation: suggest_patch on that file in the
   migrated tree (project_root, unsafe_fixes, validate, command); a validated patch's text is written to the file
   (what an agent's edit tool does with a tool's output), then verify again.
Then, with `--wrong FILE OLD NEW`, a wrong migration made by hand (e.g. the loss's sign swapped) is verified the same
way and must not pass: that edit is the harness's, not the agent's, and its calls are counted apart.

    .venv/bin/python bench/agent_run.py --repo /path/to/repo --command "python train.py --epochs 2" [--json out]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

MAX_CALLS = 10


class Agent:
    def __init__(self, client, log: list[dict]) -> None:
        self.client = client
        self.log = log

    async def call(self, tool: str, arguments: dict) -> dict | str:
        started = time.perf_counter()
        result = await self.client.call_tool(tool, arguments)
        value = result.content[0].text if result.is_error else result.structured_content
        shown = {k: (v if not isinstance(v, str) or len(v) < 200 else v[:200] + "...") for k, v in arguments.items()}
        self.log.append(
            {
                "tool": tool,
                "arguments": shown,
                "error": result.is_error,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(f"call {len(self.log)}: {tool} {json.dumps(shown)[:300]} -> {str(value)[:400]}", flush=True)
        return value


def loss_pattern_from(output: str) -> str | None:
    """A regex with a `value` group for the first output line that names a loss followed by a number."""
    for line in output.splitlines():
        found = re.search(r"(\b\w*loss\w*\b)(\W{0,4})\s*(-?\d+\.?\d*(?:[eE][-+]?\d+)?)", line, re.IGNORECASE)
        if found:
            return (
                re.escape(found.group(1))
                + re.escape(found.group(2)).replace("\\ ", "\\s*")
                + r"\s*(?P<value>-?[0-9.]+(?:[eE][-+]?[0-9]+)?)"
            )
    return None


def migrated_output(verification: dict) -> str:
    run = (verification.get("report") or {}).get("migrated_run") or {}
    return "\n".join(str(run.get(key) or "") for key in ("stdout_tail", "stdout", "output", "log_tail"))


async def drive(
    repo_rel: str, dst_rel: str, command: str, work: Path, log: list[dict], wrong: tuple[str, str, str] | None = None
) -> dict:
    import mcp
    from mcp.client.stdio import StdioServerParameters

    exe = Path(sys.executable).with_name("xlaport")
    params = StdioServerParameters(command=str(exe), args=["mcp", "--root", str(work)])
    async with mcp.Client(params, read_timeout_seconds=7200) as client:
        agent = Agent(client, log)
        summary = await agent.call(
            "migrate_repo", {"src": repo_rel, "dst": dst_rel, "validate_cmd": command, "verify_cmd": command}
        )
        if isinstance(summary, str):
            return {"final": "error", "why": summary}
        verification = summary.get("verification") or {}
        status = verification.get("status")
        verify_args: dict = {"original_dir": repo_rel, "migrated_dir": dst_rel, "command": command}
        left = summary.get("left_for_human", [])
        need_verify = False
        for item in left:  # rule 3: the device is a command-line flag
            device_flag = re.search(r"run the migrated program with `([^`]+)`", item.get("message", ""))
            if device_flag and status != "pass":
                verify_args["migrated_args"] = device_flag.group(1).split()
                need_verify = True
        patched: set[str] = set()
        while status != "pass" and len(log) < MAX_CALLS:
            if need_verify:
                arguments = {k: v for k, v in verify_args.items() if v is not None}
                verification = await agent.call("verify_migration", arguments)
                if isinstance(verification, str):
                    return {"final": "error", "why": verification}
                status, need_verify = verification["status"], False
                continue
            reasons = " ".join(verification.get("reasons") or [])
            if "loss_pattern" in reasons and not verify_args.get("loss_pattern"):  # rule 2
                if "report" not in verification:  # migrate_repo's summary: the full report has the output
                    need_verify = True
                    continue
                pattern = loss_pattern_from(migrated_output(verification))
                if pattern is None:
                    return {"final": status, "why": "no loss line in the output to build a pattern from"}
                verify_args["loss_pattern"] = pattern
                need_verify = True
                continue
            unsafe = [i for i in left if i.get("fix") == "unsafe" and i["path"] not in patched]
            rejected = (summary.get("validation") or {}).get("status") == "rejected"
            if unsafe or rejected and not patched:  # rule 4
                path = unsafe[0]["path"] if unsafe else (summary.get("left_for_human") or [{}])[0].get("path")
                if path is None:
                    break
                patched.add(path)
                arguments = {
                    "project_root": dst_rel,
                    "path": path,
                    "unsafe_fixes": True,
                    "validate": True,
                    "command": command,
                    "k": 0,
                }
                patch = await agent.call("suggest_patch", arguments)
                if isinstance(patch, dict) and patch["changed"] and patch["evidence"]["status"] == "validated":
                    (work / dst_rel / path).write_text(patch["migrated"])  # the agent's edit tool, the tool's text
                    need_verify = True
                continue
            break
        outcome = {"final": status, "level": verification.get("level"), "reasons": verification.get("reasons")}
        if wrong is not None and status == "pass":  # the same verify, on a copy with a hand-made wrong edit
            outcome["wrong"] = await judge_wrong(agent, verify_args, work, dst_rel, wrong)
        return outcome


async def judge_wrong(agent: Agent, verify_args: dict, work: Path, dst_rel: str, wrong: tuple[str, str, str]) -> dict:
    """A wrong migration made by hand (not by the agent): `wrong` is (file, old text, new text) applied to a copy of
    the verified tree; verify_migration must not pass it, and its reasons say why."""
    path, old, new = wrong
    wrong_rel = f"{dst_rel}-wrong"
    shutil.copytree(work / dst_rel, work / wrong_rel, ignore=shutil.ignore_patterns("xlaport-*"))
    text = (work / wrong_rel / path).read_text()
    assert old in text, f"{old!r} is not in {path}"
    (work / wrong_rel / path).write_text(text.replace(old, new, 1))
    arguments = {k: v for k, v in {**verify_args, "migrated_dir": wrong_rel}.items() if v is not None}
    verification = await agent.call("verify_migration", arguments)
    if isinstance(verification, str):
        return {"edit": f"{path}: {old!r} -> {new!r}", "error": verification}
    return {
        "edit": f"{path}: {old!r} -> {new!r}",
        "status": verification.get("status"),
        "level": verification.get("level"),
        "reasons": verification.get("reasons"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="the repository (copied into a work folder)")
    parser.add_argument("--command", required=True)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--wrong",
        nargs=3,
        metavar=("FILE", "OLD", "NEW"),
        help="after a pass: verify a copy of the migrated tree with OLD replaced by NEW in FILE (must not pass)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xlaport-agent-"))
    shutil.copytree(args.repo, work / args.repo.name, ignore=shutil.ignore_patterns(".git"))
    log: list[dict] = []
    started = time.perf_counter()
    wrong = tuple(args.wrong) if args.wrong else None
    outcome = asyncio.run(drive(args.repo.name, f"{args.repo.name}-xla", args.command, work, log, wrong))
    outcome.update(
        {
            "repo": args.repo.name,
            "command": args.command,
            "tool_calls": len(log) - ("wrong" in outcome),  # the agent's own; the wrong migration's verify apart
            "wrong_check_calls": int("wrong" in outcome),
            "calls": log,
            "hand_edits": 0,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    )
    print(json.dumps({k: v for k, v in outcome.items() if k != "calls"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(outcome, indent=1))


if __name__ == "__main__":
    main()
