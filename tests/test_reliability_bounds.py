"""Issue 39's input-validation rows: bad input ends as one line and exit 2 before any work.

Rows: 5 (YAML reader errors name file and position), 3 / 4 (size, count and step
bounds), 8 (float keys checked in float32), 7 (``plan`` sizes before tracing),
9 (``runtime.xla_flags``), 12 (messages), 14 (library API on empty or ill-typed
inputs).  The schema-driven property test is in tests/test_config_bounds.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from ais_jax.config.load import load_config
from ais_jax.core.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_arithmetic.yaml")


def _run(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    return err


# ----------------------------------------------------------------------------- row 1


def _tiny_base(path) -> None:
    """A tiny pretrained-style base directory (config.json, model.safetensors, tokenizer)."""
    from ais_jax.models.pretrained import save_pretrained
    from ais_jax.training.build import build_run

    r = build_run(load_config(None, [*MIN[:6], "sft.steps=0", f"out_dir={path}.unused"]))
    save_pretrained(r.state.params, r.model_cfg, str(path))
    r.codec.tokenizer.save(str(path))


def _other_same_shape_base(path) -> None:
    """Replace ``path/model.safetensors`` by another model of the same shapes (weights + 0.01)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    f = str(path / "model.safetensors")
    with safe_open(f, "np") as h:
        meta, w = h.metadata(), {k: h.get_tensor(k) for k in h.keys()}  # noqa: SIM118
    save_file({k: v + v.dtype.type(0.01) for k, v in w.items()}, f, metadata=meta)


def test_row1_base_digest_of_weight_files(tmp_path):
    from ais_jax.models import base_digest as bd

    a = tmp_path / "a"
    a.mkdir()
    (a / "model.safetensors").write_bytes(bytes(range(256)) * 20000)  # 5 MB: 3 slices hashed
    (a / "config.json").write_text("{}")
    d = bd.source_digest(str(a))
    assert d is not None and d.startswith("sha256:") and len(d) == 23
    b = tmp_path / "b"
    b.mkdir()
    (b / "model.safetensors").write_bytes((a / "model.safetensors").read_bytes())
    assert bd.source_digest(str(b)) == d  # the same weights elsewhere: the same base
    raw = bytearray((b / "model.safetensors").read_bytes())
    raw[len(raw) // 2] ^= 1  # one bit in the middle slice
    (b / "model.safetensors").write_bytes(bytes(raw))
    assert bd.source_digest(str(b)) != d
    assert bd.source_digest("scratch") is None and bd.source_digest(str(tmp_path / "x")) is None
    with pytest.raises(UsageError, match=r"trained on base sha256:1 but model.source s is "
                                         r"sha256:2; .* model.allow_base_change=true"):
        bd.check_same_base("sha256:1", "sha256:2", "cannot resume o", "s", False)
    bd.check_same_base("sha256:1", "sha256:2", "cannot resume o", "s", True)  # opted in
    bd.check_same_base(None, "sha256:2", "cannot resume o", "s", False)  # not recorded


@pytest.mark.slow  # builds a base, one 2-step LoRA run and one resumed step: ~60-90 s on 2 cores
def test_row1_lora_run_bound_to_its_base(tmp_path):
    from ais_jax.run.loop import run

    base, out = tmp_path / "B", tmp_path / "O"
    _tiny_base(base)
    lora_run = [*MIN, "lora.rank=4", "lora.alpha=8", f"model.source={base}"]
    run(load_config(TINY, [*lora_run, f"out_dir={out}"]))
    shutil.copytree(base, tmp_path / "A")  # the base it was trained on
    _other_same_shape_base(base)
    # a resume on the other base: one line naming both digests, exit 2
    proc = _run("ais_jax.train", "--config", TINY, *lora_run, f"out_dir={out}", "train.steps=3")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    from ais_jax.models.base_digest import source_digest

    was, now = source_digest(str(tmp_path / "A")), source_digest(str(base))
    assert was != now
    _one_line_exit_2(proc, f"cannot resume {out} from step 2", f"trained on base {was}",
                     f"model.source {base} is {now}", "model.allow_base_change=true")
    # the exported adapter loaded onto the other base: refused the same way
    adapter = out / "final" / "adapter"
    proc = _run("ais_jax.train", "--config", TINY, *lora_run, f"out_dir={tmp_path / 'O2'}",
                f"model.adapter={adapter}")
    _one_line_exit_2(proc, f"model.adapter {adapter}", f"trained on base {was}", now)
    # the user who means it
    res = run(load_config(TINY, [*lora_run, f"out_dir={out}", "train.steps=3",
                                 "model.allow_base_change=true"]))
    assert res.resumed_from == 2


# ----------------------------------------------------------------------------- row 5


@pytest.mark.parametrize("raw,where", [
    (b"seed: 0\x00\n", "line 1 column 8: character #x0000"),
    (b"seed: 0\nout_dir: \"a\x07b\"\n", "line 2 column 12: character #x0007"),
    (b"seed: 0\x1b\n", "line 1 column 8: character #x001b"),
])
def test_row5_reader_errors_name_file_and_position(tmp_path, raw, where):
    path = tmp_path / "bad.yaml"
    path.write_bytes(raw)
    with pytest.raises(UsageError) as e:
        load_config(str(path))
    msg = str(e.value)
    assert str(path) in msg and where in msg and "\n" not in msg, msg


def test_row5_reader_errors_cli_exit_2(tmp_path):
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"seed: 0\x00\n")
    _one_line_exit_2(_run("ais_jax.train", "--config", str(path), "--print-config"),
                     str(path), "line 1 column 8")
    _one_line_exit_2(_run("ais_jax.train", "--print-config", "seed=\x01"),
                     "override 'seed=\\x01'", "line 1 column 1")


