"""From text to trees, bounded: the limits a source must meet before libcst sees it, and the parse itself.

Every xlaport entry point parses through here, so one oversized or pathological file is refused with a reason
(and the limit that applies) instead of holding a worker for minutes or crashing libcst's native parser.
"""

from __future__ import annotations

import ast
import io
import os
import re
import sys
import threading
import tokenize
from functools import cache

import libcst as cst
from libcst._nodes.base import CSTNode

# Larger sources are refused at once: analysis time grows with the text. Measured on the 2-core machine at
# load 7-10 (real corpus files joined): lint of 250 KB 15 s, 500 KB 25 s, peak ~200 MB at 250 KB; the
# limit keeps lint within 30 s with margin while admitting nearly every real file (transformers' trainer.py
# is 236 KB; 8 of torch's and transformers' 4,930 files are larger). Fixing costs several lint passes.
MAX_SOURCE_CHARS_ENV = "XLAPORT_MAX_SOURCE_CHARS"
DEFAULT_MAX_SOURCE_CHARS = 300_000


class SourceError(ValueError):
    """Source that xlaport cannot analyse (syntax error, not text)."""


# The reason given when the analysis itself hits Python's recursion limit despite the limits below: libcst's
# import-adding rewrite recurses once per top-level statement of a module that opens with a docstring.
RECURSION_LIMIT_HIT = (
    "cannot parse: nested too deeply to analyse safely (Python's recursion limit was hit; a module of over "
    "~1,000 top-level statements can hit it too)"
)


def max_source_chars() -> int:
    """The size limit of one source, `$XLAPORT_MAX_SOURCE_CHARS` (characters), else 300,000."""
    configured = os.environ.get(MAX_SOURCE_CHARS_ENV)
    try:
        return int(configured) if configured else DEFAULT_MAX_SOURCE_CHARS
    except ValueError:
        raise SourceError(f"{MAX_SOURCE_CHARS_ENV} must be a number of characters, not {configured!r}") from None


def max_source_bytes() -> int:
    """A file over this many bytes is over `max_source_chars()` whatever it holds (UTF-8 takes at most 4 bytes a
    character): refused without reading it."""
    return 4 * max_source_chars()


def check_size(source: str) -> None:
    limit = max_source_chars()
    if len(source) > limit:
        raise SourceError(
            f"too large to analyse: {len(source):,} characters, the limit is {limit:,} (analysis time grows with "
            f"the text; set {MAX_SOURCE_CHARS_ENV} to raise it)"
        )


# Limits on what is handed to libcst (override with XLAPORT_MAX_NESTING / XLAPORT_MAX_NODES).
# libcst's native parser overflows its stack on long `and`/`or` chains (a segfault: it kills the process),
# and its Python visitors hit the recursion limit at ~300 nested nodes (measured: `1+1+...`, 300 ok, 400 not).
# Real code nests under 50 levels and a 5,000-line file has ~50,000 nodes (~5 s of lint + fix).
MAX_NESTING = 150
MAX_NODES = 200_000


def _limit(name: str, default: int) -> int:
    value = os.environ.get(f"XLAPORT_{name}", "")
    return int(value) if value.isdigit() else default


def _string_parts(lines: list[str], node: ast.expr, most: int | None = None) -> int:
    """How many literals make up a string (`"a" "b"` is two: libcst nests them like an operator chain).
    `lines`: the source's lines, line ends kept. `most` (for a Constant, which has no children): only whether
    there are more than `most` matters; 0 when the lines cannot hold more (each literal has two quotes at least),
    so that a long docstring is not tokenized."""
    segment = "".join(lines[node.lineno - 1 : node.end_lineno])
    if most is not None and (segment.count('"') + segment.count("'")) // 2 <= most:
        return 0
    try:
        tokens = tokenize.generate_tokens(io.StringIO(segment).readline)
        return sum(tok.type == tokenize.STRING for tok in tokens)
    except (tokenize.TokenError, SyntaxError):
        return 1


def _span_chars(node: ast.expr) -> int:
    if node.end_lineno == node.lineno:
        return node.end_col_offset - node.col_offset
    return 1 << 30  # several lines: count the parts


_CONTEXTS = (ast.Load, ast.Store, ast.Del)
# The field types that never hold a node (the ASDL's builtin types), and the Load/Store/Del marker's
_NOT_NODES = frozenset({"identifier", "string", "int", "constant", "expr_context"})
_FIELD = re.compile(r"(\w+)[*?]? (\w+)")


