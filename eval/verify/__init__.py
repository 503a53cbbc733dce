"""`xlaport verify`: the study's L0–L4 assessment of a migration, from a reference run and a migrated run.

    verify(original_dir, migrated_dir, ["python", "train.py", "--steps", "40"], config) -> VerifyReport

1. The migrated command runs on the XLA device under the execution check (eval/check/), which gives
   L0 (it ran) and L2 (no CPU fallback, no repeated recompilation after warm-up, no NaN, every parameter
   on the device, no stale optimizer parameters, no lost weight tie) plus per-step XLA metrics; host syncs
   are performance findings of the check, which never keep a run from L2 or L3.
2. Fail fast: verify stops before spending a reference run when the migrated smoke test produced
   NaN/inf or its projected full run exceeds the time budget. Divergence and "loss is not falling"
   are judged only against the reference run's curve over the same steps and its noise band (a
   spike the original has too is no failure). Every gate is recorded in the report, stopped or not.
3. The original command runs unchanged as the reference: on CUDA when this machine has a GPU, else on
   the CPU with CUDA calls mapped to it (eval/cuda_to_cpu.py). Same seed and settings: same command.
4. Both runs' loss and metrics are captured (curves/) and compared: L1 numbers, then L3 (the goal
   still holds against the reference run and, if given, a stated claim), then L4 (faster and cheaper).

Both runs happen in throw-away copies of the two trees, so nothing the scripts write (checkpoints,
logs) lands in the user's folders. Levels are ordered none < L0 < L2 < L3 < L4; L1 is a measurement,
not a level. The outcome is "pass" when the claimed level reaches `require`, "inconclusive" when the

Files: `config.py` the settings, `runs.py` the two runs, `assess.py` the gates and levels, `report.py` the
`VerifyReport`, `api.py` `verify` and `verify_tree`, `curves/` capture and comparison of training curves,
`page.py` the HTML page and plots, `cli.py` the command.

This file re-exports nothing, unlike check/ and testgen/: curves/ needs numpy and page.py matplotlib, and
`xlaport --help` imports cli.py (so this package) without either. Import from the files:
`from xlaport.eval.verify.api import verify`, `from xlaport.eval.verify.report import VerifyReport`.
"""
