"""Helper run in a subprocess by test_train.py: collectives inside the compiled decode loops.

``python _rollout_collectives.py tensor token`` prints one JSON line mapping
each activation-scaling mode to, for each sampler `while` loop of the rollout
program on a 2-device `fsdp` mesh, the number of all-gather and all-reduce
instructions in its body (and everything the body calls).
"""

import json
import re
import sys

import jax
import jax.numpy as jnp

from ais_jax.config.load import load_config
from ais_jax.models.model import ModelConfig, init_params
from ais_jax.training import optim, steps
from ais_jax.training import sharding as shd


def loops_of(act_scaling: str) -> list[dict[str, int]]:
    mc = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16)
    cfg = load_config(None, ["rollout.group_size=2", "rollout.max_new_tokens=4",
                             f"rollout.act_scaling={act_scaling}"])
    params = init_params(jax.random.key(0), mc)
    opt = optim.make_optimizer(1e-3)
    state = optim.init_train_state(params, opt)
    fns = steps.build_step_fns(state, shd.make_mesh(1, 2, 1), opt, None, mc, cfg,
                               steps.TokenIds((), None))
    state = jax.device_put(state, fns.state_shardings)
    pt, pm = jnp.ones((4, 8), jnp.int32), jnp.ones((4, 8), bool)
    hlo = fns.rollout.lower(state.params, pt, pm, jax.random.key(1)).compile().as_text()
    comps: dict[str, list[str]] = {}
    cur = None
    for line in hlo.split("\n"):
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m:
            cur = m.group(1)
            comps[cur] = []
        elif cur is not None:
            comps[cur].append(line)
    pat = r"(?:body|condition|calls|to_apply|branch_computations)=\{?%?([\w.\-]+)"
    calls = {k: set(re.findall(pat, "\n".join(v))) for k, v in comps.items()}

    def reach(c: str, seen: set[str]) -> set[str]:
        for d in calls.get(c, ()):
            if d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    loops = []
    for line in hlo.split("\n"):
        if " while(" in line and "_sample_impl)/while" in line:
            body = re.search(r"body=%([\w.\-]+)", line).group(1)
            lines = [x for n in reach(body, {body}) for x in comps.get(n, [])]
            loops.append({"all_gather": sum("all-gather" in x for x in lines),
                          "all_reduce": sum("all-reduce" in x for x in lines),
                          "ops": len(lines)})
    return loops


if __name__ == "__main__":
    print(json.dumps({a: loops_of(a) for a in sys.argv[1:]}))
