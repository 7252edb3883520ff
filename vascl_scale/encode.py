"""From a model path to embeddings: resolve the directory, encode each distinct text once, cache.

A model is one of
- a training run directory: its ``best/`` export, else ``final/``;
- a Hugging Face encoder or decoder directory (config.json, weights, tokenizer files);
- a sentence-transformers directory: ``modules.json`` says where the encoder lives, its Pooling
  module's config says the pooling (mean, cls or last token) and a Normalize module
  L2-normalises the output; both are honoured, ``sentence_bert_config.json`` gives the maximum
  sequence length and ``config_sentence_transformers.json`` the named prompts (``query``,
  ``document``);
- a PEFT (LoRA) adapter directory (``adapter_config.json``): its base model
  (``base_model_name_or_path``) with the adapter merged in at load; pooling, length and prompts
  come from the sentence-transformers export the adapter lies in (``<export>/lora/``), if any.

A prompt (:meth:`Embedder.embed`) is put before every text, as sentence-transformers does:
the encoder reads, and mean pooling averages, the prompt's tokens too.

Embeddings are cached on disk under a fingerprint of everything that decides them (config,
weights and tokenizer files, an adapter's files, pooling, normalisation, maximum length), one
row per encoder input (the prompt and the text) keyed by its hash, so a second evaluation of
the same checkpoint encodes nothing. The cache is only a saving: when it cannot be written (a full
disk), one warning names it and the evaluation goes on without it.

A long text is cut before it reaches the tokenizer, to a prefix that gives the same first
``max_length`` tokens (:meth:`vascl_scale.model.SentenceEncoder.encode`): a 30 MB document
costs its first tokens, not its length.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from vascl_scale.fs import file_sha256, written_atomically
from vascl_scale.hub import locate_model
from vascl_scale.log import LoopProgress
from vascl_scale.sentence_transformers_format import read_prompts, read_sentence_transformers_layout
from vascl_scale.tokenizer import VOCABULARY_FILES, has_tokenizer_vocabulary, require_tokenizer_vocabulary

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 256
POOLINGS = ("mean", "cls", "last_token")  # vascl_scale.model.POOLERS
ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a PEFT adapter
# Encoders whose position ids start after the padding index (transformers'
# create_position_ids_from_input_ids): token i takes position embedding pad_token_id + 1 + i, so
# roberta-base's 514 embeddings hold 512 tokens.
POSITIONS_AFTER_PADDING = (
    "roberta",
    "roberta-prelayernorm",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "data2vec-text",
    "mpnet",
    "longformer",
    "xmod",
    "ibert",
    "luke",
)
# The fingerprint hashes every file that shapes tokenisation.
TOKENIZER_FILES = (
    *(name for group in VOCABULARY_FILES for name in group),
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


@dataclass(frozen=True)
class ModelSpec:
    """What decides a model's embeddings: where its encoder is and how its output is pooled.

    Whether an EOS token is appended is not stored: :meth:`SentenceEncoder.from_pretrained`
    decides it from the pooling and the tokenizer, both part of the fingerprint."""

    name: str  # the path as the user gave it, for tables
    directory: Path  # the Hugging Face directory (config.json, weights, tokenizer); an adapter's base model
    pooling: str = "mean"
    normalize: bool = False
    max_length: int = DEFAULT_MAX_LENGTH
    adapter: Path | None = None  # a PEFT adapter directory, merged into the model of `directory` at load
    prompts: dict[str, str] = field(default_factory=dict, hash=False)  # the model's named prompts

    def describe(self) -> dict:
        return {
            "name": self.name,
            "directory": str(self.directory),
            "adapter": str(self.adapter) if self.adapter is not None else None,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "prompts": dict(self.prompts),
        }

    def prompt_text(self, name: str | None, option: str = "--prompt") -> str:
        """The text of the model's prompt ``name`` (``""`` for None); a ValueError naming the
        model's prompts when it has no prompt of that name."""
        if name is None:
            return ""
        if name not in self.prompts:
            if self.prompts:
                available = f"its prompts are {', '.join(sorted(self.prompts))}"
            else:
                available = (
                    "it has none (a sentence-transformers directory names them in config_sentence_transformers.json)"
                )
            raise ValueError(f"{option} {name!r}: {self.name} has no prompt of that name; {available}")
        return self.prompts[name]


