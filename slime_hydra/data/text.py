"""Text rollouts: records of prompt, response and reward, tokenized with the model's tokenizer.

One record per sample (JSON Lines, or Parquet with the same columns):
  {"prompt": "What is 2+3?", "response": "5", "reward": 1.0}
`prompt` is a string (one user turn) or a list of chat messages ({"role", "content"});
`response` is the policy's text; `reward` a number. Samples with the same prompt form one
rollout group, so GRPO advantages (reward - group mean) / group std are computed per prompt.

The prompt goes through the tokenizer's chat template with the generation prompt (the
assistant turn's opening), the response is tokenized as plain text and, with
`append_eos=true`, closed by the tokenizer's end-of-sequence token (ChatML's <|im_end|>), which
the policy emitted to stop. The loss mask covers exactly the response tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import RolloutTokens
from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import json_lines, parquet_rows


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) of a .jsonl or .parquet file."""
    yield from parquet_rows(path) if path.suffix == ".parquet" else json_lines(path)


def _encodable(text: str, at: str, field: str) -> str:
    """`text` if it is valid Unicode (JSON's \\ud800 escapes decode to lone surrogates, which no
    tokenizer encodes), else our error naming the record and field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SlimeHydraError(
            f"{at}: {field} holds {text[exc.start]!r} at character {exc.start}, a lone UTF-16 "
            "surrogate that is not text (the tokenizer cannot encode it); fix the record."
        ) from None
    return text


def _messages(prompt: Any, at: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": _encodable(prompt, at, "prompt")}]
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in prompt
        )
    ):
        return [
            {
                "role": _encodable(m["role"], at, "role"),
                "content": _encodable(m["content"], at, "prompt"),
            }
            for m in prompt
        ]
    raise SlimeHydraError(
        f"{at}: prompt must be a string or a non-empty list of {{role, content}} messages."
    )


@dataclass(frozen=True)
class TextRollouts:
    """prompt/response/reward records, tokenized with the tokenizer in `tokenizer` (a dir)."""

    path: str
    """A .jsonl (or .parquet) file of {prompt, response, reward} records."""
    tokenizer: str | None = None
    """Dir of the tokenizer; the default, ${model.path}, is the checkpoint's own."""
    chat_template: bool = True
    """Apply the tokenizer's chat template (with the generation prompt) to the prompt."""
    append_eos: bool = True
    """End each response with the tokenizer's eos token (the end of the assistant turn)."""

    def _encode(
        self, tokenizer: Any, content: str | list[dict[str, str]], at: str, field: str
    ) -> list[int]:
        """The token ids of a text, or of chat messages through the chat template with the
        generation prompt; what the tokenizer or its template raises instead is our error
        naming the record and field (a template's raise_exception, a syntax error, ...)."""
        try:
            if isinstance(content, list):
                return tokenizer.apply_chat_template(
                    content, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            return tokenizer(content, add_special_tokens=False)["input_ids"]
        except Exception as exc:  # tokenizers, jinja2 and transformers raise many types
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            template = (
                "its chat template, or set data.chat_template=false to tokenize prompts as "
                "plain text"
                if isinstance(content, list)
                else "the tokenizer"
            )
            raise SlimeHydraError(
                f"{at}: the tokenizer in {self.tokenizer} cannot encode the {field} "
                f"({type(exc).__name__}: {first}); fix the record, or {template}."
            ) from None

    def load(self) -> RolloutBatch:
        """Tokenize every record; name the file and line of the first bad one."""
        from slime_hydra.hf.tokenizer import load_tokenizer

        path = Path(self.path)
        if not path.is_file():
            raise SlimeHydraError(f"data.path={self.path!r} is not a file.")
        if not self.tokenizer:
            raise SlimeHydraError(
                "data=text tokenizes with a checkpoint's tokenizer: set model=hf "
                "model.path=DIR (its tokenizer is the default) or data.tokenizer=DIR."
            )
        tokenizer = load_tokenizer(self.tokenizer)
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise SlimeHydraError(
                f"the tokenizer in {self.tokenizer} has no chat template; give the checkpoint's "
                "tokenizer_config.json its chat_template, or set data.chat_template=false to "
                "tokenize prompts as plain text."
            )
        eos = tokenizer.eos_token_id
        if self.append_eos and eos is None:
            raise SlimeHydraError(
                f"the tokenizer in {self.tokenizer} has no eos token; set data.append_eos=false."
            )
        prompts: dict[str, int] = {}
        tokens, response_lengths, rewards, groups = [], [], [], []
        for at, record in _records(path):
            if not isinstance(record, dict) or not {"prompt", "response", "reward"} <= set(record):
                raise SlimeHydraError(
                    f"{at}: each record must be an object with prompt, response and reward."
                )
            reward = record["reward"]
            if isinstance(reward, bool) or not isinstance(reward, int | float):
                raise SlimeHydraError(f"{at}: reward={reward!r} is not a number.")
            if not math.isfinite(reward):
                raise SlimeHydraError(f"{at}: reward={reward!r} is not finite.")
            if not isinstance(record["response"], str):
                raise SlimeHydraError(f"{at}: response must be a string.")
            messages = _messages(record["prompt"], at)
            prompt = messages if self.chat_template else "".join(m["content"] for m in messages)
            prompt_ids = self._encode(tokenizer, prompt, at, "prompt")
            response = _encodable(record["response"], at, "response")
            response_ids = self._encode(tokenizer, response, at, "response")
            if self.append_eos:
                response_ids = [*response_ids, eos]
            if not response_ids:
                raise SlimeHydraError(
                    f"{at}: the response tokenizes to no tokens (and data.append_eos=false)."
                )
            key = json.dumps(messages, sort_keys=True)
            groups.append(prompts.setdefault(key, len(prompts)))
            tokens.append([*prompt_ids, *response_ids])
            response_lengths.append(len(response_ids))
            rewards.append(float(reward))
        if not tokens:
            raise SlimeHydraError(f"{path} holds no records: the rollout is empty.")
        data = RolloutTokens.from_samples(
            tokens,
            response_lengths,
            [[1] * n for n in response_lengths],
            rewards,
            groups,
        )
        return RolloutBatch.from_tokens(data)
