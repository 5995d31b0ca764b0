"""User reward functions: loaded from the ``reward`` config section or passed to `train.run`.

A reward function is called once per completion::

    fn(completion: str, prompt: str, row: dict) -> float

* ``completion``: the decoded completion (special tokens dropped);
* ``prompt``: the problem text (``Problem.prompt``: a dataset row's prompt
  column, or the last user message of its chat messages), not the rendered
  chat template;
* ``row``: the dataset row with every column (``task.name=dataset``), or for
  a built-in task ``{"id", "prompt", "answer", **metadata}``.  Read-only.

A function with the attribute ``batched = True`` is called once per RL step
instead, as ``fn(completions, prompts, rows) -> sequence of floats`` (one
value per completion, same order).

The reward of a completion is::

    reward = reward.task_weight * task verifier score       # 1/0, built-in checker
           + train.reward_format_weight * format bonus
           + sum(reward.weights[name] * fn(...))            # weight 1 unless set

Each function's unweighted batch mean is logged as ``reward/<name>``.  A
function that raises (``SystemExit`` and ``KeyboardInterrupt`` included), calls
``os._exit`` (caught while rewards run; a reference taken at import time,
``from os import _exit``, is not), returns
something that is not a float32-finite number, or whose calls of one RL step take
longer than ``reward.timeout_s`` (a progress line every 10 s meanwhile), stops the
run with a `UsageError` naming it (the CLI prints one line, exit 2).

Config: ``reward.functions`` maps a name to an import path, either
``"package.module:function"`` (imported with `importlib.import_module`) or
``"path/to/file.py:function"`` (the file is loaded as a module by path,
relative to the working directory)::

    reward:
      functions: {brevity: my_rewards.py:brevity, exact: my_pkg.rewards:exact}
      weights: {brevity: 0.5}
      task_weight: 1.0
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip
from ais_jax.tasks.rewards import call_user_reward

RewardFn = Callable[[str, str, dict], float]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class UserReward:
    """One loaded reward function.

    Attributes:
      name: the metric name (``reward/<name>``) and the key in ``reward.weights``.
      fn: the callable (signature in the module doc).
      weight: its weight in the total reward.
      batched: True when ``fn`` takes whole batches (``fn.batched``).
    """

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    batched: bool = False


def check_names(functions: Mapping[str, str], weights: Mapping[str, float]) -> None:
    """Check the ``reward`` section's names (no imports).

    Raises:
      UsageError: a bad function name or spec, or a weight without a function.
    """
    for name, spec in functions.items():
        if not _NAME.fullmatch(name):
            raise UsageError(f"reward.functions name {clip(name)} must be a word of letters, "
                             "digits, '_', '.' or '-' (it becomes the metric reward/<name>)")
        if not isinstance(spec, str) or ":" not in spec:
            raise UsageError(f"reward.functions.{name}={clip(spec)} must be 'module:function' "
                             "or 'path/to/file.py:function'")
    for name, w in weights.items():
        if name not in functions:
            raise UsageError(f"reward.weights.{clip(name)} names no function of "
                             f"reward.functions ({', '.join(functions) or 'none'})")
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            raise UsageError(f"reward.weights.{name} must be a finite number, got {clip(w)}")


def _import_module(target: str, name: str) -> Any:
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"reward.functions.{name}: file {clip(target)} does not exist")
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        mod_name = f"ais_jax_user_reward_{path.stem}_{digest}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"reward.functions.{name}: cannot load {clip(target)} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:  # SystemExit / KeyboardInterrupt at import are its errors too
            del sys.modules[mod_name]
            raise UsageError(f"reward.functions.{name}: loading {clip(target)} raised "
                             f"{type(e).__name__}: {_one_line(e)}") from None
        return module
    try:
        return importlib.import_module(target)
    except BaseException as e:  # ModuleNotFoundError, the module's import failing or exiting
        raise UsageError(f"reward.functions.{name}: cannot import module {clip(target)} "
                         f"({type(e).__name__}: {_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def check_signature(fn: Any, name: str) -> bool:
    """Check that ``fn`` takes ``(completion, prompt, row)``; return whether it is batched.

    Raises:
      UsageError: not callable, or it cannot be called with three positional arguments.
    """
    if not callable(fn):
        raise UsageError(f"reward function {name} is not callable (got {type(fn).__name__})")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return bool(getattr(fn, "batched", False))  # a builtin: no signature to check
    try:
        sig.bind("completion", "prompt", {})
    except TypeError:
        raise UsageError(f"reward function {name} has the signature {clip(str(sig))}; it must "
                         "take (completion, prompt, row)") from None
    return bool(getattr(fn, "batched", False))


def load_reward(name: str, spec: str, weight: float = 1.0) -> UserReward:
    """Import the reward function ``spec`` (``"module:fn"`` or ``"file.py:fn"``).

    Raises:
      UsageError: the module or file cannot be loaded, it has no such function,
        or the function does not take ``(completion, prompt, row)``.
    """
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise UsageError(f"reward.functions.{name}={clip(spec)} must be 'module:function' or "
                         "'path/to/file.py:function'")
    module = _import_module(target, name)
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise UsageError(f"reward.functions.{name}: {clip(target)} has no attribute "
                             f"{clip(attr)}")
        fn = getattr(fn, part)
    return UserReward(name, fn, float(weight), check_signature(fn, f"{name} ({spec})"))


def build_rewards(section: Any, extra: Mapping[str, Callable[..., Any]]
                  | Sequence[Callable[..., Any]] | None = None) -> tuple[UserReward, ...]:
    """The reward functions of a config's ``reward`` section plus ``extra`` callables.

    Args:
      section: ``cfg.reward`` (``functions``, ``weights`` as name/value pairs).
      extra: callables passed to `ais_jax.run.cli.run`: a mapping name -> fn, or a
        sequence (named by ``__name__``); ``reward.weights`` applies to them too.

    Raises:
      UsageError: see `load_reward` and `check_names`; a name used twice.
    """
    functions, weights = dict(section.functions), dict(section.weights)
    given = dict(extra) if isinstance(extra, Mapping) else {
        getattr(f, "__name__", f"fn{i}"): f for i, f in enumerate(extra or ())}
    both = sorted(set(functions) & set(given))
    if both:
        raise UsageError(f"reward function name {clip(both[0])} is both in reward.functions and "
                         "in reward_fns; rename one")
    check_names({**functions, **{k: "passed:fn" for k in given}}, weights)
    out = [load_reward(n, s, weights.get(n, 1.0)) for n, s in functions.items()]
    out += [UserReward(n, f, float(weights.get(n, 1.0)), check_signature(f, n))
            for n, f in given.items()]
    return tuple(out)


def problem_row(problem: Any) -> dict[str, Any]:
    """The ``row`` argument of a problem: its dataset row, or its fields and metadata."""
    row = problem.metadata.get("row") if hasattr(problem.metadata, "get") else None
    if isinstance(row, Mapping):
        return dict(row)
    return {"id": problem.id, "prompt": problem.prompt, "answer": problem.answer,
            **dict(problem.metadata)}


def _checked(name: str, value: Any) -> float:
    """``value`` as a finite float; UsageError naming the function otherwise."""
    probe = lambda *_: value  # noqa: E731 - reuse the task package's return-value checks
    probe.__qualname__ = name
    try:
        return call_user_reward(probe, "", None)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise UsageError(f"reward function {_one_line(e).removeprefix('user reward function ')}"
                         ) from None


PROGRESS_EVERY_S = 10.0  # a progress line while a function's calls run longer than this
_THREAD_PREFIX = "reward:"


class _ProcessExit(BaseException):
    """Raised in a reward thread in place of ``os._exit(status)``; args[0] is the status."""


class _ExitGuard:
    """While entered, ``os._exit`` called from a reward thread of this process raises
    `_ProcessExit` instead of ending the process (no summary, no export, a stale lock);
    any other caller (orbax threads, a forked child) exits as usual. Re-entrant."""

    def __init__(self) -> None:
        self._lock, self._depth, self._real = threading.Lock(), 0, os._exit
        self._pid = os.getpid()

    def _exit(self, status: int) -> None:
        if (os.getpid() == self._pid
                and threading.current_thread().name.startswith(_THREAD_PREFIX)):
            raise _ProcessExit(status)
        self._real(status)

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._real, self._pid = os._exit, os.getpid()
                os._exit = self._exit  # type: ignore[assignment]
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                os._exit = self._real


_EXIT_GUARD = _ExitGuard()


def _bounded(name: str, call: Callable[[], list[Any]], timeout_s: float) -> list[Any]:
    """Run ``call()`` (one function's calls of a step) in a worker thread, at most
    ``timeout_s`` seconds; a progress line every `PROGRESS_EVERY_S` seconds.

    Anything the function raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is the
    function's error (a `UsageError` naming it), never an exit of the run; so is a call of
    ``os._exit`` (`_ExitGuard`), which would otherwise end the process on the spot. A function that
    does not return in time is reported by name; its thread is left behind (a daemon: it
    cannot be killed, and it dies with the process, which stops with the error).
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["values"] = call()
        except BaseException as e:  # the user's code: report everything
            box["error"] = e

    thread = threading.Thread(target=work, name=f"{_THREAD_PREFIX}{name}", daemon=True)
    t0 = time.monotonic()
    with _EXIT_GUARD:
        thread.start()
        _wait(name, thread, t0, timeout_s)
    if "error" in box:
        e = box["error"]
        if isinstance(e, UsageError):
            raise e
        if isinstance(e, _ProcessExit):
            raise UsageError(f"reward function {name} called os._exit({e.args[0]!r}), which "
                             "would end the run with no checkpoint, summary or export; return "
                             "a number instead (raise an exception to stop the run)") from None
        raise UsageError(f"reward function {name} raised {type(e).__name__}: "
                         f"{_one_line(e)}") from None
    return box["values"]


def _wait(name: str, thread: threading.Thread, t0: float, timeout_s: float) -> None:
    """Join ``thread`` within ``timeout_s`` of ``t0``, printing a progress line meanwhile."""
    while True:
        left = timeout_s - (time.monotonic() - t0)
        thread.join(min(PROGRESS_EVERY_S, max(left, 0.0)))
        if not thread.is_alive():
            break
        waited = time.monotonic() - t0
        if waited >= timeout_s:
            raise UsageError(f"reward function {name} did not return within reward.timeout_s="
                             f"{timeout_s:g} s; make it faster or raise reward.timeout_s")
        print(f"reward function {name} still running after {waited:.0f} s (reward.timeout_s="
              f"{timeout_s:g})", file=sys.stderr, flush=True)


def score_rewards(rewards: Sequence[UserReward], completions: Sequence[str],
                  problems: Sequence[Any], timeout_s: float = 60.0) -> np.ndarray:
    """Unweighted values of each reward function: ``[B, F]`` float32.

    Each function's calls of the batch run in a worker thread bounded by ``timeout_s``
    (`_bounded`, ``reward.timeout_s``).

    Raises:
      UsageError: a function raised (SystemExit included), did not return in time, or
        returned a value that is not a float32-finite number; one line naming it.
    """
    out = np.zeros((len(completions), len(rewards)), np.float32)
    if not rewards:
        return out
    prompts = [p.prompt for p in problems]
    rows = [problem_row(p) for p in problems]
    for j, r in enumerate(rewards):
        if r.batched:
            def call(r: UserReward = r) -> list[Any]:
                values = list(r.fn(list(completions), prompts, rows))
                if len(values) != len(completions):
                    raise UsageError(f"reward function {r.name} returned {len(values)} values "
                                     f"for {len(completions)} completions")
                return values
        else:
            def call(r: UserReward = r) -> list[Any]:
                return [r.fn(c, p, row) for c, p, row in zip(completions, prompts, rows,
                                                             strict=True)]
        values = _bounded(r.name, call, timeout_s)
        out[:, j] = [_checked(r.name, v) for v in values]
    return out
