"""Explicit text augmentations of section 4.4 (Figure 3): WDel, WNet and CTxt.

Each changes a share ``fraction`` of a sentence's words, n = max(1, round(fraction x words)):

wdel  deletes n words at random, never all of them (at most words - 1).
wnet  replaces up to n words of 3 letters or more by a WordNet synonym (words with none are left;
      a sentence with no such word stays as it is). WordNet 3.0 is read with nltk's ``WordNetCorpusReader`` from a
      local database directory, by default ``/usr/share/wordnet`` (Debian's ``wordnet-base``).
      That package lacks the ``lexnames`` table nltk's reader opens first (the 45 fixed
      lexicographer file names of WordNet 3.0), so the reader is given a copy of the database's
      files plus that table, kept in the cache (made once).
ctxt  masks n words and fills each with one of the ``top_n`` most likely whole-word tokens of a
      masked language model (not the word itself), the sentences of a call in one batch.

Words are whitespace-separated; punctuation attached to a word is kept around its substitute.
Every choice is drawn from the ``random.Random`` given per sentence, so a sample seeded by its
position in the stream is augmented the same way again on resume.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import pickle
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

AUGMENTATIONS = ("none", "wdel", "wnet", "ctxt")
DEFAULT_WORDNET = "/usr/share/wordnet"
# wnet leaves words shorter than this alone ("I" -> "iodine", "a" -> "angstrom" are WordNet
# senses, not paraphrases).
MIN_WNET_LETTERS = 3
_AFFIXES = re.compile(r"^(\W*)(.*?)(\W*)$", re.UNICODE)
# WordNet 3.0's lexicographer files, in the order of their numbers (the ``lexnames`` table).
WORDNET_LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()
_LEXNAME_POS = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}
# What nltk's reader opens to find synonyms: each part of speech's index, data and exceptions
# (``lexnames`` is supplied when missing, see _with_lexnames).
WORDNET_FILES = (
    *("index.adj", "index.adv", "index.noun", "index.verb"),
    *("data.adj", "data.adv", "data.noun", "data.verb"),
    *("adj.exc", "adv.exc", "noun.exc", "verb.exc"),
)


def words_to_change(count: int, fraction: float) -> int:
    """n = max(1, round(fraction x count)) of ``count`` words (0 for an empty sentence)."""
    return 0 if count == 0 else max(1, int(math.floor(fraction * count + 0.5)))


@dataclass(frozen=True)
class AugmentSpec:
    """What :func:`build_augmenter` builds, picklable (the loader's workers build their own)."""

    kind: str = "none"
    fraction: float = 0.1
    views: str = "second"  # "second": view 2 only; "both": each view on its own
    wordnet_dir: str = DEFAULT_WORDNET
    model: str | None = None  # ctxt: a local masked language model directory
    top_n: int = 5
    batch_size: int = 64  # ctxt: sentences per masked-LM forward


class WordDeletion:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def __call__(self, texts: Sequence[str], rngs: Sequence[random.Random]) -> list[str]:
        out = []
        for text, rng in zip(texts, rngs):
            words = text.split()
            drop = min(words_to_change(len(words), self.fraction), len(words) - 1)
            gone = set(rng.sample(range(len(words)), drop)) if drop > 0 else set()
            out.append(" ".join(word for index, word in enumerate(words) if index not in gone))
        return out


def _split_affixes(word: str) -> tuple[str, str, str]:
    match = _AFFIXES.match(word)
    assert match is not None
    return match.group(1), match.group(2), match.group(3)


def _with_case_of(original: str, substitute: str) -> str:
    return substitute[:1].upper() + substitute[1:] if original[:1].isupper() else substitute


def wordnet_files(directory: str | Path) -> Path:
    """The WordNet database directory, after checking that every file the reader opens, and
    nltk, are there."""
    directory = Path(directory)
    missing = sorted(name for name in WORDNET_FILES if not (directory / name).is_file())
    if missing:
        raise ValueError(
            f"{directory} is not a complete WordNet 3.0 database: missing {', '.join(missing)}; install Debian's "
            "wordnet-base (apt-get install wordnet-base, which puts it in /usr/share/wordnet) or set "
            "data.augment_wordnet to a WordNet 3.0 dict directory"
        )
    if importlib.util.find_spec("nltk") is None:
        raise ValueError("data.augment: wnet needs nltk: pip install 'vascl-scale[augment]'")
    return directory


def wordnet_reader(directory: str | Path):
    """nltk's WordNet reader on a local WordNet 3.0 database (``data.noun``, ``index.noun``, ...)."""
    directory = wordnet_files(directory)
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = directory
    if not (directory / "lexnames").is_file():
        root = _with_lexnames(directory)
    # nltk reads only below its data roots: authorise this one.
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))
    import warnings

    class LocalWordNet(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet"):
            # nltk maps a WordNet it loads onto its own downloaded "wordnet" corpus through
            # index.sense files; this database is WordNet 3.0 itself, and only synonyms are read.
            return None

    with warnings.catch_warnings():  # "multilingual functions are not available": not used here
        warnings.simplefilter("ignore", UserWarning)
        return LocalWordNet(str(root), None)


def _with_lexnames(directory: Path) -> Path:
    """A cache copy of ``directory``'s database files plus WordNet 3.0's ``lexnames`` (copies,
    not links: nltk refuses a file that resolves outside the reader's root)."""
    name = directory.resolve().as_posix().strip("/").replace("/", "_")
    cache = Path(os.environ.get("VASCL_CACHE", Path.home() / ".cache" / "vascl-scale")) / "wordnet" / name
    cache.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        copy = cache / path.name
        if path.is_file() and (not copy.is_file() or copy.stat().st_size != path.stat().st_size):
            temporary = cache / f".{path.name}.{os.getpid()}"
            shutil.copyfile(path, temporary)
            os.replace(temporary, copy)
    table = "".join(f"{i:02d}\t{name}\t{_LEXNAME_POS[name.split('.')[0]]}\n" for i, name in enumerate(WORDNET_LEXNAMES))
    lexnames = cache / "lexnames"
    if not lexnames.is_file() or lexnames.read_text() != table:
        temporary = cache / f".lexnames.{os.getpid()}"
        temporary.write_text(table)
        os.replace(temporary, lexnames)
    return cache


class WordNetSubstitution:
    def __init__(self, fraction: float, wordnet_dir: str) -> None:
        self.fraction = fraction
        self.wordnet = wordnet_reader(wordnet_dir)
        self._synonyms: dict[str, list[str]] = {}

    def synonyms(self, word: str) -> list[str]:
        """Other lemma names of the word's synsets (multi-word ones with spaces), in WordNet order."""
        key = word.lower()
        if key not in self._synonyms:
            names = [
                lemma.name().replace("_", " ") for synset in self.wordnet.synsets(key) for lemma in synset.lemmas()
            ]
            self._synonyms[key] = [name for name in dict.fromkeys(names) if name.lower() != key]
        return self._synonyms[key]

    def __call__(self, texts: Sequence[str], rngs: Sequence[random.Random]) -> list[str]:
        out = []
        for text, rng in zip(texts, rngs):
            words = text.split()
            parts = [_split_affixes(word) for word in words]
            candidates = [
                i
                for i, (_, core, _) in enumerate(parts)
                if len(core) >= MIN_WNET_LETTERS and core.isalpha() and self.synonyms(core)
            ]
            chosen = rng.sample(candidates, min(words_to_change(len(words), self.fraction), len(candidates)))
            for index in chosen:
                before, core, after = parts[index]
                words[index] = before + _with_case_of(core, rng.choice(self.synonyms(core))) + after
            out.append(" ".join(words))
        return out


class ContextualSubstitution:
    """CTxt: masked-LM substitutes. The model runs on the CPU of the loader worker, batched."""

    def __init__(self, spec: AugmentSpec) -> None:
        import torch
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        check_masked_lm(spec)
        self.fraction, self.top_n, self.batch_size = spec.fraction, spec.top_n, spec.batch_size
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec.model)
            self.model = AutoModelForMaskedLM.from_pretrained(spec.model).eval()
        except (OSError, ValueError) as err:
            raise ValueError(f"data.augment_model {spec.model}: not a masked language model ({err})") from None
        if self.tokenizer.mask_token is None:
            raise ValueError(f"data.augment_model {spec.model} has no mask token: CTxt needs a masked language model")
        # Tokens a forward may hold: a tokenizer saved without its limit allows any length, the
        # model's position embeddings do not.
        positions = getattr(self.model.config, "max_position_embeddings", None) or self.tokenizer.model_max_length
        self.max_length = min(self.tokenizer.model_max_length, positions)
        self.torch = torch
        vocabulary = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        special = set(self.tokenizer.all_special_ids)
        # Whole-word candidates only: no special token, no continuation piece (WordPiece marks
        # those with "##"; byte-level BPE and SentencePiece mark word starts with "Ġ" / "▁"
        # instead), and a non-empty word once decoded.
        starts = next((mark for mark in ("\u0120", "\u2581") if any(t.startswith(mark) for t in vocabulary)), None)

        def whole_word(token: str) -> bool:
            return token.startswith(starts) if starts else not token.startswith("##")

        words = {
            index: self.tokenizer.convert_tokens_to_string([token]).strip()
            for index, token in enumerate(vocabulary)
            if index not in special and whole_word(token)
        }
        self.word_of = {index: word for index, word in words.items() if word}
        # Sized by the model's output (it may pad its vocabulary past the tokenizer's).
        width = self.model.get_output_embeddings().weight.shape[0]
        self.banned = torch.tensor([index not in self.word_of for index in range(width)])

    def __call__(self, texts: Sequence[str], rngs: Sequence[random.Random]) -> list[str]:
        out = []
        for start in range(0, len(texts), self.batch_size):
            out += self._batch(texts[start : start + self.batch_size], rngs[start : start + self.batch_size])
        return out

    def _batch(self, texts: Sequence[str], rngs: Sequence[random.Random]) -> list[str]:
        torch = self.torch
        words = [text.split() for text in texts]
        masked_positions = [
            sorted(rng.sample(range(len(w)), words_to_change(len(w), self.fraction))) if w else []
            for w, rng in zip(words, rngs)
        ]
        parts = [[_split_affixes(word) for word in w] for w in words]
        masked = [
            " ".join(
                before + self.tokenizer.mask_token + after if i in positions else word
                for i, (word, (before, _, after)) in enumerate(zip(w, p))
            )
            for w, p, positions in zip(words, parts, masked_positions)
        ]
        encoded = self.tokenizer(masked, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        with torch.no_grad():
            logits = self.model(**encoded).logits.float()  # (n, L, V)
        logits[..., self.banned] = float("-inf")
        out = []
        for row, (w, p, positions, rng) in enumerate(zip(words, parts, masked_positions, rngs)):
            slots = (encoded["input_ids"][row] == self.tokenizer.mask_token_id).nonzero().flatten().tolist()
            for index, slot in zip(positions, slots):  # a mask cut off by truncation keeps its word
                before, core, after = p[index]
                # The top n distinct words other than the masked one; the word itself if none is left.
                ranked = logits[row, slot].topk(min(4 * self.top_n + 1, len(self.word_of))).indices.tolist()
                choices = [
                    word
                    for word in dict.fromkeys(self.word_of[i] for i in ranked if i in self.word_of)
                    if word.lower() != core.lower()
                ][: self.top_n]
                w[index] = before + (rng.choice(choices) if choices else core) + after
            out.append(" ".join(w))
        return out


def check_masked_lm(spec: AugmentSpec) -> None:
    """CTxt's model setting, checked without loading the weights: a model directory whose
    checkpoint holds a masked-LM head. An encoder saved without one (a sentence encoder, a
    ``*Model`` checkpoint) would load with a random head, and CTxt fill masks with noise."""
    if spec.model is None:
        raise ValueError("data.augment: ctxt needs data.augment_model, a masked language model (directory or hub id)")
    directory = Path(spec.model)
    if not (directory / "config.json").is_file():
        raise ValueError(f"data.augment_model {spec.model} is not a model directory (no config.json)")
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForMaskedLM

    try:
        with torch.device("meta"):  # the architecture's parameter names, no memory
            model = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(directory))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"data.augment_model {spec.model}: not a masked language model ({str(err).splitlines()[0]})"
        ) from None
    # The head's modules: every top-level module outside the encoder (BERT's "cls", RoBERTa's "lm_head").
    head = {
        name.split(".")[0] for name, _ in model.named_parameters() if not name.startswith(f"{model.base_model_prefix}.")
    }
    stored: set[str] = set()
    for path in directory.glob("*.safetensors"):
        with safe_open(path, "pt") as weights:  # reads the header only
            stored.update(key.split(".")[0] for key in weights.keys())
    for path in directory.glob("*.bin"):
        try:  # weights_only: a pickle that builds more than tensors is refused, never run
            stored.update(key.split(".")[0] for key in torch.load(path, map_location="meta", weights_only=True))
        except (pickle.UnpicklingError, RuntimeError) as err:
            raise ValueError(
                f"data.augment_model {path}: not a weights file ({str(err).splitlines()[0][:200]})"
            ) from None
    if not stored & head:
        raise ValueError(
            f"data.augment_model {spec.model} has no masked-LM head (no {', '.join(sorted(head))} weights): it would "
            "start random; give a masked language model (a *ForMaskedLM checkpoint such as bert-base-uncased or "
            "roberta-base), not a sentence encoder"
        )


def check_augmenter(spec: AugmentSpec) -> None:
    """What the loader's workers will need, checked once and cheaply before they start: the
    WordNet database and nltk for wnet, the masked LM directory and its head for ctxt."""
    if spec.kind == "wnet":
        wordnet_files(spec.wordnet_dir)
    elif spec.kind == "ctxt":
        check_masked_lm(spec)


def at_fraction(augmenter, fraction: float):
    """The same augmenter (its database or model shared) changing another share of words."""
    changed = copy.copy(augmenter)
    changed.fraction = fraction
    return changed


def build_augmenter(spec: AugmentSpec):
    """The augmenter ``spec`` names, or None for ``none``."""
    if spec.kind == "none":
        return None
    if spec.kind == "wdel":
        return WordDeletion(spec.fraction)
    if spec.kind == "wnet":
        return WordNetSubstitution(spec.fraction, spec.wordnet_dir)
    assert spec.kind == "ctxt", spec.kind
    return ContextualSubstitution(spec)