def resolve_model(path: str | Path, pooling: str | None = None, max_length: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` for a run directory, a Hugging Face or a sentence-transformers
    directory, a PEFT adapter directory, ``package:MODULE/SUBDIR`` or a hub id
    (:func:`vascl_scale.hub.locate_model`). Explicit ``pooling`` / ``max_length`` override what
    the directory says."""
    from vascl_scale.backbone import adapter_base_path

    given = locate_model(str(path), "--model").directory
    if not given.is_dir():
        raise ValueError(f"model path {given} is not a directory")
    directory, adapter, settings = given, None, None  # settings: the sentence-transformers directory, if any
    base = adapter_base_path(given)
    if base is not None:
        adapter = given
        directory = _adapter_base(adapter, base)
        if (adapter.parent / "modules.json").is_file():  # <export>/lora/: the export's pooling, length, prompts
            settings = adapter.parent
        logger.info("%s: a LoRA adapter of %s, merged into it at load", adapter, directory)
    elif not (given / "config.json").is_file() and not (given / "modules.json").is_file():
        exports = [given / name for name in ("best", "final") if (given / name).is_dir()]
        if not exports:
            raise ValueError(
                f"{given} is neither a model directory (config.json or modules.json), a LoRA adapter directory "
                "(adapter_config.json) nor a training run directory (with best/ or final/); pass one of those"
            )
        directory = exports[0]
        logger.info("using %s of training run %s", directory.name, given)
    if settings is None and adapter is None and (directory / "modules.json").is_file():
        settings = directory
    st_pooling, normalize, st_max_length, prompts = None, False, None, {}
    if settings is not None:
        encoder_dir, st_pooling, normalize, st_max_length = read_sentence_transformers_layout(settings)
        if adapter is None:
            directory = encoder_dir
        prompts = read_prompts(settings)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} has no config.json; pass a directory saved with save_pretrained")
    require_tokenizer_vocabulary(adapter if adapter is not None and has_tokenizer_vocabulary(adapter) else directory)
    if pooling is not None and st_pooling is not None and pooling != st_pooling:
        logger.warning("%s pools by %s; using --pooling %s as asked", settings, st_pooling, pooling)
    chosen_pooling = pooling or st_pooling or default_pooling(directory)
    if chosen_pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}; got {chosen_pooling!r}")
    chosen_length = max_length or st_max_length or DEFAULT_MAX_LENGTH
    if chosen_length < 1:
        raise ValueError(f"max_length must be >= 1; got {chosen_length}")
    limit = position_limit(directory)
    if limit is not None and chosen_length > limit:  # longer inputs would index past the position embeddings
        origin = "--max-length" if max_length else "max_seq_length" if st_max_length else "the default max length"
        level = logging.WARNING if max_length else logging.INFO  # asked for, or not
        message = "%s: %s %d exceeds the model's %d position embeddings; using %d"
        logger.log(level, message, directory, origin, chosen_length, limit, limit)
        chosen_length = limit
    return ModelSpec(str(path), directory, chosen_pooling, normalize, int(chosen_length), adapter, prompts)


def default_pooling(directory: Path) -> str:
    """The pooling of a plain Hugging Face directory that names none: a decoder's last token
    (the only state that has seen the whole text), an encoder's mean."""
    from transformers import AutoConfig

    from vascl_scale.backbone import is_decoder

    if is_decoder(AutoConfig.from_pretrained(str(directory))):
        logger.info("%s is a decoder: pooling its last token (--pooling to choose another)", directory)
        return "last_token"
    return "mean"


def _adapter_base(adapter: Path, base: str) -> Path:
    """The Hugging Face directory of the base model ``base`` an adapter was trained on: a local
    directory, a sentence-transformers directory's encoder or a hub id, as ``--model`` takes."""
    key = f"base_model_name_or_path of {adapter / ADAPTER_CONFIG}"
    located = locate_model(base, key).directory
    if not located.is_dir():
        raise ValueError(
            f"the LoRA adapter {adapter} was trained on {base}, which is not a directory here; put the base model "
            f"there, or evaluate the merged model instead (a training export holds it beside lora/: {adapter.parent})"
        )
    if not (located / "config.json").is_file() and (located / "modules.json").is_file():
        located = read_sentence_transformers_layout(located)[0]
    if not (located / "config.json").is_file():
        raise ValueError(f"{located}, the base model of the LoRA adapter {adapter}, has no config.json")
    return located


def position_limit(directory: Path) -> int | None:
    """Tokens the encoder can embed: its absolute position embeddings, less the padding offset
    of RoBERTa-style models; None for a model without absolute positions."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(directory))
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    if config.model_type in POSITIONS_AFTER_PADDING:
        positions -= (config.pad_token_id or 0) + 1
    return positions


def resolve_device(device: str | None) -> str:
    """``device`` checked to be usable here (``cpu``, ``cuda`` or ``cuda:N``), else the local
    default: cuda when a GPU is visible. Checked up front, so a bad ``--device`` costs no model
    or data loading."""
    import torch

    from vascl_scale.precision import local_device_type

    if device is None:
        return local_device_type()
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: evaluation runs on cpu or cuda[:N]")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device!r}: CUDA is not available here; use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            visible = ", ".join(f"cuda:{i}" for i in range(count))
            raise ValueError(
                f"--device {device!r}: this machine has {count} CUDA device{'s' * (count != 1)} ({visible})"
            )
    return device


def _fingerprinted_files(directory: Path) -> list[Path]:
    """The files of ``directory`` that decide its embeddings: config, adapter config, weights and
    tokenizer files. The projection head (head.safetensors) is left out: evaluation never uses it."""
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file()
        and p.name != "head.safetensors"
        and (
            p.name in ("config.json", ADAPTER_CONFIG)
            or p.name in TOKENIZER_FILES
            or p.suffix in (".safetensors", ".bin")
        )
    )


def model_fingerprint(spec: ModelSpec, prompts: Mapping[str, str] | None = None) -> str:
    """Hash of config, weight and tokenizer files (and an adapter's) plus pooling, normalisation
    and max length, and of ``prompts``: the prompt texts the embeddings are made with, by use
    (mteb's query / document / other calls). Empty prompts leave the hash as it is: the embedding
    cache keys each row by its prompt and text (:func:`input_key`), so it needs none."""
    digest = hashlib.sha256()
    for path in _fingerprinted_files(spec.directory):
        digest.update(f"{path.name}:{file_sha256(path)}\n".encode())
    if spec.adapter is not None:
        for path in _fingerprinted_files(spec.adapter):
            digest.update(f"adapter/{path.name}:{file_sha256(path)}\n".encode())
    digest.update(f"pooling={spec.pooling};normalize={spec.normalize};max_length={spec.max_length}".encode())
    used = {use: text for use, text in sorted((prompts or {}).items()) if text}
    if used:
        digest.update(f";prompts={json.dumps(used, sort_keys=True)}".encode())
    return digest.hexdigest()[:32]


def embedding_fingerprint(spec: ModelSpec, precision: str, prompts: Mapping[str, str] | None = None) -> str:
    """What keys a model's embeddings: :func:`model_fingerprint` (with ``prompts``), with the precision the
    encoder runs in (``no`` or ``bf16``) appended unless float32, so float32 keys stay what they were."""
    fingerprint = model_fingerprint(spec, prompts)
    return fingerprint if precision == "no" else f"{fingerprint}-{precision}"


def text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def input_key(text: str, prompt: str = "") -> str:
    """The cache key of ``text`` encoded after ``prompt``: the hash of what the encoder reads, so
    a text keeps its key without a prompt, and a prompt changes it."""
    return text_key(prompt + text)


def embedding_width(spec: ModelSpec) -> int:
    """d of the model's embeddings: its encoder's hidden size, which SentenceEncoder pools to."""
    from transformers import AutoConfig  # imported only when a cache is read: it costs about 1 s

    return int(AutoConfig.from_pretrained(str(spec.directory)).hidden_size)


def check_truncate_dim(spec: ModelSpec, truncate_dim: int | None, option: str = "--truncate-dim") -> int | None:
    """``truncate_dim`` when the model's embeddings have at least that many dimensions (None
    stays None); a ValueError naming the option and the model's width otherwise."""
    if truncate_dim is None:
        return None
    width = embedding_width(spec)
    if not 1 <= truncate_dim <= width:
        raise ValueError(
            f"{option} {truncate_dim}: {spec.name} gives {width}-dimensional embeddings; choose 1 to {width}"
        )
    return truncate_dim


def truncate_embeddings(matrix: np.ndarray, truncate_dim: int | None, normalize: bool) -> np.ndarray:
    """The first ``truncate_dim`` dimensions of each row of ``matrix`` (N, d) (Matryoshka
    truncation; ``matrix`` as it is for None), scaled back to unit length when ``normalize`` (a
    model whose output is L2-normalised keeps unit vectors; cosines are the same either way)."""
    if truncate_dim is None:
        return matrix
    if truncate_dim > matrix.shape[1]:
        raise ValueError(f"truncate_dim {truncate_dim} exceeds the embeddings' {matrix.shape[1]} dimensions")
    cut = np.ascontiguousarray(matrix[:, :truncate_dim])  # (N, m)
    if normalize:
        norms = np.linalg.norm(cut, axis=1, keepdims=True)  # (N, 1)
        cut = cut / np.where(norms > 0, norms, 1.0)
    return cut


class EmbeddingCache:
    """Embeddings of one model fingerprint: ``<root>/<fingerprint>/part-*.npz`` files, each with
    ``keys`` (M,) text hashes and ``embeddings`` (M, width) float32. New rows go to a new part,
    written to a temporary name and renamed, so a crashed or concurrent run never leaves a
    half-written part behind. A part that cannot be read or does not hold that shape (a damaged
    disk, a file copied in by hand) is skipped with a warning: its texts are a cache miss."""

    def __init__(self, root: str | Path, fingerprint: str, width: int) -> None:
        self.directory = Path(root) / fingerprint
        self.width = width
        self._rows: dict[str, np.ndarray] = {}
        if self.directory.is_dir():
            for part in sorted(self.directory.glob("part-*.npz")):
                self._rows.update(self._read_part(part))

    def _read_part(self, part: Path) -> dict[str, np.ndarray]:
        """The rows of one part, or none (with a warning) when it is unreadable or inconsistent."""
        try:
            with np.load(part) as stored:  # reading a member checks its CRC-32
                keys, embeddings = stored["keys"], stored["embeddings"]
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as err:
            problem = f"cannot be read ({type(err).__name__}: {err})"
        else:
            shape_ok = keys.ndim == 1 and embeddings.shape == (len(keys), self.width)
            if shape_ok and keys.dtype.kind == "U" and embeddings.dtype.kind == "f" and np.isfinite(embeddings).all():
                return dict(zip(keys.tolist(), embeddings))
            problem = (
                f"holds keys {keys.shape} {keys.dtype} and embeddings {embeddings.shape} {embeddings.dtype}, "
                f"not (M,) text hashes and (M, {self.width}) finite floats"
            )
        logger.warning(
            "embedding cache part %s %s; ignoring it and encoding its texts again (delete it to stop this warning)",
            part,
            problem,
        )
        return {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: str) -> np.ndarray | None:
        return self._rows.get(key)

    def add(self, keys: Sequence[str], embeddings: np.ndarray) -> None:
        if not len(keys):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.npz"
        with written_atomically(self.directory / name) as staging, staging.open("wb") as handle:
            np.savez(handle, keys=np.asarray(keys), embeddings=np.asarray(embeddings, dtype=np.float32))
        self._rows.update(zip(keys, np.asarray(embeddings, dtype=np.float32)))


class TextEmbeddings:
    """Embeddings looked up by text: ``embeddings(texts) -> (N, d)``, usable as an ``encode``."""

    def __init__(self, texts: Sequence[str], matrix: np.ndarray) -> None:
        self.row = {text: i for i, text in enumerate(texts)}
        self.matrix = matrix  # (T, d)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        try:
            return self.matrix[[self.row[text] for text in texts]]
        except KeyError as err:
            raise ValueError(f"text {err.args[0][:60]!r} was not embedded; embed every task's texts first") from None


@dataclass
class EmbeddingStats:
    """What the :meth:`Embedder.embed` calls of one embedder did, summed over the calls (one for
    ``eval sts`` and its kind, one per encode request of ``eval mteb``), for the JSON and the speed report."""

    distinct_texts: int = 0
    from_cache: int = 0
    encoded: int = 0
    encode_seconds: float = 0.0
    load_seconds: float = 0.0
    fingerprint: str = ""
    precision: str = "no"  # what the encoder ran in: no (float32) or bf16

    def to_json(self) -> dict:
        return asdict(self)


class Embedder:
    """Encodes distinct texts once, longest first in length-sorted batches, through the cache.

    ``precision`` (``auto``, ``no`` or ``bf16``, :mod:`vascl_scale.precision`) is the encoder's
    autocast; bf16 embeddings are cached apart from float32 ones. The encoder is loaded at the
    first text to encode and kept for later calls. ``allow_blank``: embed empty or blank texts
    as the model encodes them (its special tokens alone) with a warning that counts them, instead
    of refusing them (the project's own data never holds one; a benchmark's data may).
    ``truncate_dim``: every embedding returned is cut to its first m dimensions
    (:func:`truncate_embeddings`, checked against the model by :func:`check_truncate_dim`); the
    cache keeps them whole.
    """

    def __init__(
        self,
        spec: ModelSpec,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        device: str | None = None,
        chunk_batches: int = 16,
        precision: str = "no",
        allow_blank: bool = False,
        truncate_dim: int | None = None,
    ) -> None:
        from vascl_scale.precision import resolve_precision

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if precision == "fp16":
            raise ValueError("--precision takes auto, no or bf16 for evaluation; got 'fp16'")
        self.spec = spec
        self.batch_size = batch_size
        self.cache_dir = cache_dir
        self.device = resolve_device(device)
        self.chunk_size = batch_size * chunk_batches  # texts per progress update and per cache part
        self.device_type = self.device.split(":")[0]  # "cuda:1" -> "cuda"
        self.allow_blank = allow_blank
        self.truncate_dim = truncate_dim
        self.stats = EmbeddingStats(precision=resolve_precision(precision, self.device_type, "--precision"))
        self._encoder = None  # SentenceEncoder, loaded at the first text to encode
        self._cache_writable = True  # False once a write failed (a full disk): the run goes on uncached

    def _loaded_encoder(self):
        if self._encoder is None:
            import transformers

            from vascl_scale.model import SentenceEncoder

            transformers.utils.logging.disable_progress_bar()  # a bar per local weight file is noise in every log
            model = SentenceEncoder.from_pretrained(
                self.spec.directory, pooling=self.spec.pooling, adapter=self.spec.adapter
            )
            self._encoder = model.to(self.device)
        return self._encoder

    def _store(self, cache: EmbeddingCache, keys: list[str], vectors: np.ndarray) -> None:
        """Add rows to the cache; a write that fails (a full disk) leaves this run uncached, with
        one warning: the cache only saves time."""
        if not self._cache_writable:
            return
        try:
            cache.add(keys, vectors)
        except OSError as err:
            self._cache_writable = False
            logger.warning(
                "cannot write the embedding cache %s (%s); going on without caching: free space there, "
                "or pass --no-cache",
                cache.directory,
                err.strerror or err,
            )

    def embed(self, texts: Iterable[str], prompt: str = "") -> TextEmbeddings:
        """Embeddings (float32; cut to ``truncate_dim``) of every distinct text, from the cache or
        freshly encoded, looked up by the text. ``prompt`` (a prompt's text,
        :meth:`ModelSpec.prompt_text`) is put before every text when encoding; cached rows are
        keyed by both (:func:`input_key`)."""
        # Longest first, so similar lengths share a batch; ties broken by the text itself, so a
        # run's batches (and the last float bits of every embedding) do not depend on hash order.
        distinct = sorted(set(texts), key=lambda text: (-len(text), text))
        blanks = [text for text in distinct if not text.strip()]
        if blanks and not self.allow_blank:
            raise ValueError(f"cannot embed an empty text ({blanks[0]!r}); remove it from the data")
        if blanks:
            logger.warning(
                "%s: %d empty or blank texts, embedded as the model encodes an empty input", self.spec.name, len(blanks)
            )
        started = time.perf_counter()
        cache = None
        if self.cache_dir is not None:
            self.stats.fingerprint = embedding_fingerprint(self.spec, self.stats.precision)
            cache = EmbeddingCache(self.cache_dir, self.stats.fingerprint, embedding_width(self.spec))
        found = {text: cache.get(input_key(text, prompt)) for text in distinct} if cache is not None else {}
        todo = [text for text in distinct if found.get(text) is None]
        self.stats.load_seconds += time.perf_counter() - started
        logger.info(
            "%s: %d distinct texts%s, %d cached, %d to encode",
            self.spec.name,
            len(distinct),
            f" after the prompt {prompt!r}" if prompt else "",
            len(distinct) - len(todo),
            len(todo),
        )
        encoded = {}
        if todo:
            from vascl_scale.precision import autocast

            started = time.perf_counter()
            model = self._loaded_encoder()
            with LoopProgress("encoding", len(todo), "texts") as progress:
                for start in range(0, len(todo), self.chunk_size):
                    chunk = todo[start : start + self.chunk_size]
                    inputs = [prompt + text for text in chunk]
                    with autocast(self.device_type, self.stats.precision):
                        vectors = model.encode(
                            inputs,
                            batch_size=self.batch_size,
                            max_length=self.spec.max_length,
                            normalize=self.spec.normalize,
                        )  # (n, d) float32
                    broken = ~np.isfinite(vectors).all(axis=1)  # (n,)
                    if broken.any():  # NaN would score as NaN, or crash a metric: never cached, never scored
                        raise ValueError(
                            f"{self.spec.directory}: the encoder gave non-finite embeddings (NaN or inf) for "
                            f"{int(broken.sum())} texts, e.g. {chunk[int(broken.argmax())][:60]!r}; "
                            "its weights hold NaN or inf (a diverged training run?): evaluate another checkpoint"
                        )
                    if cache is not None:
                        self._store(cache, [input_key(text, prompt) for text in chunk], vectors)
                    encoded.update(zip(chunk, vectors))
                    progress.update(start + len(chunk))
            seconds = time.perf_counter() - started
            self.stats.encode_seconds += seconds
            logger.info("encoded %d texts in %.1f s", len(todo), seconds)
        self.stats.distinct_texts += len(distinct)
        self.stats.from_cache += len(distinct) - len(todo)
        self.stats.encoded += len(todo)
        if not distinct:
            return TextEmbeddings([], np.zeros((0, 0), dtype=np.float32))
        rows = [found[text] if found.get(text) is not None else encoded[text] for text in distinct]
        return TextEmbeddings(distinct, truncate_embeddings(np.stack(rows), self.truncate_dim, self.spec.normalize))
