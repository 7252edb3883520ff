"""Loading a model directory's tokenizer, refusing one that has no vocabulary.

Without any vocabulary file transformers still builds a tokenizer from
``tokenizer_config.json`` alone: one of special tokens only, which maps every word to the
unknown token, so training and evaluation would run and score silently on nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

# Files that hold a tokenizer's vocabulary, by tokenizer family.
VOCABULARY_FILES = (
    ("tokenizer.json",),  # fast tokenizers of every family
    ("vocab.txt",),  # WordPiece (BERT, MiniLM)
    ("vocab.json", "merges.txt"),  # byte-level BPE (RoBERTa, GPT-2)
    ("spiece.model",),  # SentencePiece (T5, ALBERT)
    ("sentencepiece.bpe.model",),  # SentencePiece (XLM-R)
    ("tokenizer.model",),  # SentencePiece (Llama-style)
)
PROBE_SENTENCE = "the quick brown fox jumps over the lazy dog"


def has_tokenizer_vocabulary(directory: Path) -> bool:
    """Whether ``directory`` holds the vocabulary files of some tokenizer family."""
    return any(all((directory / name).is_file() for name in group) for group in VOCABULARY_FILES)


def require_tokenizer_vocabulary(directory: Path) -> None:
    """A ``ValueError`` naming the files looked for when ``directory`` holds no vocabulary."""
    if not has_tokenizer_vocabulary(directory):
        expected = ", ".join(" + ".join(group) for group in VOCABULARY_FILES)
        raise ValueError(
            f"{directory} has no tokenizer vocabulary: none of {expected} is there. Copy the model's tokenizer "
            "files into it (e.g. tokenizer.save_pretrained(DIR) from the tokenizer it was trained with)"
        )


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """The tokenizer of a local model directory; refuses one without a vocabulary.

    A ``ValueError`` names the vocabulary files that are missing, or says that a probe
    sentence became unknown tokens only. (Remote tokenizer code may keep its vocabulary in
    files of its own, so only the probe applies to it.)
    """
    from transformers import AutoTokenizer

    path = Path(path)
    if not trust_remote_code:
        require_tokenizer_vocabulary(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    ids = tokenizer(PROBE_SENTENCE, add_special_tokens=False)["input_ids"]
    if tokenizer.unk_token_id is not None and all(i == tokenizer.unk_token_id for i in ids):
        raise ValueError(
            f"the tokenizer in {path} turns every word of {PROBE_SENTENCE!r} into its unknown token "
            f"{tokenizer.unk_token!r}: its vocabulary ({len(tokenizer)} tokens) is empty or not its own; "
            "copy the model's real tokenizer files into the directory"
        )
    return tokenizer


# Where a text may be cut: before a space that follows a non-space. No tokenizer family the project
# loads makes a token across that point: WordPiece pre-tokenises at whitespace, the byte-level BPE
# regexes of GPT-2, Llama 3 and Qwen start a piece at " word" (a space is only ever a piece's first
# character, or one of a run of whitespace), SentencePiece's Metaspace starts one at each space; so
# the tokens of the text before it are the first tokens of the whole text. (A newline is no such
# point: Qwen's regex ends a punctuation piece with the newlines after it.)
_CUT_POINT = re.compile(r"(?<=\S) ")


def max_token_chars(tokenizer) -> int:
    """The vocabulary's longest token in characters: ``max_length`` times it is the first prefix
    :func:`token_prefixes` tries. Only a first guess, not what makes a cut safe: an unknown word
    (one token) or characters that make no token (whitespace, control characters) take more
    characters than their tokens' spelling, which the check there catches."""
    return max(len(token) for token in tokenizer.get_vocab())


def token_prefixes(texts: Sequence[str], tokenizer, max_length: int, bound: int) -> list[str]:
    """``texts``, each one longer than ``bound`` characters cut to a prefix with the same first
    ``max_length`` tokens (special tokens included) as the whole text, so that it is not
    tokenised whole to keep those. A prefix ends at a :data:`_CUT_POINT` past the bound, so its
    tokens are the whole text's first ones; it is kept only when it still fills ``max_length``
    tokens: truncation then keeps the same tokens of either. One that falls short is tried
    again twice as long, up to the whole text; a text with no cut point past the bound (one
    30 MB word) goes whole. A tokenizer that truncates on the left keeps every text whole."""
    kept = list(texts)
    if tokenizer.truncation_side != "right":  # it keeps a text's last tokens
        return kept
    tried = {i: bound for i, text in enumerate(texts) if len(text) > bound}  # text -> characters to try
    while tried:
        prefixes = {}
        for i, length in tried.items():
            cut = _CUT_POINT.search(texts[i], length)
            if cut is not None:
                prefixes[i] = texts[i][: cut.start()]
        if not prefixes:
            break
        ids = tokenizer(list(prefixes.values()), truncation=True, max_length=max_length)["input_ids"]
        tried = {}
        for (i, prefix), tokens in zip(prefixes.items(), ids):
            if len(tokens) >= max_length:
                kept[i] = prefix
            else:
                tried[i] = 2 * len(prefix)
    return kept
