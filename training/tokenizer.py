"""A byte-level BPE tokenizer trained on the corpus (the `tokenizers` library).

The prompt markers are special tokens, so each is one id and never split or merged with code.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from xlaport.model.prompts import CONTEXT, EOS, FIXES, MIGRATED, ORIGINAL, PAD, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """A `PreTrainedTokenizerFast` with byte-level BPE merges learnt from `texts`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[FIXES, CONTEXT, ORIGINAL, MIGRATED],
    )


def load_tokenizer(directory: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory))