# ----------------------------------------------------------------------------- rows 4 and 3

H = "99999999999999999999999"
MIN = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
       "model.head_dim=16", "model.intermediate_size=64", "sft.steps=0", "sft.target_accuracy=0",
       "task.eval_size=4", "eval.num_samples=1", "rollout.prompts_per_step=2",
       "rollout.group_size=2", "train.steps=2", "checkpoint.every=1", "log.tensorboard=false",
       "log.progress=false"]


@pytest.mark.parametrize("override", [
    f"train.warmup_steps={H}", f"train.rng_stream={H}", f"eval.num_samples={H}",
    f"train.epochs={H}", f"task.eval_size={H}", f"sft.batch_size={H}", "train.steps=2147483648",
    "checkpoint.every=2147483648", "mesh.data=2147483648",
])
def test_row4_int_keys_outside_int32_are_refused(override):
    with pytest.raises(UsageError, match="outside the int32 range"):
        load_config(TINY, [*MIN, override])


@pytest.mark.parametrize("overrides,needle", [
    (["rollout.prompts_per_step=65536", "rollout.group_size=65536"], "rows of an RL step"),
    (["rollout.prompts_per_step=4096", "rollout.group_size=4096", "rollout.max_new_tokens=256",
      "train.minibatches=1"], "tokens of an RL step"),
    (["task.eval_size=100000", "eval.num_samples=100000"], "evaluation samples"),
    (["train.steps=100000", "train.epochs=100000"], "optimizer updates"),
])
def test_row4_int32_products_are_refused(overrides, needle):
    with pytest.raises(UsageError, match=needle):
        load_config(TINY, [*MIN, *overrides])


def test_row4_cli_exit_2_before_any_work(tmp_path):
    out = tmp_path / "run"
    proc = _run("ais_jax.train", "--config", TINY, *MIN, f"out_dir={out}",
                f"train.warmup_steps={H}")
    _one_line_exit_2(proc, "train.warmup_steps", "int32")
    assert not out.exists()  # no checkpoint 0, nothing written


@pytest.mark.parametrize("overrides,needle", [
    (["task.eval_size=2000000000"], "task.eval_size or eval.num_samples"),
    (["sft.steps=1", "sft.batch_size=2000000000"], "sft.batch_size"),
    (["sft.steps=50", "sft.target_accuracy=0.5", "sft.check_size=2000000000"], "sft.check_size"),
    (["rollout.prompts_per_step=50000", "rollout.group_size=5000"], "rows of an RL step"),
    (["model.hidden_size=65536", "model.intermediate_size=65536", "model.num_layers=64"],
     "scratch-model parameters"),
])
def test_row3_sizes_against_memory(overrides, needle):
    from ais_jax.config.bounds import check_host_memory

    cfg = load_config(TINY, [*MIN, *overrides])
    with pytest.raises(UsageError, match=needle) as e:
        check_host_memory(cfg, memory=16 * 2**30)
    assert "16 GiB of memory" in str(e.value)
    check_host_memory(load_config(TINY, MIN), memory=16 * 2**30)  # the tiny run fits


def test_row3_sft_keys_unused_when_sft_is_off():
    from ais_jax.config.bounds import check_host_memory

    check_host_memory(load_config(TINY, [*MIN, "sft.batch_size=2000000000"]), memory=2**30)


