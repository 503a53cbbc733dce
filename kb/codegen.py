"""The code of the modules that one fix makes from one another, each top-level statement generated once.

A fix generates the whole module's code several times: the rewritten module, the same without the imports the
rewrite left unused (checked to compile, then its text), and that with the `torch_xla` import marked. Those modules
share almost all their top-level statements (node for node: libcst rewrites rebuild only the path to what changed),
and libcst's code generation is a Python call per node: ~10 ms a time for a 200-line module, a tenth of a fix.
"""

from __future__ import annotations

import libcst as cst


class ModuleTexts:
    """`code(module)` is `module.code`; the code of a top-level statement seen in an earlier module is reused.

    A top-level statement's code depends on the statement and the module's indentation and newline only (it is
    generated at no indentation), so it is the same in every module that holds that node. Keep one per fix: it
    holds the statements it has seen."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[cst.CSTNode, str]] = {}  # id -> (the statement, kept so the id stays its own)
        self._style: tuple[str, str] | None = None

    def code(self, module: cst.Module) -> str:
        if not module.has_trailing_newline or not module.body:
            return module.code  # libcst then drops the last newline, or writes one for an empty module
        style = (module.default_indent, module.default_newline)
        if style != self._style:
            self._known.clear()
            self._style = style
        parts = [module.code_for_node(line) for line in module.header]
        for statement in module.body:
            known = self._known.get(id(statement))
            if known is None or known[0] is not statement:
                known = self._known[id(statement)] = (statement, module.code_for_node(statement))
            parts.append(known[1])
        parts.extend(module.code_for_node(line) for line in module.footer)
        return "".join(parts)
