"""Source positions of a few nodes, as libcst's PositionProvider gives them, without generating the whole module.

PositionProvider generates the code of the whole module to place every node (as costly as parsing it); a lint
pass needs the positions of its few findings. Here only the statement around a node is generated: the innermost
statement of the module or of a block body (a class, function, loop, `if`, `with`, `try`), whose first line CPython's
AST of the same source gives.
The generated text is checked against the source at that line; when it differs (a decorator split over lines,
anything unexpected), the whole module's positions come from PositionProvider as before.
"""

from __future__ import annotations

import ast
import re

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Statements whose first block is the `body` of both the libcst node and the AST node: a node in it is placed by
# generating the statement of that block that holds it, not the whole compound statement (a finding in a long
# loop generates one line of it).
_BLOCK_STATEMENTS = (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.With, cst.If, cst.Try, cst.TryStar)
# The statements placed from their keyword to their block's end (Positions._place_block), and that keyword.
_KEYWORDS = {cst.For: "for", cst.While: "while", cst.With: "with", cst.If: "if"}


class _Computed:
    """What PositionProvidingCodegenState writes to (a provider's `_computed` map)."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}


class Positions:
    """node -> CodeRange for the nodes of one module, computed a statement at a time on demand."""

    def __init__(
        self, module: cst.Module, source: str, tree: ast.Module, parents: dict, wrapper: MetadataWrapper
    ) -> None:
        self.module, self.source, self.tree, self.parents, self.wrapper = module, source, tree, parents, wrapper
        self.known = _Computed()
        self.whole: dict[cst.CSTNode, CodeRange] | None = None  # PositionProvider's map, once it was needed
        self._line_starts: list[int] | None = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self.get(node)
        if found is None:
            raise KeyError(node)
        return found

    def __contains__(self, node: object) -> bool:
        return isinstance(node, cst.CSTNode) and self.get(node) is not None

    def get(self, node: cst.CSTNode) -> CodeRange | None:
        if self.whole is not None:
            return self.whole.get(node)
        found = self.known._computed.get(node)
        if found is None and not self._generate_around(node):
            self.whole = self.wrapper.resolve(PositionProvider)
            return self.whole.get(node)
        return self.known._computed.get(node)

    def _generate_around(self, node: cst.CSTNode) -> bool:
        """Generates the innermost statement of the module or of a block (_BLOCK_STATEMENTS) that holds `node`,
        placed at the line where the AST says it starts. False when that cannot be done or the text does not match."""
        path = [node]
        while (parent := self.parents.get(path[-1])) is not None:
            path.append(parent)
        if path[-1] is not self.module or len(path) < 2:
            return False
        path.reverse()  # module, statement, ...
        body, ast_body, indents = self.module.body, self.tree.body, []
        depth = 1
        while True:
            statement = path[depth]
            ast_statements = _matching(body, ast_body, statement)
            if not ast_statements:
                return False
            block = getattr(statement, "body", None)
            inner = path[depth + 2] if depth + 2 < len(path) else None
            if (
                inner is not None
                and type(statement) in _BLOCK_STATEMENTS
                and type(block) is cst.IndentedBlock
                and path[depth + 1] is block
                and inner in block.body
            ):
                indents.append(block.indent if block.indent is not None else self.module.default_indent)
                body, ast_body, depth = block.body, ast_statements[0].body, depth + 2
                continue
            return self._generate(
                statement, ast_statements[0], indents, node, path[depth + 1] if depth + 1 < len(path) else None
            )

    def _generate(
        self,
        statement: cst.CSTNode,
        first: ast.stmt,
        indents: list[str],
        asked: cst.CSTNode,
        child: cst.CSTNode | None = None,
    ) -> bool:
        """`child`: the child of `statement` that is or holds `asked` (None when `asked` is `statement`)."""
        if asked is statement and self._place_block(statement, first, indents):
            return True
        decorators = getattr(first, "decorator_list", None)
        line = min(d.lineno for d in decorators) if decorators else first.lineno
        line -= len(getattr(statement, "leading_lines", ()))
        block = getattr(statement, "body", None)
        if (
            asked is not statement
            and type(statement) in _BLOCK_STATEMENTS
            and type(block) is cst.IndentedBlock
            and child is not block
            and child is not getattr(statement, "orelse", None)
            and type(statement) not in (cst.Try, cst.TryStar)
        ):
            return self._generate_header(statement, block, line, indents)
        text = self._code_from(statement, line, indents).rstrip("\r\n")  # the module's last line may have no newline
        starts = self._starts()
        # on a mismatch the caller takes every position from PositionProvider, these included
        return 1 <= line <= len(starts) and self.source.startswith(text, starts[line - 1])

    def _code_from(self, node: cst.CSTNode, line: int, indents: list[str]) -> str:
        """The code of `node` generated from `line` at `indents`, recording each node's position in `self.known`."""
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
            provider=self.known,  # type: ignore[arg-type]
        )
        state.indent_tokens = list(indents)
        state.line = line
        node._codegen(state)
        return "".join(state.tokens)

    def _generate_header(self, statement: cst.CSTNode, block: cst.IndentedBlock, line: int, indents: list[str]) -> bool:
        """A node in the header of a block statement (a loop's target or iterable, a `with` item, a function's
        parameters) placed by generating the header alone: the statement with an empty block (which libcst writes
        as one `pass` line, cut off before the text is checked against the source). The header's nodes are the
        statement's own; the stand-in statement and block are new nodes that nothing asks for."""
        header_only = statement.with_changes(body=block.with_changes(body=(), footer=()))
        if getattr(statement, "orelse", None) is not None:
            header_only = header_only.with_changes(orelse=None)
        text = self._code_from(header_only, line, indents)
        indent = block.indent if block.indent is not None else self.module.default_indent
        stand_in = "".join(indents) + indent + "pass" + self.module.default_newline
        if not text.endswith(stand_in):
            return False
        starts = self._starts()
        return 1 <= line <= len(starts) and self.source.startswith(text[: -len(stand_in)], starts[line - 1])

    def _place_block(self, statement: cst.CSTNode, first: ast.stmt, indents: list[str]) -> bool:
        """A loop, `with` or `if` (no `else`) asked for itself, placed without generating its body: libcst's range of
        it runs from its keyword to the end of its block's last statement, which is placed on its own. A finding on
        a long training loop generated the whole loop (8 ms of a 200-line fix, with four such findings)."""
        keyword = _KEYWORDS.get(type(statement))
        block = getattr(statement, "body", None)
        if keyword is None or getattr(statement, "orelse", None) is not None:
            return False
        if type(block) is not cst.IndentedBlock or not block.body:
            return False
        if getattr(statement, "asynchronous", None) is not None:
            keyword = "async"
        column, line, starts = len("".join(indents)), first.lineno, self._starts()
        if first.col_offset != column or not 1 <= line <= len(starts):
            return False
        start = starts[line - 1]
        text = self.source[start : start + column + len(keyword) + 1]
        if text[:column].strip(" \t") or not re.fullmatch(keyword + r"\W", text[column:]):
            return False
        last = self.get(block.body[-1])
        if last is None or self.whole is not None:  # the last statement was not placed: the caller takes libcst's map
            return False
        self.known._computed[statement] = CodeRange(CodePosition(line, column), last.end)
        return True

    def _starts(self) -> list[int]:
        """The offset in the source where each line starts."""
        if self._line_starts is None:
            # CPython's line breaks (str.splitlines also breaks at form feeds and other separators)
            self._line_starts = [0, *(m.end() for m in _LINE_BREAK.finditer(self.source))]
        return self._line_starts


def _matching(body, ast_body: list[ast.stmt], statement: cst.CSTNode) -> list[ast.stmt]:
    """The AST statements of `statement`, one of `body` (a line of `a; b` is two)."""
    index = 0
    for element in body:
        count = len(element.body) if type(element) is cst.SimpleStatementLine else 1
        if element is statement:
            found = ast_body[index : index + count]
            return found if len(found) == count else []
        index += count
    return []
