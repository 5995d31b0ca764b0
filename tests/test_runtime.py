"""Tests of ais_jax.run.runtime: the persistent compilation cache and the profiler trace.

The tests point JAX's (process-global) compilation cache at temporary
directories and put the previous setting back afterwards.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from _tiny import TINY_RUN
from jax.experimental.compilation_cache import compilation_cache

from ais_jax.config.load import load_config
from ais_jax.config.schema import DEFAULT_COMPILE_CACHE, RuntimeSection
from ais_jax.core.errors import UsageError
from ais_jax.run import cli as train
from ais_jax.run import runtime

TINY = [*TINY_RUN, "checkpoint.every=0"]
_FLAGS = ("jax_compilation_cache_dir", *runtime._THRESHOLDS)
# JAX's own threshold variable: the suite sets it (tests/conftest.py), and it wins over a run's
SUITE_THRESHOLD = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


@pytest.fixture(autouse=True)
def restore_jax_cache_config():
    """Puts JAX's compilation-cache settings back after each test."""
    saved = {name: getattr(jax.config, name) for name in _FLAGS}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def _error(overrides):
    with pytest.raises(UsageError) as info:
        load_config(None, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("override,needle", [
    ("runtime.profile_steps=0", "runtime.profile_steps must be >= 1"),
    ("runtime.profile_steps=abc", "runtime.profile_steps must be an int"),
    ("runtime.compile_cache=[1]", "runtime.compile_cache must be a str"),
    ("runtime.profile_dir=3", "runtime.profile_dir must be a str"),
    ("runtime.profile_step=3", "did you mean 'runtime.profile_steps'"),
])
def test_bad_runtime_keys_are_usage_errors(override, needle):
    assert needle in _error([override])


def test_defaults_and_resolution(tmp_path):
    rt = load_config(None).runtime
    assert rt == RuntimeSection() and rt.compile_cache == DEFAULT_COMPILE_CACHE
    assert rt.profile_dir == "" and rt.profile_steps == 3
    home = os.path.expanduser(DEFAULT_COMPILE_CACHE)
    assert runtime.resolve_compile_cache(rt, {}) == (home, "default")
    env = {runtime.CACHE_ENV: str(tmp_path / "env")}
    assert runtime.resolve_compile_cache(rt, env) == (str(tmp_path / "env"), runtime.CACHE_ENV)
    explicit = RuntimeSection(compile_cache=str(tmp_path / "mine"))  # beats the variable
    assert runtime.resolve_compile_cache(explicit, env) == (str(tmp_path / "mine"),
                                                            "runtime.compile_cache")
    for off in ("", "none", "off", "OFF"):
        assert runtime.resolve_compile_cache(RuntimeSection(compile_cache=off), env)[0] is None
    # the value "none" parses as a string (YAML's null spelling is "null")
    assert load_config(None, ["runtime.compile_cache=none"]).runtime.compile_cache == "none"


def test_setup_writes_the_cache_and_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.delenv(SUITE_THRESHOLD, raising=False)  # what a user gets
    cache = tmp_path / "cache"
    assert runtime.setup(RuntimeSection(compile_cache=str(cache))) == str(cache)
    assert jax.config.jax_compilation_cache_dir == str(cache)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    jax.jit(lambda x: jnp.sin(x) * 3.0 + x)(jnp.arange(7.0)).block_until_ready()
    assert [p for p in os.listdir(cache) if p.endswith("-cache")]
    assert runtime.setup(RuntimeSection(compile_cache="none")) is None
    assert jax.config.jax_compilation_cache_dir is None
    # JAX's own variable wins: the run leaves the threshold it set alone
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    runtime.setup_compile_cache(RuntimeSection(compile_cache=str(cache)),
                                {SUITE_THRESHOLD: "1.0"})
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0


def test_bad_directories(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    bad = str(blocker / "cache")
    with pytest.raises(UsageError, match=r"runtime\.compile_cache .*set runtime\.compile_cache"):
        runtime.setup_compile_cache(RuntimeSection(compile_cache=bad), {})
    with pytest.raises(UsageError, match="JAX_COMPILATION_CACHE_DIR"):
        runtime.setup_compile_cache(RuntimeSection(), {runtime.CACHE_ENV: bad})
    with pytest.raises(UsageError, match=r"runtime\.profile_dir"):
        runtime.setup(RuntimeSection(compile_cache="none", profile_dir=bad))
    # An unwritable default (a read-only home) only turns the cache off.
    monkeypatch.setenv("HOME", str(blocker))
    assert runtime.setup_compile_cache(RuntimeSection(), {}) is None
    assert "running without it" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["runtime.compile_cache", "runtime.profile_dir"])
def test_cli_bad_directory_exits_2_naming_the_key(key, tmp_path, capsys):
    (tmp_path / "f").write_text("")
    code = train.main([f"out_dir={tmp_path / 'run'}", *TINY, f"{key}={tmp_path / 'f' / 'x'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: {key} ")


_PROBE = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax._src import monitoring
    from ais_jax.run import runtime
    from ais_jax.config.schema import RuntimeSection
    hits = []
    monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
    runtime.setup(RuntimeSection(compile_cache=sys.argv[1]))
    jax.jit(lambda x: jnp.cos(x) @ x.T + 1.0)(jnp.ones((5, 5))).block_until_ready()
    print(len(hits))
""")


def test_second_process_hits_the_cache(tmp_path):
    env = dict(os.environ)  # without the suite's threshold (tests/conftest.py): the run's own
    env.pop(SUITE_THRESHOLD, None)

    def probe():
        out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "cache")],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    assert probe() == 0  # a cold cache: compiled and written
    assert probe() >= 1  # a warm cache: loaded


def test_trace_is_stopped_when_a_step_fails(tmp_path, capsys):
    rt = RuntimeSection(profile_dir=str(tmp_path / "prof"), profile_steps=5)
    f = jax.jit(lambda x: x * 2.0)
    with pytest.raises(RuntimeError, match="boom"), runtime.StepProfiler(rt, first=0) as prof:
        for step in prof.steps(range(10)):
            f(jnp.ones(3)).block_until_ready()
            if step == 2:
                raise RuntimeError("boom")
    assert not prof.active and glob.glob(str(tmp_path / "prof" / "**" / "*.xplane.pb"),
                                         recursive=True)
    jax.profiler.start_trace(str(tmp_path / "again"))  # no trace is left running
    jax.profiler.stop_trace()
    with runtime.StepProfiler(rt, first=4) as prof:  # one step: nothing to trace
        list(prof.steps(range(4, 5)))
    assert not prof.done and "no trace written" in capsys.readouterr().err


@pytest.mark.slow  # ~15 s in the full suite on 2 busy cores
def test_profiled_cli_run_writes_a_trace_and_the_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SUITE_THRESHOLD, raising=False)  # what a user gets
    out, cache = tmp_path / "run", tmp_path / "cache"
    code = train.main([f"out_dir={out}", *TINY, "train.steps=3", "runtime.profile_steps=1",
                       f"runtime.compile_cache={cache}", "--profile"])
    assert code == 0, capsys.readouterr().err
    assert "profiler trace of RL steps 2-2 written" in capsys.readouterr().out
    runs = glob.glob(str(out / "profile" / "plugins" / "profile" / "*"))
    assert len(runs) == 1
    names = os.listdir(runs[0])
    assert "perfetto_trace.json.gz" in names
    assert any(n.endswith(".xplane.pb") for n in names)
    assert any(n.endswith(".trace.json.gz") for n in names)
    assert len([p for p in os.listdir(cache) if p.endswith("-cache")]) >= 2
    with open(out / "metrics.jsonl") as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 2, 3]


def test_xla_flags_are_appended_before_the_backend_starts_and_refused_after(monkeypatch):
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert runtime.apply_xla_flags(RuntimeSection(), env) == "--xla_dump_to=/tmp/x"
    jax.devices()  # this test process's backend has started: flags would be ignored
    with pytest.raises(UsageError, match="backend already started"):
        runtime.apply_xla_flags(RuntimeSection(xla_flags="--xla_cpu_enable_fast_math=false"),
                                env)
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    out = runtime.apply_xla_flags(RuntimeSection(xla_flags=" --a=1 "), env)
    assert out == env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --a=1"
    assert runtime.apply_xla_flags(RuntimeSection(xla_flags="--b=2"), {}) == "--b=2"


def test_xla_flags_reach_a_fresh_process():
    code = textwrap.dedent("""
        import os
        from ais_jax.config.schema import RuntimeSection
        from ais_jax.run import runtime
        runtime.apply_xla_flags(RuntimeSection(xla_flags="--xla_cpu_enable_fast_math=false"))
        import jax
        print(os.environ["XLA_FLAGS"], jax.numpy.ones(2).sum())
    """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--xla_cpu_enable_fast_math=false", "2.0"]
