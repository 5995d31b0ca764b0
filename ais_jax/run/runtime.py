"""Process settings of a training run: the persistent compilation cache and the profiler.

Both come from the ``runtime`` section of the config (`ais_jax.config.schema.RuntimeSection`)
and leave the results unchanged; `setup` prepares both at the start of a run.

*Compilation cache.*  `setup_compile_cache` points JAX's persistent
compilation cache at ``runtime.compile_cache`` (default
``~/.cache/ais_jax/jax``; a set ``JAX_COMPILATION_CACHE_DIR`` replaces the
default) with no minimum compile time or entry size, so a rerun or a resume
of the same config loads its executables from disk instead of compiling
them.  ``none``, ``off`` or an empty value turns it off.  A directory that
cannot be created or written is a `UsageError`, except the default one, which
only turns the cache off with a warning (a read-only home must not stop a run).

*Profiler.*  `StepProfiler` writes a JAX profiler trace of
``runtime.profile_steps`` RL steps to ``runtime.profile_dir``, starting with
the second step of the process (the first one compiles).  The trace is
stopped when the last traced step ends, when the loop ends, or when it fails.
Open ``plugins/profile/<time>/perfetto_trace.json.gz`` at
https://ui.perfetto.dev, or the directory with TensorBoard / XProf (the
``*.xplane.pb`` file).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from ais_jax.config.schema import DEFAULT_COMPILE_CACHE, Config, RuntimeSection
from ais_jax.core import storage
from ais_jax.core.errors import UsageError
from ais_jax.core.safe_yaml import clip, cut

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF_VALUES = ("", "none", "off")
# JAX's own environment variables of the thresholds win over ours.
_THRESHOLDS = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,  # no size limit, no filesystem override
}


def resolve_compile_cache(
    rt: RuntimeSection, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """The compilation cache directory a run uses and where that setting came from.

    Args:
      rt: the ``runtime`` section of the config.
      environ: the environment (default ``os.environ``); a non-empty
        ``JAX_COMPILATION_CACHE_DIR`` replaces the default directory, not an
        explicit one.

    Returns:
      ``(directory, source)``: the absolute directory, or None when the cache
      is off; the source is ``"runtime.compile_cache"``, ``"default"`` or
      ``"JAX_COMPILATION_CACHE_DIR"`` (for error messages).
    """
    environ = os.environ if environ is None else environ
    value = rt.compile_cache.strip()
    if value.lower() in OFF_VALUES:
        return None, "runtime.compile_cache"
    source = "runtime.compile_cache"
    if value == DEFAULT_COMPILE_CACHE:
        source = "default"
        if environ.get(CACHE_ENV, "").strip():
            value, source = environ[CACHE_ENV].strip(), CACHE_ENV
    if storage.is_remote(value):  # JAX's cache writes a bucket itself (etils.epath)
        return value, source
    return os.path.abspath(os.path.expanduser(value)), source


def _writable_dir(path: str) -> str | None:
    """Creates ``path`` and writes a probe file there; the reason it cannot, or None."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write_probe_")
        os.close(fd)
        os.remove(probe)
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    return None


def setup_compile_cache(rt: RuntimeSection, environ: Mapping[str, str] | None = None) -> str | None:
    """Turns JAX's persistent compilation cache on (or off) for this process.

    Call before the first compilation.  A later call with another directory
    resets JAX's cache so that it takes effect (several runs in one process).

    Args:
      rt: the ``runtime`` section of the config.
      environ: the environment (default ``os.environ``), see `resolve_compile_cache`.

    Returns:
      The cache directory in use, or None when the cache is off.

    Raises:
      UsageError: an explicitly set directory cannot be created or written.
    """
    environ = os.environ if environ is None else environ
    path, source = resolve_compile_cache(rt, environ)
    if path is not None and not storage.is_remote(path):
        why = _writable_dir(path)
        if why is not None and source == "default":
            print(f"warning: compilation cache {path} is not writable ({why}); running without "
                  "it (set runtime.compile_cache to a writable directory)", file=sys.stderr)
            path = None
        elif why is not None:
            fix = ("unset it or point it at a writable directory" if source == CACHE_ENV else
                   "set runtime.compile_cache to a writable directory, or none to turn it off")
            raise UsageError(f"{source} {path!r} is not a writable directory ({why}); {fix}")
    if jax.config.jax_compilation_cache_dir != path:
        jax.config.update("jax_compilation_cache_dir", path)
        compilation_cache.reset_cache()  # JAX opens its cache once; reopen it at the new path
    if path is not None:
        for name, value in _THRESHOLDS.items():
            if name.upper() not in environ:
                jax.config.update(name, value)
    return path