@cache  # per node type: the walks ask once per node
def ast_node_fields(kind: type) -> tuple[str, ...]:
    """The fields of a CPython AST node type that can hold a node (not a name, a number, a constant or a
    Load/Store/Del marker), read from its ASDL signature, the class docstring (`Name(identifier id,
    expr_context ctx)`); every field when the signature cannot be read. Walks of a whole tree read only these."""
    fields = getattr(kind, "_fields", ())
    typed = {name: kind_ for kind_, name in _FIELD.findall((kind.__doc__ or "").partition("(")[2])}
    if set(typed) != set(fields):
        return tuple(fields)
    return tuple(name for name in fields if typed[name] not in _NOT_NODES)


def check_parse_limits(tree: ast.AST, source: str) -> None:
    """Raises SourceError when `tree` is nested deeper (as libcst nests it) or is larger than libcst handles safely.

    Iterative: the check itself never recurses. A chain `a and b and c` is one node in CPython's AST but
    nested once per operand in libcst's, so each operand counts as a level.
    """
    max_nesting, max_nodes = _limit("MAX_NESTING", MAX_NESTING), _limit("MAX_NODES", MAX_NODES)
    stack: list[tuple[ast.AST, int, int]] = [(tree, 0, 1)]
    nodes = 0
    lines: list[str] | None = None  # the source's lines, split at the first long literal (docstrings are long)
    while stack:
        node, depth, line = stack.pop()
        line = getattr(node, "lineno", line)
        nodes += 1
        if nodes > max_nodes:
            raise SourceError(f"cannot parse: too large to analyse safely (over {max_nodes} syntax nodes)")
        if depth > max_nesting:
            raise SourceError(
                f"cannot parse: nested too deeply to analyse safely (over {max_nesting} levels, line {line})"
            )
        if isinstance(node, ast.Constant | ast.JoinedStr) and hasattr(node, "end_col_offset"):
            # a literal too long for its text alone: count its parts (tokenizing only such literals keeps this cheap)
            if _span_chars(node) > 2 * (max_nesting - depth):
                if lines is None:
                    lines = source.splitlines(keepends=True)
                depth += _string_parts(lines, node, max_nesting - depth if type(node) is ast.Constant else None)
                if depth > max_nesting:
                    raise SourceError(
                        f"cannot parse: nested too deeply to analyse safely (over {max_nesting} levels, line {line})"
                    )
        if isinstance(node, ast.BoolOp):
            stack.extend((value, depth + len(node.values) - i, line) for i, value in enumerate(node.values))
            continue
        if isinstance(getattr(node, "ctx", None), _CONTEXTS):  # a Load/Store/Del marker: a leaf, counted
            nodes += 1
            if nodes > max_nodes:
                raise SourceError(f"cannot parse: too large to analyse safely (over {max_nodes} syntax nodes)")
            if depth + 1 > max_nesting:
                raise SourceError(
                    f"cannot parse: nested too deeply to analyse safely (over {max_nesting} levels, line {line})"
                )
        for name in ast_node_fields(
            type(node)
        ):  # ast.iter_child_nodes, inlined: this loop runs once per node of every file
            value = getattr(node, name, None)
            if type(value) is list:
                stack.extend((item, depth + 1, line) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append((value, depth + 1, line))


# `a = 1; b = 2; ...`: a line of thousands of statements (generated or minified code) costs minutes of analysis
# (10,000 took 180 s on a loaded core); hand-written code has a few.
MAX_STATEMENTS_PER_LINE = 50


def check_statements_per_line(tree: ast.Module) -> None:
    """Raises SourceError for a line with more than XLAPORT_MAX_STATEMENTS_PER_LINE statements (default 50)."""
    limit = _limit("MAX_STATEMENTS_PER_LINE", MAX_STATEMENTS_PER_LINE)
    blocks: list[list[ast.stmt]] = [tree.body]
    while blocks:
        per_line: dict[int, int] = {}
        for stmt in blocks.pop():
            per_line[stmt.lineno] = per_line.get(stmt.lineno, 0) + 1
            if per_line[stmt.lineno] > limit:
                raise SourceError(
                    f"cannot analyse: over {limit} statements on line {stmt.lineno} (generated or minified code?); "
                    f"put one statement per line, or raise XLAPORT_MAX_STATEMENTS_PER_LINE"
                )
            for name in ("body", "orelse", "finalbody"):
                block = getattr(stmt, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    blocks.append(block)
            blocks.extend(part.body for part in getattr(stmt, "handlers", []) + getattr(stmt, "cases", []))


def _not_python(exc: BaseException) -> SourceError:
    if isinstance(exc, RecursionError):  # CPython's own parser gave up (`1 + 1 + ...` of thousands of terms)
        return SourceError(f"cannot parse: nested too deeply to analyse safely (Python's parser: {exc})")
    line = getattr(exc, "lineno", None)
    return SourceError(
        f"cannot parse: {exc.__class__.__name__}: {getattr(exc, 'msg', exc)}" + (f" (line {line})" if line else "")
    )


def check_compiles(tree: ast.Module) -> None:
    """Raises SourceError for what parses but is no program: `return` outside a function, a `from __future__`
    import after other code, `nonlocal` at module level (the compiler's checks, not the parser's). Such a text
    would otherwise reach the fix step, whose check of its own output would blame the rewrite."""
    try:
        compile(tree, "<source>", "exec", dont_inherit=True)  # from the tree: ~half the parse's time
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _not_python(exc) from None


# libcst checks every node it builds (CSTNode.__post_init__ runs `_validate`), the parser's nodes too: about a tenth
# of a parse (measured: torch nn+optim+distributed, 5.9 s -> 5.3 s of CPU). parse_both hands libcst only text that
# CPython has compiled, whose tree is valid, so its parse skips that check (libcst's own comment on __post_init__
# names this saving). Nodes built anywhere else (the rules' rewrites, a parse not made here) are still checked.
_parsing = threading.local()


def _validate_unless_parsing(node: CSTNode) -> None:
    if not getattr(_parsing, "compiled_text", False):
        node._validate()


CSTNode.__post_init__ = _validate_unless_parsing


def _parse_compiled(source: str) -> cst.Module:
    """libcst's module of `source`, which CPython has compiled: its nodes are not checked again."""
    _parsing.compiled_text = True
    try:
        return cst.parse_module(source)
    finally:
        _parsing.compiled_text = False


def parse(source: str) -> cst.Module:
    """The libcst module of `source`; SourceError (with the reason) for what is not Python or too big to analyse.

    CPython's parser goes first: it rejects pathological nesting with a SyntaxError, and its tree is checked
    against the limits above, before libcst (whose native parser would crash the process) sees the text.
    """
    return parse_both(source)[0]


NEWER_PYTHON = "3.14"  # the newest grammar libcst 1.9 parses
MAX_TOKENS_PER_LINE = 1_000  # libcst's parser handled a 3,000-term `and` chain and crashed on 10,000


def _newer_syntax(source: str) -> bool:
    """True when `source`, which this interpreter's parser refused, is Python of a newer version (3.12's `type X`,
    `def f[T]`, nested f-string quotes): then the file is not wrong, this interpreter is too old for it. libcst
    decides, but only for a text whose shape (bracket depth, tokens per line) is known to be safe for its
    native parser: CPython's tree, which the limits above are checked on, does not exist here."""
    depth = tokens = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
                if depth > _limit("MAX_NESTING", MAX_NESTING):
                    return False
            elif token.type == tokenize.OP and token.string in ")]}":
                depth -= 1
            tokens = 0 if token.type == tokenize.NEWLINE else tokens + 1
            if tokens > MAX_TOKENS_PER_LINE:
                return False
        cst.parse_module(source, config=cst.PartialParserConfig(python_version=NEWER_PYTHON))
    except (tokenize.TokenError, SyntaxError, cst.ParserSyntaxError, RecursionError, ValueError):
        return False
    return True


def parse_both(source: str) -> tuple[cst.Module, ast.Module]:
    """`parse`, and CPython's AST of the same text (the name analysis reads its bindings)."""
    check_size(source)
    try:
        tree = compile(source, "<source>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        if _newer_syntax(source):
            raise SourceError(
                f"not analysed: Python syntax newer than the Python {sys.version_info.major}."
                f"{sys.version_info.minor} running xlaport (line {exc.lineno}; valid for a newer Python, not an "
                "error in the file); run xlaport under that Python to analyse it"
            ) from None
        raise _not_python(exc) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _not_python(exc) from None
    check_statements_per_line(tree)
    check_parse_limits(tree, source)
    check_compiles(tree)
    try:
        return _parse_compiled(source), tree
    except cst.ParserSyntaxError as exc:
        raise SourceError(f"cannot parse: {exc.message[:200]} (line {exc.raw_line}, column {exc.raw_column})") from None
    except RecursionError:
        raise SourceError("cannot parse: nested too deeply to analyse safely") from None
