"""The end of a run: the final policy exported, ``summary.json`` written, the result printed.

Called by `ais_jax.run.loop` on process 0 once every process has gathered the params.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from ais_jax.core import storage
from ais_jax.run import results


def finish(cfg: Any, r: Any, params: Any, eval_before: Any, eval_after: Any,
            compiles: dict[str, int], step: int, adapters: Any = None) -> None:
    """Export the final policy (HF directory + tokenizer; with LoRA the merged model and the
    adapters in PEFT's format under ``adapter/``) atomically, then write summary.json
    (naming ``step``), then print the result (`ais_jax.run.results`).

    Process 0 only: joins no collective (``params`` and ``adapters`` are host arrays with
    several processes, gathered by all of them before).

    Args:
      cfg: the run's config.
      r: the built run (`ais_jax.training.build.Run`).
      params: the model's final params.
      eval_before: the held-out evaluation before GRPO.
      eval_after: the one after.
      compiles: compilations per program (summary.json).
      step: the last step trained.
      adapters: the LoRA adapters, or None.
    """
    from ais_jax.models.pretrained import save_pretrained

    def save(directory: str) -> None:
        if r.is_llada:  # params: host arrays already (gathered by every process)
            from ais_jax.models.llada.checkpoint import save as save_llada

            save_llada(directory, params, r.model_cfg)
        else:
            save_pretrained(params, r.model_cfg, directory)
        if adapters is not None:
            from ais_jax.models.base_digest import source_digest, write_adapter_base
            from ais_jax.models.peft_io import save_peft_adapter

            adapter_dir = os.path.join(directory, results.ADAPTER_DIR)
            save_peft_adapter(adapters, r.lora.cfg, r.model_cfg, adapter_dir,
                              base_model_name_or_path=cfg.model.source)
            write_adapter_base(adapter_dir, source_digest(cfg.model.source))
        tok = r.codec.tokenizer
        if hasattr(tok, "save"):
            tok.save(directory)
        elif hasattr(tok, "save_pretrained"):
            tok.save_pretrained(directory)

    final = results.export_final(cfg.out_dir, save)
    summary = {"step": step, "eval_before": eval_before, "eval_after": eval_after,
               "compiles": compiles, "steps": cfg.train.steps}
    with contextlib.suppress(OSError, ValueError):  # written by _before_grpo, kept on resume
        summary["warm_start"] = json.loads(storage.read_text(
            storage.join(cfg.out_dir, "warm_start.json")))
    results.write_json_atomic(storage.join(cfg.out_dir, results.SUMMARY), summary)
    print(f"held-out accuracy after GRPO: {fmt_eval(eval_after)} (before: "
          f"{fmt_eval(eval_before)}); policy exported to {final}", flush=True)


def fmt_eval(ev: dict[str, Any]) -> str:
    """``"greedy 0.715"`` or ``"greedy 0.715, sampled 0.642"``."""
    out = f"greedy {ev['accuracy']:.3f}"
    if "sampled_accuracy" in ev:
        out += f", sampled {ev['sampled_accuracy']:.3f}"
    return out
