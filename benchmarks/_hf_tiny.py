"""A tiny random Qwen3 + word-level tokenizer saved as a Hugging Face directory, built offline.

Used by `benchmarks/grpo_step.py` so that ais_jax (``model.source=<dir>``,
``task.prompt_style=chat``) and TRL (``AutoModelForCausalLM`` /
``AutoTokenizer``) load the very same weights, tokenizer and chat template.

* Tokenizer: a `tokenizers` WordLevel model.  Pre-tokenization isolates
  letter runs, single digits, single whitespace characters and single
  punctuation characters; the decoder concatenates (``Fuse``), so
  ``decode(encode(text)) == text`` for text made of known words.  The vocabulary
  holds the special tokens (``<|endoftext|>`` pad, ``<|im_start|>``,
  ``<|im_end|>`` EOS, ``<unk>``), the added tokens ``<answer>`` / ``</answer>``,
  digits, whitespace, ASCII punctuation, single letters, the words of the
  task's chat prompts, then reserved filler tokens up to ``vocab_size`` (a
  realistic output-layer size; they are never produced by encoding, only by
  sampling).  Chat template: Qwen's ``<|im_start|>role\\n...<|im_end|>\\n``.
* Model: `transformers.Qwen3Config` (untied ``lm_head``), random init with
  ``torch.manual_seed(seed)``.  Optionally (``eos_prob > 0``) one tilt so that
  a random model ends its completions: every embedding gets the same offset
  (+0.3) along hidden dimension 0 and ``lm_head[EOS, 0]`` is calibrated so that
  the mean next-token probability of EOS after a chat prompt is about
  ``eos_prob`` (without it a random 8k-vocabulary model emits EOS with
  probability ~1/8192 and never stops).
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Iterable
from typing import Any

PAD, BOS_CHAT, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
ADDED = ("<answer>", "</answer>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_PIECES = r"[A-Za-z]+|\d|\s|[^A-Za-z\d\s]"


def _words(texts: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for t in texts:
        for w in re.findall(r"[A-Za-z]+", t):
            seen.setdefault(w, None)
    return list(seen)


def build_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A `PreTrainedTokenizerFast` over the words of ``texts``, padded to ``vocab_size``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = [PAD, BOS_CHAT, EOS, UNK, *ADDED, *string.digits, " ", "\n", "\t",
            *string.punctuation, *string.ascii_letters, "user", "assistant", "system",
            *_words(texts)]
    vocab: dict[str, int] = {}
    for tok in base:
        vocab.setdefault(tok, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(vocab)} real tokens")
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"<|reserved_{i}|>", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in (PAD, BOS_CHAT, EOS, UNK)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   unk_token=UNK, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, eos_id: int, pad_id: int, *, hidden_size: int = 128,
                num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2,
                head_dim: int = 32, intermediate_size: int = 384, max_positions: int = 1024,
                seed: int = 0) -> Any:
    """A random `Qwen3ForCausalLM` (float32)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, head_dim=head_dim,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(torch.float32).eval()


def _tilt_eos(model: Any, eos_id: int, target: float, contexts: Any, n_prompt: int) -> None:
    """Offset every embedding along dim 0 and calibrate ``lm_head[eos, 0]`` (secant method on
    log p) so that the mean EOS probability at positions ``>= n_prompt`` of ``contexts``
    (prompts followed by uniformly random tokens, which a near-uniform random model's own
    samples resemble) is ~``target``."""
    import math

    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 0.3
        w = model.lm_head.weight

        def f(x: float) -> float:
            w[eos_id, 0] = x
            logits = model(input_ids=contexts).logits[:, n_prompt:].float()
            p = float(torch.softmax(logits, -1)[..., eos_id].mean())
            return math.log(max(p, 1e-12)) - math.log(target)

        x0, x1 = 0.0, 1.0
        f0, f1 = f(x0), f(x1)
        for _ in range(12):
            if abs(f1) < 0.01 or f1 == f0:
                break
            x0, x1, f0 = x1, x1 - f1 * (x1 - x0) / (f1 - f0), f1
            f1 = f(x1)
        w[eos_id, 0] = x1


def _contexts(tok: Any, prompts: list[Any], n_new: int, seed: int) -> tuple[Any, int]:
    """``[B, P + n_new]`` ids: chat prompts (left-padded to P) + uniformly random tokens."""
    import torch

    ids = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for m in prompts]
    ids = [list(x["input_ids"]) if isinstance(x, dict) else list(x) for x in ids]
    P = max(len(x) for x in ids)
    head = torch.tensor([[tok.pad_token_id] * (P - len(x)) + x for x in ids])
    gen = torch.Generator().manual_seed(seed + 1)
    tail = torch.randint(0, len(tok), (len(ids), n_new), generator=gen)
    return torch.cat([head, tail], 1), P


def build_dir(path: str, prompts: list[Any], *, vocab_size: int = 8192,
              eos_prob: float = 0.0, seed: int = 0, **model_kw: Any) -> dict[str, Any]:
    """Write model + tokenizer to ``path``; returns a short description dict.

    ``prompts``: chat message lists; their words make the tokenizer's real
    vocabulary, and (with ``eos_prob > 0``) they are the calibration contexts
    of the EOS tilt.
    """
    texts = [m["content"] for msgs in prompts for m in msgs]
    tok = build_tokenizer(texts, vocab_size)
    eos_id, pad_id = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)
    model = build_model(len(tok), eos_id, pad_id, seed=seed, **model_kw)
    if eos_prob > 0:
        ctx, n_prompt = _contexts(tok, prompts[:16], 64, seed)
        _tilt_eos(model, eos_id, eos_prob, ctx, n_prompt)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    info = {"vocab": len(tok), "params": n_params, "eos_id": eos_id, "pad_id": pad_id,
            "eos_prob": eos_prob}
    with open(os.path.join(path, "bench_model.json"), "w") as f:
        json.dump(info, f)
    return info
