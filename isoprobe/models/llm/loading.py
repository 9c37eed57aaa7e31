"""Loading :class:`~isoprobe.models.llm.module.LlmModule`'s language model: a scratch GPT-2 / T5 on
isoprobe's character vocabulary, or a checkpoint directory / hub id with its tokenizer, checked
against its config.json (shapes, missing keys, token ids beyond the embedding)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    T5Config,
    T5ForConditionalGeneration,
)

from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    check_weights_fit,
    load_pretrained,
    pretrained_config,
)
from isoprobe.models.config_schema import check_pretrained_config
from isoprobe.models.llm.serialization import CharVocabulary, Serializer, TokenMap
from isoprobe.models.transformers_schemas import LLM_GPT2, LLM_T5

ARCHITECTURES = {"gpt2": GPT2LMHeadModel, "t5": T5ForConditionalGeneration}
HUB_IDS = {"gpt2": "openai-community/gpt2", "t5": "google-t5/t5-small"}
#: the config.json field that records the serialisation a checkpoint was trained with
SERIALIZER_KEY = "isoprobe_llmtime"


def load_lm(
    resolved: ResolvedCheckpoint,
    arch: str,
    scratch: dict[str, Any] | None,
    serializer: Serializer,
) -> tuple[PreTrainedModel, Any, TokenMap]:
    """The model, its vocabulary (isoprobe's or the hub tokenizer) and the symbol map."""
    model_class = ARCHITECTURES[arch]
    if resolved.kind == "scratch":
        vocabulary = CharVocabulary()
        token_map = TokenMap.from_vocabulary(vocabulary)
        special = {"pad_token_id": token_map.pad_id, "eos_token_id": token_map.eos_id}
        if arch == "gpt2":
            config = GPT2Config(**scratch, vocab_size=len(vocabulary), bos_token_id=None, **special)
        else:
            config = T5Config(
                **scratch, vocab_size=len(vocabulary), decoder_start_token_id=0, **special
            )
        setattr(config, SERIALIZER_KEY, dataclasses.asdict(serializer))
        return model_class(config), vocabulary, token_map
    source = resolved.location
    check_pretrained_config(source, LLM_T5 if arch == "t5" else LLM_GPT2)
    config = pretrained_config(
        source, "model=llm loads GPT-2 and T5 checkpoints (config.json + model.safetensors)."
    )
    if config.model_type != arch:
        raise CheckpointError(
            f"{source} holds a {config.model_type!r} model but model.arch={arch}: set "
            f"model.arch={config.model_type} if it is gpt2 or t5, or pick a {arch} checkpoint."
        )
    vocabulary, token_map = _vocabulary(source)
    if resolved.kind != "hub":
        _check_shapes(Path(source), model_class(config))
    model, info = load_pretrained(model_class, source)
    # a tied output head is not stored: its absence is not a missing weight
    check_weights_fit(info, source, missing=[k for k in info["missing_keys"] if "lm_head" not in k])
    vocab_rows = model.get_input_embeddings().weight.shape[0]
    largest = max(max(ids) for ids in token_map.symbol_ids.values())
    if largest >= vocab_rows:
        raise CheckpointError(
            f"the tokenizer in {source} uses token id {largest}, but the model's embedding has "
            f"{vocab_rows} rows: tokenizer and weights belong to different checkpoints."
        )
    return model, vocabulary, token_map


def _vocabulary(source: str) -> tuple[Any, TokenMap]:
    """isoprobe's character vocabulary when the directory has its file, else the hub
    tokenizer (GPT-2's BPE, T5's SentencePiece) through AutoTokenizer."""
    path = Path(source) / CharVocabulary.FILE
    if path.is_file():
        vocabulary = _char_vocabulary(path)
        return vocabulary, TokenMap.from_vocabulary(vocabulary)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{source} has no tokenizer: neither isoprobe's {CharVocabulary.FILE} nor Hugging "
            f"Face tokenizer files ({err}). Save the tokenizer next to the weights."
        ) from err
    except Exception as err:  # the tokenizers library raises bare Exceptions on bad files
        raise CheckpointError(
            f"the tokenizer files in {source} cannot be read ({err}): they are corrupt or were "
            "edited. Save the checkpoint's own tokenizer next to the weights."
        ) from err
    try:
        return tokenizer, TokenMap.from_tokenizer(tokenizer, source)
    except ValueError as err:
        raise CheckpointError(str(err)) from err


def _char_vocabulary(path: Path) -> CharVocabulary:
    """isoprobe's character vocabulary from its file: ``{"tokens": [...]}``, each token once,
    the symbols and special tokens among them; anything else is refused naming the file."""
    try:
        tokens = json.loads(path.read_text()).get("tokens")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise CheckpointError(
            f"{path} is not a JSON object with a list of tokens ({err}). Copy or export the "
            "checkpoint again."
        ) from None
    if (
        not isinstance(tokens, list)
        or not all(isinstance(t, str) for t in tokens)
        or len(set(tokens)) != len(tokens)
    ):
        raise CheckpointError(
            f"{path}: 'tokens' must be a list of distinct strings, got {tokens!r:.200}. Copy or "
            "export the checkpoint again."
        )
    try:
        return CharVocabulary(tokens)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}. Copy or export the checkpoint again.") from None


def _check_shapes(directory: Path, model: PreTrainedModel) -> None:
    """Name the first tensor whose shape in ``model.safetensors`` differs from the model that
    ``config.json`` describes (transformers would only say that loading failed)."""
    weights = directory / "model.safetensors"
    if not weights.is_file():
        return
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as file:
            for name in file.keys():
                found = tuple(file.get_slice(name).get_shape())
                if name in expected and expected[name] != found:
                    raise CheckpointError(
                        f"the tensor {name} in {weights} has shape {found}, but config.json "
                        f"describes {expected[name]}: the weights belong to another shape. "
                        "Re-export the model or fix config.json."
                    )
    except SafetensorError as err:
        raise CheckpointError(
            f"the weights file in {directory} cannot be read ({err}): it is truncated or corrupt."
        ) from err