def check_profile_dir(rt: RuntimeSection) -> str | None:
    """Creates ``runtime.profile_dir`` and checks that it is writable.

    Args:
      rt: the ``runtime`` section of the config.

    Returns:
      The absolute trace directory, or None when profiling is off.

    Raises:
      UsageError: the directory cannot be created or written.
    """
    if not rt.profile_dir:
        return None
    if storage.is_remote(rt.profile_dir):
        raise UsageError(f"runtime.profile_dir {rt.profile_dir!r} is a bucket; the profiler "
                         "writes local files: set runtime.profile_dir to a local directory")
    path = os.path.abspath(os.path.expanduser(rt.profile_dir))
    why = _writable_dir(path)
    if why is not None:
        raise UsageError(f"runtime.profile_dir {rt.profile_dir!r} is not a writable directory "
                         f"({why}); set it to a writable directory, or '' to turn it off")
    return path


_XLA_LOG = re.compile(r"^[FEWI]\d{4} [\d:.]+\s+\d+ [^\]]+\] ")


def check_xla_flags(rt: RuntimeSection, environ: Mapping[str, str] | None = None,
                    timeout_s: float = 120.0) -> None:
    """``runtime.xla_flags`` as XLA reads them: refused in one line instead of a fatal XLA log.

    Each flag must be ``--name`` or ``--name=value``; then XLA is started once in a
    child process (CPU backend, which parses the same flag table) with the resulting
    ``XLA_FLAGS``, and its complaint about an unknown flag or an unreadable value becomes
    the message.  Nothing runs when the key is empty.  A child that does not answer within
    ``timeout_s`` is not held against the flags.

    Args:
      rt: the ``runtime`` section of the config.
      environ: the environment the run will have (default ``os.environ``).
      timeout_s: seconds the child may take.

    Raises:
      UsageError: a malformed flag, or one XLA refuses (its own words, one line).
    """
    import subprocess

    environ = os.environ if environ is None else environ
    extra = rt.xla_flags.strip()
    if not extra:
        return
    for flag in extra.split():
        if not re.fullmatch(r"--[A-Za-z0-9_]+(=.*)?", flag):
            raise UsageError(f"runtime.xla_flags: {clip(flag)} is not a flag; write "
                             "--name=value flags separated by spaces, e.g. "
                             "--xla_gpu_enable_command_buffer=")
    env = {**environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": " ".join(x for x in (environ.get("XLA_FLAGS", ""), extra) if x)}
    try:
        proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return
    if proc.returncode == 0:
        return
    lines = [_XLA_LOG.sub("", x).strip() for x in proc.stderr.splitlines()]
    said = [x for x in lines if "flag" in x.lower() and not x.startswith("Check failed")]
    reason = said[0] if said else (lines[-1] if lines else f"exit status {proc.returncode}")
    raise UsageError(f"runtime.xla_flags={clip(extra)}: XLA refuses them ({cut(reason, 200)}); "
                     "fix or remove the flag")


def apply_xla_flags(rt: RuntimeSection, environ: dict[str, str] | None = None) -> str:
    """Appends ``runtime.xla_flags`` to ``XLA_FLAGS`` (the user's flags come last and win).

    XLA reads ``XLA_FLAGS`` once, when JAX starts its backend, so this must run
    before the first ``jax.devices()`` / compilation of the process.

    Args:
      rt: the ``runtime`` section of the config.
      environ: the environment to update (default ``os.environ``).

    Returns:
      The resulting ``XLA_FLAGS`` value.

    Raises:
      UsageError: flags were given but JAX's backend already started (they would be ignored).
    """
    environ = os.environ if environ is None else environ
    extra = rt.xla_flags.strip()
    if not extra:
        return environ.get("XLA_FLAGS", "")
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise UsageError("runtime.xla_flags cannot take effect: JAX's backend already started in "
                         "this process; set XLA_FLAGS in the environment before starting Python")
    environ["XLA_FLAGS"] = " ".join(x for x in (environ.get("XLA_FLAGS", ""), extra) if x)
    return environ["XLA_FLAGS"]


def setup(rt: RuntimeSection) -> str | None:
    """Prepares a run's process: XLA flags, the compilation cache on, the trace directory
    checked.

    Call at the start of a run, before the first compilation, so that a bad
    directory fails in a second.

    Args:
      rt: the ``runtime`` section of the config.

    Returns:
      The compilation cache directory in use, or None when the cache is off.

    Raises:
      UsageError: a directory cannot be created or written, or ``runtime.xla_flags`` that
        XLA refuses (`check_xla_flags`).
    """
    check_xla_flags(rt)  # one line, not XLA's fatal log at the first compilation
    apply_xla_flags(rt)
    path = setup_compile_cache(rt)
    check_profile_dir(rt)
    return path


def with_profile_flag(cfg: Config) -> Config:
    """``cfg`` with ``runtime.profile_dir`` set to ``out_dir/profile`` unless already set.

    What the trainer's ``--profile`` flag does.

    Args:
      cfg: a validated config.
    """
    if cfg.runtime.profile_dir:
        return cfg
    if storage.is_remote(cfg.out_dir):  # the trace is local files: beside the working dir
        name = cfg.out_dir.rstrip("/").rsplit("/", 1)[-1]
        rt = dataclasses.replace(cfg.runtime, profile_dir=os.path.join("profile", name))
        return dataclasses.replace(cfg, runtime=rt)
    rt = dataclasses.replace(cfg.runtime, profile_dir=os.path.join(cfg.out_dir, "profile"))
    return dataclasses.replace(cfg, runtime=rt)


class StepProfiler:
    """Writes a JAX profiler trace of a few RL steps; a context manager around the loop.

    The trace covers the steps ``first + 1 .. first + runtime.profile_steps`` (0-based
    loop indices, ``first`` being the first step this process runs, the one
    that compiles).  Use it as::

        with StepProfiler(rt, first=start) as prof:
            for step in prof.steps(range(start, steps)):
                ...

    A disabled profiler (``runtime.profile_dir`` empty) does nothing.
    """

    def __init__(self, rt: RuntimeSection, first: int, is_main: bool = True,
                 process_index: int = 0, process_count: int = 1) -> None:
        """Checks the trace directory (created now, so that a bad one fails early).

        Args:
          rt: the ``runtime`` section of the config.
          first: the first (0-based) RL step this process runs.
          is_main: print where the trace went (the main process only).
          process_index: this process; with several processes each traces
            into its own ``process_<i>`` subdirectory.
          process_count: the number of processes.

        Raises:
          UsageError: ``runtime.profile_dir`` cannot be created or written.
        """
        self.start_at, self.stop_after = first + 1, first + rt.profile_steps
        self.is_main, self.active, self.done, self.last = is_main, False, False, first
        self.log_dir = check_profile_dir(rt) or ""
        if self.log_dir and process_count > 1:
            self.log_dir = os.path.join(self.log_dir, f"process_{process_index}")

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.active:
            try:
                self._stop()
            except Exception:  # never hide the error that ended the loop
                if exc_type is None:
                    raise
        elif self.log_dir and not self.done and exc_type is None and self.is_main:
            print("profiler: no RL step after the first (compiling) one ran; no trace written "
                  "(raise train.steps)", file=sys.stderr)

    def steps(self, loop: Iterable[int]) -> Iterator[int]:
        """The RL steps of ``loop``; starts, annotates and stops the trace around them as due.

        Args:
          loop: the 0-based RL steps this process runs (a range, or a progress bar over it).
        """
        for step in loop:
            if self.log_dir and not self.done and step == self.start_at:
                jax.profiler.start_trace(self.log_dir, create_perfetto_trace=True)
                self.active = True
            if not self.active:
                yield step
                continue
            with jax.profiler.StepTraceAnnotation("rl_step", step_num=step + 1):
                yield step
            self.last = step
            if step >= self.stop_after:
                self._stop()

    def _stop(self) -> None:
        self.active, self.done = False, True
        jax.profiler.stop_trace()
        if self.is_main:
            found = glob.glob(os.path.join(self.log_dir, "plugins", "profile", "*",
                                           "perfetto_trace.json.gz"))
            where = max(found, key=os.path.getmtime) if found else self.log_dir
            print(f"profiler trace of RL steps {self.start_at + 1}-{self.last + 1} written: "
                  f"{where} (open it at https://ui.perfetto.dev, or {self.log_dir} with "
                  "TensorBoard/XProf)", flush=True)
