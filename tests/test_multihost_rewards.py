"""A reward that differs between the processes of a run is refused on all of them (issue 37
item 5): real 2-process runs (2 processes x 2 CPU devices, a loopback coordinator), bounded."""

from __future__ import annotations

from test_multihost import MIN, _assert_one_line_exit_2, _pair


def test_a_reward_that_depends_on_the_host_stops_every_process_with_one_line(tmp_path):
    fn = tmp_path / "host_reward.py"
    fn.write_text("import os\n\n\ndef by_process(completion, prompt, row):\n"
                  "    return float(os.environ['AIS_JAX_PROCESS_ID'])\n")
    d = tmp_path / "run"
    # mesh over all 4 devices (the default mesh is being fixed for 2 processes: issue 37 item 6)
    out, elapsed = _pair([d, d], *MIN, "mesh.data=1", "mesh.fsdp=4", "rollout.prompts_per_step=4",
                         f"reward.functions.host={fn}:by_process", timeout=240)
    _assert_one_line_exit_2(out, elapsed, contains="the rewards of this step differ between "
                            "processes (process 0 and process(es) [1]")
