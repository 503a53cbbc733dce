"""The code model at serving time: proposes a rewrite of one function that the rules could not fix.

A model directory is a LoRA artifact of `xlaport train lora` (adapter + tokenizer + `xlaport.json`
naming its base model) or any peft adapter directory. Base + adapter are loaded once per process
(`load_proposer` caches them) and run eagerly (CPU, or CUDA when present): generation grows the
sequence token by token, which XLA would compile at every length.

The model writes an edit script (model/prompts.py: added imports, `-old`/`+new` lines), which
is applied to the function. Generation is greedy (deterministic) and bounded. A candidate is
rejected, with the reason, when it does not end within the bound, its edits do not apply, the
result does not parse, is not one function, changes the function's signature, changes nothing, or
leaves every finding it was asked to fix in place;
the rest goes to the pipeline, which lints and validates it.
"""

from __future__ import annotations

import ast
import json
import os
import textwrap
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xlaport.kb import Finding, lint_source

from xlaport.paths import models_dir

from .artifacts import newest, read_meta
from .prompts import PROMPT_FORMAT, EditError, apply_edit_script, join_target, kb_entries, prompt_variants, split_target
from .proposal import Proposal
from .spans import function_spans, imports_used

MIN_NEW_TOKENS = 16
MODEL_ENV = "XLAPORT_MODEL"


class ModelNotUsable(ValueError):
    """A model directory that cannot be served (missing files, other prompt format)."""


class ProposalRejected(ValueError):
    """A candidate that is not handed to validation; the message says why."""


@dataclass
class Candidate:
    """What the model generated for one function, and whether it may go to validation."""

    function_name: str
    original: str  # the function as given (dedented)
    code: str | None = None  # the candidate function (dedented); None when rejected
    imports: list[str] = field(default_factory=list)  # import statements the candidate needs
    rejected_reason: str | None = None
    raw: str = ""  # the generated text
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.rejected_reason is None

    def to_dict(self) -> dict:
        return asdict(self)


# --- finding and loading a model ------------------------------------------------------------------
def find_model_dir(model_dir: Path | None = None, use_newest: bool = True) -> Path | None:
    """The model to serve: `model_dir`, else `$XLAPORT_MODEL`, else (with `use_newest`) the newest LoRA model
    in the models dir."""
    if model_dir is not None:
        return Path(model_dir)
    configured = os.environ.get(MODEL_ENV)
    if configured:
        return Path(configured).expanduser()
    return newest("lora") if use_newest else None


def base_model_of(model_dir: Path) -> Path | str:
    """The base model an adapter was trained on (from `xlaport.json`, else peft's adapter_config.json)."""
    meta = read_meta(model_dir)
    if meta and meta["kind"] == "lora":
        if meta.get("prompt_format") != PROMPT_FORMAT:
            raise ModelNotUsable(
                f"{model_dir} was trained with prompt format {meta.get('prompt_format')}, this xlaport uses "
                f"{PROMPT_FORMAT}: retrain it with `xlaport train lora`"
            )
        return Path(meta["base_model"])
    try:
        adapter = json.loads((model_dir / "adapter_config.json").read_text(encoding="utf-8"))
        return adapter["base_model_name_or_path"]
    except (OSError, ValueError, KeyError):
        raise ModelNotUsable(f"{model_dir} is neither an xlaport LoRA model nor a peft adapter directory") from None


_LOADED: dict[Path, CodeModel] = {}
_LOAD_LOCK = threading.Lock()


def load_proposer(model_dir: Path | None = None, use_newest: bool = True) -> CodeModel | None:
    """The code model (loaded once per process and directory), or None when no model exists (or, without
    `use_newest`, none is configured: see `find_model_dir`).

    A model that exists but cannot be loaded raises ModelNotUsable: a broken model is not silently
    replaced by rules-only operation.
    """
    directory = find_model_dir(model_dir, use_newest)
    if directory is None:
        return None
    if not directory.is_dir():
        raise ModelNotUsable(f"model directory not found: {directory}")
    directory = directory.resolve()
    with _LOAD_LOCK:
        if directory not in _LOADED:
            _LOADED[directory] = CodeModel(directory)
        return _LOADED[directory]


def no_model_message() -> str:
    return (
        f"no code model in {models_dir()} (nor ${MODEL_ENV}): running rules-only; train one with `xlaport train lora`"
    )


