"""Loading a model directory's tokenizer, refusing one that has no vocabulary.

Without any vocabulary file transformers still builds a tokenizer from
``tokenizer_config.json`` alone: one of special tokens only, which maps every word to the
unknown token, so training and evaluation would run and score silently on nothing.
"""

from __future__ import annotations

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