def test_row3_cli_refuses_an_eval_size_beyond_memory_fast(tmp_path):
    out = tmp_path / "run"
    proc = _run("ais_jax.train", "--config", TINY, *MIN, f"out_dir={out}",
                "task.eval_size=2147483647", timeout=60)
    _one_line_exit_2(proc, "task.eval_size", "of memory")
    assert not out.exists()


# ----------------------------------------------------------------------------- row 6


@pytest.mark.parametrize("make,needle", [
    (lambda t: (os.symlink(t / "nowhere", t / "dangling"), t / "dangling")[1],
     "is a symbolic link to {t}/nowhere, which does not exist"),
    (lambda t: (os.symlink(t / "nowhere", t / "dangling"), t / "dangling" / "sub")[1],
     "{t}/dangling is a symbolic link to {t}/nowhere, which does not exist"),
    (lambda t: "/proc/x", "cannot create out_dir '/proc/x': No such file or directory"),
    (lambda t: ((t / "f").write_text(""), t / "f")[1], "is an existing file, not a directory"),
])
def test_row6_out_dir_path_errors_are_one_line(tmp_path, make, needle):
    out = make(tmp_path)
    proc = _run("ais_jax.train", "--config", TINY, *MIN, f"out_dir={out}")
    err = _one_line_exit_2(proc, f"out_dir {str(out)!r}", needle.format(t=tmp_path))
    assert "another out_dir" in err, err


# ----------------------------------------------------------------------------- row 8


@pytest.mark.parametrize("override,needle", [
    ("ais.gamma=1e-300", "below float32's smallest normal"),
    ("ais.delta=1e-39", "below float32's smallest normal"),
    ("ais.eps=1e300", "not finite in float32"),
    ("train.clip_norm=1e300", "not finite in float32"),
    ("train.learning_rate=1e-320", "below float32's smallest normal"),
    ("reward.timeout_s=1e39", "not finite in float32"),
])
def test_row8_float_keys_checked_in_float32(override, needle):
    with pytest.raises(UsageError, match=needle):
        load_config(TINY, [*MIN, override])


def test_row8_lora_alpha_refused_before_the_run(tmp_path):
    out = tmp_path / "run"
    proc = _run("ais_jax.train", "--config", TINY, *MIN, f"out_dir={out}", "lora.rank=4",
                "lora.alpha=1e308")
    _one_line_exit_2(proc, "lora.alpha", "float32")
    assert not out.exists()


# ----------------------------------------------------------------------------- row 7


@pytest.mark.parametrize("overrides,needle", [
    (["rollout.prompts_per_step=99999999999"], "rollout.prompts_per_step=99999999999 is outside"),
    (["model.hidden_size=99999999", "model.num_layers=999999"], "fits in no sharding"),
    (["rollout.max_new_tokens=2048", "rollout.prompts_per_step=4096", "rollout.group_size=64",
      "train.minibatches=1"], "the KV cache [L=3, 2, rows=262144, S=2304"),
])
def test_row7_plan_validates_sizes_before_tracing(overrides, needle):
    proc = _run("ais_jax.plan", "--config", TINY, *overrides, "--devices", "1", timeout=60)
    _one_line_exit_2(proc, needle)


def test_row7_plan_sizes_in_process():
    from ais_jax.run.plan import check_plan_sizes, load_plan_config, resolve_model_config

    cfg = load_plan_config(TINY, ["model.hidden_size=65536", "model.intermediate_size=65536",
                                  "model.num_layers=4096"])
    model_cfg = resolve_model_config(cfg)[0]
    with pytest.raises(UsageError, match=r"stacked MLP weights \[L=4096, D=65536, F=65536\]"):
        check_plan_sizes(cfg, model_cfg, 256, 8, 80 * 10**9)
    check_plan_sizes(cfg, model_cfg, 256, 8, 4 * 10**12)  # 32 TB: the weights fit, sharded
    cfg = load_plan_config(TINY, [])
    check_plan_sizes(cfg, resolve_model_config(cfg)[0], 256, 1, 80 * 10**9)  # the tiny run


# ----------------------------------------------------------------------------- row 9