# --- the model --------------------------------------------------------------------------------------
class CodeModel:
    """Base + LoRA adapter. Implements `xlaport.model.proposal.Proposer`."""

    def __init__(self, model_dir: Path, device: str | None = None) -> None:
        os.environ.setdefault("USE_TORCH_XLA", "0")  # serving runs eagerly; keeps accelerate from importing XLA
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        self.name = self.model_dir.name
        meta = read_meta(self.model_dir) or {}
        base = base_model_of(self.model_dir)
        if isinstance(base, Path) and not base.is_dir():
            raise ModelNotUsable(f"the base model of {self.model_dir} is missing: {base}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        base_model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        self.model = PeftModel.from_pretrained(base_model, str(self.model_dir)).to(self.device).eval()
        config = base_model.config
        self.context = int(
            meta.get("context")
            or getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", 1024)
        )
        self.max_new_tokens = int(meta.get("max_new_tokens", 512))
        self._lock = threading.Lock()  # one generation at a time: the CPU is the bottleneck anyway

    # the pipeline's protocol: the whole file in, the whole file (one function rewritten) out
    def propose(self, source: str, function_name: str, findings: list[Finding], retrieved: list[dict]):
        """A `Proposal` for `function_name` in `source`, or None when it is not a function.

        Raises ProposalRejected (the pipeline records it as a note) when the candidate is rejected.
        """
        candidate, new_source = self.rewrite_in_file(source, function_name, findings, retrieved)
        if candidate is None:
            return None
        if new_source is None:
            raise ProposalRejected(candidate.rejected_reason)
        codes = ", ".join(sorted({f.code for f in findings}))
        return Proposal(
            function_name=function_name,
            source=new_source,
            rationale=(
                f"code model {self.name} rewrote {function_name} for {codes} (greedy, {candidate.new_tokens} tokens, "
                f"{candidate.new_tokens / max(candidate.seconds, 1e-9):.1f} tokens/s)"
            ),
            model=self.name,
        )

    def rewrite_in_file(
        self, source: str, function_name: str, findings: list[Finding], retrieved: list[dict]
    ) -> tuple[Candidate | None, str | None]:
        """(candidate, the file with it spliced in); (None, None) when `function_name` is not a function in `source`."""
        span = next(((s, e) for name, s, e in function_spans(source) if name == function_name), None)
        if span is None:
            return None, None
        lines = source.splitlines(keepends=True)
        text = "".join(lines[span[0] - 1 : span[1]])
        indent = text[: len(text) - len(text.lstrip())]
        function = textwrap.dedent(text)
        codes = [f.code for f in findings] + [str(hit.get("code", "")) for hit in retrieved]
        candidate = self.candidate(function, imports_used(source, function), codes, function_name)
        if not candidate.accepted:
            return candidate, None
        body = textwrap.indent(candidate.code, indent) if indent else candidate.code
        new_source = "".join(lines[: span[0] - 1]) + body + "".join(lines[span[1] :])
        new_source = add_imports(new_source, candidate.imports)
        try:
            ast.parse(new_source)
        except SyntaxError as exc:
            candidate.rejected_reason = (
                f"the file does not parse with the candidate spliced in: {exc.msg} (line {exc.lineno})"
            )
            return candidate, None
        left = findings_left(new_source, function_name, findings)
        if findings and left == sorted(f.code for f in findings):
            candidate.rejected_reason = f"the candidate leaves the finding in place: {', '.join(dict.fromkeys(left))}"
            return candidate, None
        return candidate, new_source

    def candidate(self, function: str, imports: str, codes: list[str], function_name: str = "") -> Candidate:
        """The model's rewrite of one dedented function, checked (see module docstring)."""

        start = time.perf_counter()
        result = Candidate(function_name=function_name, original=function)
        entries = kb_entries([c for c in codes if c])
        function_tokens = len(self.tokenizer(function, add_special_tokens=False).input_ids)
        prompt_ids = None
        for prompt in prompt_variants(function, imports, entries):
            ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
            if len(ids) + function_tokens + MIN_NEW_TOKENS <= self.context:
                prompt_ids = ids
                break
        if prompt_ids is None:
            result.rejected_reason = f"the function is too long for the model's context of {self.context} tokens"
            return result
        budget = min(self.max_new_tokens, self.context - len(prompt_ids), 2 * function_tokens + 64)
        result.raw, finished, result.new_tokens = self.generate_text(prompt_ids, budget)
        result.prompt_tokens = len(prompt_ids)
        result.seconds = round(time.perf_counter() - start, 3)
        if not finished:
            result.rejected_reason = f"no complete function within {budget} generated tokens"
            return result
        try:
            imports, edited = apply_edit_script(function, result.raw)
            result.imports, result.code = check_candidate(function, join_target(imports, edited))
        except EditError as exc:
            result.rejected_reason = f"the edit script does not apply: {exc}"
        except ProposalRejected as exc:
            result.rejected_reason = str(exc)
        return result

    def generate_text(self, prompt_ids: list[int], budget: int) -> tuple[str, bool, int]:
        """(decoded continuation up to EOS, whether EOS came within `budget` tokens, tokens generated). Greedy."""
        import torch

        input_ids = torch.tensor([prompt_ids], device=self.device)
        with self._lock, torch.no_grad():
            previous_threads = torch.get_num_threads()
            torch.set_num_threads(cpu_threads(None))  # torch's default spins badly on a small busy machine
            try:
                output = self._generate(input_ids, budget)
            finally:
                torch.set_num_threads(previous_threads)
        new = output[0, len(prompt_ids) :].tolist()
        count = len(new)
        finished = self.tokenizer.eos_token_id in new
        if finished:
            new = new[: new.index(self.tokenizer.eos_token_id)]
        return self.tokenizer.decode(new, skip_special_tokens=True), finished, count

    def _generate(self, input_ids, budget: int):
        import torch

        return self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=budget,
            do_sample=False,
            num_beams=1,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )


def cpu_threads(requested: int | None) -> int:
    """Threads for CPU math: as requested, else all cores but one (at least one).

    On a small shared machine, torch's default (all cores) is the worst choice: its worker threads
    spin at every barrier while the scheduler runs other processes; measured on 2 busy cores, one
    thread trained 3x faster than two.
    """
    return requested if requested else max(1, (os.cpu_count() or 2) - 1)


# --- checks and splicing ----------------------------------------------------------------------------
def findings_left(source: str, function_name: str, findings: list[Finding]) -> list[str]:
    """The codes of `findings` still reported inside `function_name` in `source` (sorted, with repeats)."""
    span = next(((s, e) for name, s, e in function_spans(source) if name == function_name), None)
    if span is None:
        return []
    reported = Counter(f.code for f in lint_source(source) if span[0] <= f.line <= span[1])
    wanted = Counter(f.code for f in findings)
    return sorted((wanted & reported).elements())


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    returns = ast.dump(node.returns) if node.returns else ""
    return f"{type(node).__name__} {node.name} {ast.dump(node.args)} -> {returns}"


def _only_function(code: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    body = ast.parse(code).body
    if len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ProposalRejected("the candidate is not exactly one function definition")
    return body[0]


def check_candidate(original: str, generated: str) -> tuple[list[str], str]:
    """(imports, function) of a generated candidate; raises ProposalRejected with the reason."""
    try:
        imports, function = split_target(generated)
        candidate = _only_function(function)
    except SyntaxError as exc:
        raise ProposalRejected(f"the candidate does not parse: {exc.msg} (line {exc.lineno})") from None
    reference = _only_function(original)
    if _signature(candidate) != _signature(reference):
        raise ProposalRejected(
            f"the candidate changes the signature of {reference.name} "
            f"({ast.unparse(reference.args)!r} -> {candidate.name}({ast.unparse(candidate.args)}))"
        )
    if ast.dump(candidate) == ast.dump(reference) and not imports:
        raise ProposalRejected("the candidate changes nothing")
    if not function.endswith("\n"):
        function += "\n"
    return imports, function


def add_imports(source: str, imports: list[str]) -> str:
    """`source` with the import statements it lacks inserted after its leading imports (or docstring)."""
    if not imports:
        return source
    tree = ast.parse(source)
    present = {ast.dump(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    missing = [imp for imp in dict.fromkeys(imports) if ast.dump(ast.parse(imp).body[0]) not in present]
    if not missing:
        return source
    after = 0
    for index, node in enumerate(tree.body):
        is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            after = node.end_lineno or node.lineno
        else:
            break
    lines = source.splitlines(keepends=True)
    if after and lines[after - 1] and not lines[after - 1].endswith("\n"):
        lines[after - 1] += "\n"
    block = "".join(imp + "\n" for imp in missing)
    return "".join(lines[:after]) + block + "".join(lines[after:])
