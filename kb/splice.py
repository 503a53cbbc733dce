"""The code of a rewritten module, generated only where the rewrite changed it.

Lint's JSON and SARIF carry each fixable finding's own edits: one rewrite of the module per finding, and the text
of each rewritten module. libcst generates a module's code node by node, which costs about as much as parsing it:
a module with many fixable findings paid that once per finding. A rewrite (edits.replace_nodes) rebuilds only the
nodes above the replaced ones, so every other statement of the rewritten module is a node of the original, and
its code is the original's text wherever it sits at the same indentation (code generation is a function of the
node, the indentation around it and the module's defaults). `OriginalText` records each statement's text once,
from one code generation of the original; `code_after` generates the rewritten module with each of its unchanged
statements stood in for by a one-line placeholder, then swaps each placeholder's code for the original's text.
The result is the rewritten module's `code`, character for character (tests/kb/test_splice.py).
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.internal import CodegenState

from .cst_walk import children_of
from .edits import replace_nodes

STATEMENTS = frozenset(
    {
        cst.SimpleStatementLine,
        cst.FunctionDef,
        cst.ClassDef,
        cst.If,
        cst.For,
        cst.While,
        cst.With,
        cst.Try,
        cst.TryStar,
        cst.Match,
    }
)
# the nodes whose fields can hold statements: walked down to the unchanged statements of a rewritten module
HOLDERS = STATEMENTS - {cst.SimpleStatementLine} | {
    cst.Module,
    cst.IndentedBlock,
    cst.Else,
    cst.Finally,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.MatchCase,
}


class _Recording(CodegenState):
    """Code generation that notes where each statement of `wanted` (node ids; every statement when None) starts
    and ends in the tokens, and the indentation it was generated at."""

    def __init__(self, module: cst.Module, wanted: dict[int, object] | None = None) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.wanted = wanted
        self.open: list[tuple[int, str]] = []
        self.spans: dict[int, tuple[cst.CSTNode, int, int, str]] = {}  # id -> (node, first token, end, indent)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if type(node) in STATEMENTS and (self.wanted is None or id(node) in self.wanted):
            self.open.append((len(self.tokens), "".join(self.indent_tokens)))

    def after_codegen(self, node: cst.CSTNode) -> None:
        if type(node) in STATEMENTS and (self.wanted is None or id(node) in self.wanted):
            start, indent = self.open.pop()
            self.spans[id(node)] = (node, start, len(self.tokens), indent)


class OriginalText:
    """The text of each statement of `module` (and the indentation it is at), from one code generation."""

    def __init__(self, module: cst.Module) -> None:
        state = _Recording(module)
        module._codegen(state)
        self.module = module
        self.tokens = state.tokens
        self.spans = state.spans
        self.code = "".join(state.tokens)  # `module.code`

    def statement(self, node: cst.CSTNode) -> tuple[int, int, str] | None:
        """(first token, end, indentation) of `node` when it is a statement of the original module."""
        found = self.spans.get(id(node))
        return found[1:] if found is not None and found[0] is node else None


def code_after(original: OriginalText, rewritten: cst.Module) -> str:
    """`rewritten.code`, where `rewritten` is a rewrite of `original.module` that shares its unchanged nodes."""
    return splice(original, rewritten)[0]


def splice(original: OriginalText, rewritten: cst.Module) -> tuple[str, str]:
    """(`code_after`, the generated part of it): the rewritten module's code with each statement kept from the
    original (same text, same indentation) stood in for by a one-line placeholder. Python's parser accepts the
    code exactly when it accepts that part: a kept statement parsed in the original at the same indentation, and
    any statement can stand where another one stands. A rewrite's check parses the short part."""
    module = original.module
    if (
        not rewritten.has_trailing_newline  # the module's last newline is dropped: it may be a kept statement's
        or rewritten.default_indent != module.default_indent
        or rewritten.default_newline != module.default_newline
    ):
        code = rewritten.code
        return code, code
    stand_ins: dict[cst.CSTNode, cst.SimpleStatementLine] = {}
    kept: dict[int, cst.CSTNode] = {}  # a stand-in's id -> the original statement
    holders: set[cst.CSTNode] = set()
    stack: list[cst.CSTNode] = [rewritten]
    while stack:
        node = stack.pop()
        holders.add(node)
        for child in children_of(node):
            if original.statement(child) is not None:
                if child not in stand_ins:
                    stand_in = cst.SimpleStatementLine(body=[cst.Expr(cst.Name(f"__xlaport_kept_{len(kept)}__"))])
                    stand_ins[child] = stand_in
                    kept[id(stand_in)] = child
            elif type(child) in HOLDERS:
                stack.append(child)
    if not stand_ins:
        code = rewritten.code
        return code, code
    state = _Recording(module, kept)
    replace_nodes(rewritten, stand_ins, holders)._codegen(state)
    pieces: list[str] = []
    done = 0
    for stand_in, start, end, indent in sorted(state.spans.values(), key=lambda span: span[1]):
        first, last, original_indent = original.statement(kept[id(stand_in)])
        if indent != original_indent:  # a kept statement moved into another block: generate the whole module
            code = rewritten.code
            return code, code
        pieces += state.tokens[done:start]
        pieces += original.tokens[first:last]
        done = end
    pieces += state.tokens[done:]
    return "".join(pieces), "".join(state.tokens)