@pytest.mark.parametrize("flags,needle", [
    ("--xla_bogus_flag=1", "Unknown flag in XLA_FLAGS: --xla_bogus_flag=1"),
    ("garbage", "'garbage' is not a flag"),
    ("--xla_cpu_enable_fast_math=maybe", "Couldn't interpret value maybe"),
])
def test_row9_xla_flags_refused_in_one_line(flags, needle):
    from ais_jax.config.schema import RuntimeSection
    from ais_jax.run.runtime import check_xla_flags

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    with pytest.raises(UsageError, match=r"runtime\.xla_flags") as e:
        check_xla_flags(RuntimeSection(xla_flags=flags), env)
    assert needle in str(e.value) and "\n" not in str(e.value)
    check_xla_flags(RuntimeSection(xla_flags="--xla_cpu_enable_fast_math=false"), env)


def test_row9_cli_exit_2_before_the_run(tmp_path):
    out = tmp_path / "run"
    proc = _run("ais_jax.train", "--config", TINY, *MIN, f"out_dir={out}",
                "runtime.xla_flags=--xla_bogus_flag=1")
    _one_line_exit_2(proc, "--xla_bogus_flag=1")
    assert not out.exists()


# ----------------------------------------------------------------------------- row 10


def test_row10_peft_duplicate_keys_for_one_module_refused(tmp_path):
    from _models import TINY
    from safetensors.numpy import load_file, save_file
    from test_lora import LC, _random_adapters

    from ais_jax.core.errors import CheckpointError
    from ais_jax.models import peft_io

    out = tmp_path / "ad"
    peft_io.save_peft_adapter(_random_adapters(TINY, LC), LC, TINY, out)
    f = out / peft_io.WEIGHTS_FILE
    w = load_file(f)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    dup = key.replace(".weight", ".default.weight")
    save_file({**w, dup: w[key] + 1.0}, f)  # two tensors for one module's lora_A
    with pytest.raises(CheckpointError) as e:
        peft_io.load_peft_adapter(out, TINY)
    msg = str(e.value)
    assert "\n" not in msg and f"{key!r} and {dup!r}" in msg and str(f) in msg, msg
    assert "keep one of them" in msg, msg


