"""Text <-> token ids for prompts and completions: the one prompt codec of both CLIs.

A `PromptCodec` turns a task problem (or raw text / chat messages) into prompt
ids in one of two styles, ``compact`` (the character-level tokenizer of
scratch models: the task's compact prompt after BOS) and ``chat`` (an HF
tokenizer's chat template with the generation prompt), and decodes sampled
completions back to text for the verifier.  `encode_batch` left-pads a batch
to a fixed prompt bucket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip
from ais_jax.rollout.sampler import pad_prompts

STYLES = ("compact", "chat")
# ais_jax.tasks.tokenizer.DEFAULT_ALPHABET (rollout does not import tasks): named in errors
_ASCII_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))


def problem_location(problem: Any) -> str | None:
    """The ``file:line`` (or ``file row N``) a problem was read from; None for a generated one."""
    m = getattr(problem, "metadata", None)
    if isinstance(m, Mapping):
        if isinstance(m.get("where"), str):
            return m["where"]
        if m.get("source") and m.get("line"):
            return f"{m['source']}:{m['line']}"
    return None


def problem_where(problem: Any, task_name: str) -> str:
    """Where a problem comes from, for one-line errors: `problem_location`, else
    ``task NAME, problem 'its first words...'``."""
    return problem_location(problem) or (
        f"task {task_name}, problem {clip(getattr(problem, 'prompt', '?'), 48)}")


@dataclasses.dataclass
class PromptCodec:
    """Prompt encoding and completion decoding for one tokenizer and prompt style.

    Attributes:
      tokenizer: a `ais_jax.tasks.CharTokenizer` (compact) or an HF tokenizer.
      style: ``"compact"`` or ``"chat"``.
      task: the task whose prompts are encoded (None: text / messages only).
      pad_id: id written into padding.
      eos_ids: ids that end a completion (dropped when decoding).
    """

    tokenizer: Any
    style: str
    task: Any
    pad_id: int
    eos_ids: tuple[int, ...]

    def encode_text(self, text: str) -> list[int]:
        """Ids of a rendered prompt string (`prompt_text`): BOS first for the character
        tokenizer; an HF tokenizer adds no special tokens (the chat template has them)."""
        if self.style == "compact":
            return self.tokenizer.encode(text, add_bos=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def messages_text(self, messages: Sequence[dict[str, str]]) -> str:
        """Chat ``messages`` rendered by the tokenizer's chat template (generation prompt on).

        Compact style, or a tokenizer without a template: the turns' contents joined.
        """
        if self.style == "compact" or not getattr(self.tokenizer, "chat_template", None):
            return "\n".join(m["content"] for m in messages)
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=True)

    def prompt_text(self, problem: Any) -> str:
        """The prompt string of a task problem in the codec's style."""
        if self.style == "compact":
            return self.task.compact_prompt(problem)
        return self.messages_text(self.task.chat_messages(problem))

    def encode_prompt(self, problem: Any) -> list[int]:
        """Prompt ids of a task problem in the codec's style.

        Raises:
          UsageError: (compact style) a character outside the character
            tokenizer's alphabet; names the problem (`problem_where`) and the character.
        """
        text = self.prompt_text(problem)
        try:
            return self.encode_text(text)
        except UsageError:
            raise
        except ValueError:
            if self.style != "compact":
                raise
            raise self._alphabet_error(text, problem, "prompt") from None

    def decode(self, ids: np.ndarray, mask: np.ndarray) -> str:
        """Text of one completion: ``ids [N]`` where ``mask [N] > 0``, EOS dropped."""
        keep = [int(t) for t, m in zip(ids, mask, strict=True)
                if m > 0 and int(t) not in self.eos_ids]
        if self.style == "compact":
            return self.tokenizer.decode(keep)
        return self.tokenizer.decode(keep, skip_special_tokens=True)

    def encode_answer(self, problem: Any, answer: str | None = None) -> list[int]:
        """Target ids of the supervised warm start (compact style): answer + EOS.

        ``answer`` replaces ``problem.answer`` (a flawed demonstration).

        Raises:
          UsageError: a character outside the character tokenizer's alphabet.
        """
        text = problem.answer if answer is None else answer
        try:
            return self.tokenizer.encode(text, add_eos=True)
        except ValueError:
            raise self._alphabet_error(text, problem, "answer") from None

    def _alphabet_error(self, text: str, problem: Any, what: str) -> UsageError:
        """The one-line error of ``text`` (a problem's prompt or answer) holding a character
        the character tokenizer cannot encode."""
        known = set(getattr(self.tokenizer, "alphabet", ""))
        c = next((c for c in text if c not in known), "?")
        alphabet = getattr(self.tokenizer, "alphabet", "")
        has = ("newline and printable ASCII" if alphabet == _ASCII_ALPHABET
               else f"{len(alphabet)} characters")
        where = problem_where(problem, getattr(self.task, "name", "?"))
        fix = ("replace it or drop the row" if problem_location(problem) else
               "use another task, or a pretrained model (model.source) with "
               "task.prompt_style=chat")
        return UsageError(f"{where}: the {what} has character {c!r} (U+{ord(c):04X}), which "
                          f"the scratch model's character tokenizer lacks (it has {has}); {fix}")

    def encode_batch(self, problems: Sequence[Any], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompts ``([B, length] int32 ids, [B, length] bool mask)``.

        Raises:
          UsageError: a prompt is longer than ``length``.
        """
        return self.pad([self.encode_prompt(p) for p in problems], length)

    def pad(self, seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Left-pad id lists to ``length``: ``([B, length] int32, [B, length] bool)``.

        Raises:
          UsageError: a prompt is longer than ``length``.
        """
        longest = max(len(s) for s in seqs)
        if longest > length:
            raise UsageError(f"a prompt has {longest} tokens, more than the prompt bucket "
                             f"{length}")
        return pad_prompts(seqs, pad_id=self.pad_id, length=length)
