"""The rule base for environment variables set in code (kb/analysis/env.py finds them)."""

from __future__ import annotations

import libcst as cst

from .analysis.env import EnvWrite, env_writes
from .rule import Rule


class EnvWriteRule(Rule):
    """A rule about environment variables set in code: `check_write` sees each one."""

    def visit_Assign(self, node: cst.Assign) -> None:
        for write in env_writes(self, node):
            self.check_write(write)

    def visit_Call(self, node: cst.Call) -> None:
        for write in env_writes(self, node):
            self.check_write(write)

    def check_write(self, write: EnvWrite) -> None:
        raise NotImplementedError