# ----------------------------------------------------------------------------- rows 2 and 11


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A finished tiny run with checkpoints 1 and 2 (and their checksum files)."""
    from ais_jax.run.integrity import CHECKSUMS
    from ais_jax.run.loop import run

    first = tmp_path_factory.mktemp("rows2_11") / "first"
    run(load_config(TINY, [*MIN, f"out_dir={first}"]))
    assert (first / "checkpoints" / "2" / CHECKSUMS).exists()
    return first


def _resume(first, out, capsys, *extra: str):
    """Resume a copy ``out`` of ``first`` for one more step: (resumed step, stderr)."""
    from ais_jax.run.loop import run

    capsys.readouterr()
    res = run(load_config(TINY, [*MIN, f"out_dir={out}", "train.steps=3", *extra]))
    return res.resumed_from, capsys.readouterr().err


@pytest.mark.slow  # a 2-step run (shared) and two resumed steps of the tiny model: ~40-60 s
def test_row2_step_without_checksums_is_not_resumed(two_step_run, tmp_path, capsys):
    """A step finalized without its checksum file (a save cut short by a second signal, row 2;
    the file deleted, row 11) is unverified: moved aside unless the user opts in."""
    from ais_jax.run.integrity import CHECKSUMS

    for name in ("nosum", "optin"):
        shutil.copytree(two_step_run, tmp_path / name)
        os.remove(tmp_path / name / "checkpoints" / "2" / CHECKSUMS)
    step, err = _resume(two_step_run, tmp_path / "nosum", capsys)
    assert step == 1, err
    assert f"has no {CHECKSUMS}" in err and "checkpoint.allow_unverified=true" in err, err
    assert (tmp_path / "nosum" / "checkpoints.unrestorable" / "2").is_dir()
    step, _ = _resume(two_step_run, tmp_path / "optin", capsys, "checkpoint.allow_unverified=true")
    assert step == 2  # the user accepts it unverified


@pytest.mark.slow  # a 2-step run (shared) and one resumed step of the tiny model: ~20-40 s
def test_row11_copied_step_directory_is_not_resumed(two_step_run, tmp_path, capsys):
    shutil.copytree(two_step_run, tmp_path / "copied")
    ck = tmp_path / "copied" / "checkpoints"
    shutil.rmtree(ck / "2")
    shutil.copytree(ck / "1", ck / "2")  # checkpoints/1 copied over checkpoints/2
    step, err = _resume(two_step_run, tmp_path / "copied", capsys)
    assert step == 1 and "holds the files of step 1" in err, err


def test_row11_checksum_file_names_its_step(tmp_path):
    from ais_jax.core.errors import CheckpointError
    from ais_jax.run import integrity

    for n in (3, 4):
        (tmp_path / str(n)).mkdir()
        (tmp_path / str(n) / "f").write_bytes(b"x")
    integrity.write_checksums(str(tmp_path / "3"))
    integrity.verify_checksums(str(tmp_path / "3"))
    integrity.check_verifiable(str(tmp_path / "3"), False)
    with pytest.raises(CheckpointError, match=r"has no ais_jax_checksums\.json"):
        integrity.check_verifiable(str(tmp_path / "4"), False)
    integrity.check_verifiable(str(tmp_path / "4"), True)  # opted in
    shutil.copy(tmp_path / "3" / integrity.CHECKSUMS, tmp_path / "4")
    with pytest.raises(CheckpointError, match=r"4 holds the files of step 3 \(a copied step"):
        integrity.verify_checksums(str(tmp_path / "4"))


# ----------------------------------------------------------------------------- row 12


@pytest.mark.parametrize("override,needle", [
    ("task.difficulty.digits=abc", "task.difficulty.digits='abc' must be an int for task "
     "arithmetic (default 2); e.g. task.difficulty.digits=2"),
    ("task.difficulty.ops=3", "task.difficulty.ops=3 must be a str for task arithmetic"),
])
def test_row12_difficulty_value_of_the_wrong_type(override, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_config(TINY, [override])
    load_config(TINY, ["task.difficulty.digits=3"])  # the right type passes


def test_row12_dataset_answer_beyond_float64_names_the_line(tmp_path):
    pytest.importorskip("datasets")
    from ais_jax.tasks.user_dataset import load_rows

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "answer": 2}\n{"prompt": "b", "answer": 1e999}\n')
    with pytest.raises(UsageError, match=re.escape(
            f"{data}:2: the number 1e999 is beyond float64's range; quote it"
            ' ("1e999") to keep it as text, or use a smaller number')):
        load_rows(str(data))


@pytest.mark.slow  # ~5 s in the full suite on 2 busy cores
def test_row12_mismatch_binary_prompts_file_names_it(tmp_path):
    data = tmp_path / "p.txt"
    data.write_bytes(b"\x00\x01\xff\xfe binary")
    proc = _run("ais_jax.mismatch", "--model", "random:tiny", "--prompts", str(data),
                "--samples", "1", "--max-new-tokens", "2")
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"prompts file {data} is not UTF-8 text" in err and "one prompt per line" in err, err


@pytest.mark.parametrize("arg,needle", [
    ("=runs/x", "'=runs/x' has no label before '='; pass runs/x, or LABEL=runs/x"),
    ("a=", "'a=' has no directory after '='; pass LABEL=DIR"),
])
def test_row12_plots_empty_label_or_dir(arg, needle):
    for extra in ([], ["--out", "/nonexistent-plots"]):
        _one_line_exit_2(_run("ais_jax.plots", arg, *extra), needle)


def test_row12_overwrite_after_an_override(tmp_path):
    proc = _run("ais_jax.train", "--config", TINY, "seed=1", "--overwrite", "seed=3",
                "--print-config")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "seed: 3" in proc.stdout


# ----------------------------------------------------------------------------- row 13


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_row13_reward_calling_os_exit_is_reported(tmp_path):
    rw = tmp_path / "rw.py"
    rw.write_text("import os\ndef fn(c, p, row):\n    os._exit(0)\n")
    out = tmp_path / "run"
    proc = _run("ais_jax.train", "--config", TINY, *MIN, "train.steps=1", f"out_dir={out}",
                f"reward.functions={{r: {rw}:fn}}")
    _one_line_exit_2(proc, "reward function r called os._exit(", "return a number")
    assert not (out / "run.lock").exists()


def test_row13_exit_guard_in_process_and_restored():
    from ais_jax.tasks.base import Problem
    from ais_jax.tasks.user_rewards import UserReward, score_rewards

    real = os._exit
    with pytest.raises(UsageError, match=r"reward function q called os._exit\(5\)"):
        score_rewards([UserReward("q", lambda c, p, row: os._exit(5))], ["x"],
                      [Problem("0", "p", "1", {})])
    with pytest.raises(UsageError, match=r"reward function b called os._exit\(7\)"):
        score_rewards([UserReward("b", lambda cs, ps, rows: os._exit(7), batched=True)], ["x"],
                      [Problem("0", "p", "1", {})])
    assert os._exit is real  # the guard is gone after the calls


# ----------------------------------------------------------------------------- row 14


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)])
def test_row14_zero_size_inputs_give_alpha_0_weights_1(shape):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ais_jax.method.ais import ais_coefficient
    from ais_jax.method.corrections import CORRECTION_MODES, correction_weights

    z, zm = jnp.zeros(shape, jnp.float32), jnp.zeros(shape, bool)
    r = jax.jit(ais_coefficient)(z, z, z, zm)
    assert float(r.alpha) == 0.0 and float(r.num_valid) == 0.0 and r.weights.shape == shape
    for mode in CORRECTION_MODES:
        c = jax.jit(lambda a, b, d, m, mode=mode: correction_weights(a, b, d, m, mode=mode))(
            z, z, z, zm)
        assert c.weights.shape == c.advantages.shape == shape, mode
        stats = {k: float(v) for k, v in c.stats().items()}
        assert all(np.isfinite(list(stats.values()))), (mode, stats)
        assert stats["num_valid"] == 0.0, mode


@pytest.mark.slow  # ~4 s in the full suite on 2 busy cores
def test_row14_all_masked_gives_alpha_0_weights_1():
    import jax.numpy as jnp
    import numpy as np

    from ais_jax.method.ais import ais_coefficient
    from ais_jax.method.corrections import correction_weights

    lt = jnp.asarray([[-1.0, 3.0], [0.5, -9.0]])
    lr, adv, mask = jnp.zeros((2, 2)), jnp.ones((2, 2)), jnp.zeros((2, 2), bool)
    r = ais_coefficient(lt, lr, adv, mask)
    assert float(r.alpha) == 0.0 and np.all(np.asarray(r.weights) == 1.0)
    c = correction_weights(lt, lr, adv, mask, mode="tis")
    assert np.all(np.asarray(c.advantages) == 0.0)


@pytest.mark.parametrize("kwargs,needle", [
    ({"use_ess": "no"}, "use_ess='no' must be a bool"),
    ({"use_mis": 0}, "use_mis=0 must be a bool"),
    ({"use_var": None}, "use_var=None must be a bool"),
])
def test_row14_non_bool_flags_refused(kwargs, needle):
    import jax.numpy as jnp

    from ais_jax.method.ais import ais_coefficient
    from ais_jax.method.corrections import correction_weights

    x, m = jnp.zeros((2, 3)), jnp.ones((2, 3), bool)
    with pytest.raises(ValueError, match=f"ais_coefficient: {needle}"):
        ais_coefficient(x, x, x, m, **kwargs)
    with pytest.raises(ValueError, match=f"correction_weights: {needle}"):
        correction_weights(x, x, x, m, **kwargs)


def test_row14_mask_of_strings_is_a_value_error():
    import jax.numpy as jnp
    import numpy as np

    from ais_jax.method.ais import ais_coefficient
    from ais_jax.method.corrections import correction_weights

    x = jnp.zeros((1, 2))
    for mask in (np.array([["a", "b"]]), [["a", "b"]]):
        with pytest.raises(ValueError, match="ais_coefficient: mask must be a bool or numeric"):
            ais_coefficient(x, x, x, mask)
        with pytest.raises(ValueError, match="correction_weights: mask must be a bool or numer"):
            correction_weights(x, x, x, mask)


def test_row2_a_second_signal_during_a_save_waits_for_the_save():
    """Issue 39 row 2: the second SIGTERM used to end the process inside a checkpoint save
    (a finalized step without its checksum file); now it waits for the save's end, then stops
    with the same status; outside a save it still stops at once."""
    import signal

    from ais_jax.run.signals import StopFlag

    flag = StopFlag()
    flag._handle(signal.SIGTERM, None)  # the first signal: stop at a safe point
    done = []
    with pytest.raises(SystemExit) as e, flag.saving():
        flag._handle(signal.SIGTERM, None)  # the second, mid-save: deferred
        done.append("save finished")
    assert done == ["save finished"] and e.value.code == 143
    with pytest.raises(SystemExit) as e:  # not saving: at once
        flag._handle(signal.SIGTERM, None)
    assert e.value.code == 143
    # a save that fails keeps its own error
    with pytest.raises(ValueError, match="disk"), flag.saving():
        flag._handle(signal.SIGTERM, None)
        raise ValueError("disk")
    flag = StopFlag()
    flag._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt), flag.saving():
        flag._handle(signal.SIGINT, None)
    with flag.saving():  # no second signal: nothing happens
        pass
