"""A checkpoint dir's tokenizer, loaded offline, and its agreement with the model it feeds."""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path
from typing import Any

from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checkpoint import HfCheckpoint

log = logging.getLogger(__name__)


@cache
def load_tokenizer(path: str) -> Any:
    """transformers' AutoTokenizer from a local dir; never a hub download."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise SlimeHydraError(
            f"tokenizer dir {path!r} is not a directory; set data.tokenizer=DIR (a dir with "
            "tokenizer.json / tokenizer_config.json), or model=hf model.path=DIR."
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ...
        raise SlimeHydraError(
            f"no tokenizer loads from {root} ({type(exc).__name__}: {exc}); it needs the "
            "files tokenizer.save_pretrained writes (tokenizer.json, tokenizer_config.json)."
        ) from None


def eos_ids(value: Any, where: str) -> set[int]:
    """config.json's eos_token_id: an int, a list of ints, or null (anything else is our error
    naming `where`, never int()-coerced)."""
    if value is None:
        return set()
    ids = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in ids):
        raise SlimeHydraError(
            f"{where}: eos_token_id={value!r} is not a token id or a list of them; fix the "
            "checkpoint's config.json."
        )
    return set(ids)


def check_tokenizer_matches(tokenizer_dir: str, ckpt: HfCheckpoint) -> None:
    """The tokenizer must fit the model's embedding (every id it can produce is a row) and end
    turns with a token the model's config.json knows as end-of-sequence."""
    tokenizer = load_tokenizer(tokenizer_dir)
    vocab = ckpt.count("vocab_size")
    size = len(tokenizer)
    if size > vocab:
        raise SlimeHydraError(
            f"the tokenizer in {tokenizer_dir} has {size} tokens but the model in {ckpt.path} "
            f"has vocab_size={vocab}: ids above {vocab - 1} have no embedding row, so the "
            "tokenizer belongs to another model. Use the checkpoint's own tokenizer "
            "(data.tokenizer=${model.path}, the default)."
        )
    model_eos = eos_ids(ckpt.config.get("eos_token_id"), ckpt.where)
    eos = tokenizer.eos_token_id
    if model_eos and eos is not None and eos not in model_eos:
        raise SlimeHydraError(
            f"the tokenizer in {tokenizer_dir} ends sequences with id {eos} "
            f"({tokenizer.eos_token!r}) but the model in {ckpt.path} has eos_token_id="
            f"{ckpt.config.get('eos_token_id')}; the tokenizer belongs to another model. Use "
            "the checkpoint's own tokenizer (data.tokenizer=${model.path}, the default)."
        )
