"""The TPU compiler's price of compiled HLO: estimated cycles and a per-instruction roofline.

Helpers of ``benchmarks/deviceless_cost.py`` (pure text, no jax), on top of
`_hlo_stats.parse_hlo`:

* `cycles`: the sum of the ``estimated_cycles`` the TPU compiler writes into the backend config
  of every kernel-level instruction (fusions, copies, converts, pads ... of the computations a
  program runs, not those nested in a fusion), each ``while`` body times its known trip count
  (once when unknown), a ``conditional`` at its most expensive branch.  The compiler's cost
  model is dtype-aware (an int8 convolution is priced at the MXU's int8 rate).
* `roofline`: HloCostAnalysis's model rebuilt per kernel-level instruction, with the same loop
  multiplication and custom calls priced at 0 (``compiled.cost_analysis()`` counts each loop
  body once and a custom call at -1 s): FLOPs (2 x output x contraction for a ``dot`` /
  ``convolution``, one per output element for other arithmetic, per input element for a
  ``reduce``) and bytes (operands read + result written; a fusion operand that is only sliced
  inside counts its slices), time ``max(flops / peak, bytes / bandwidth)`` per instruction.
  One flop rate for every dtype, on-chip (VMEM) traffic charged as HBM traffic, no launch
  overhead and no interconnect: a bound, not a prediction.
* `flash_cost`: the one custom call priced, JAX's Pallas TPU flash / splash attention
  (``custom_call_target="tpu_custom_call"`` whose name or ``op_name`` names the kernel):
  q ``[..., N, Tq, D]`` (the first floating-point operand; a splash kernel's integer block
  tables come before it), k ``[..., Tk, D]`` (the second); FLOPs ``c x B x N x Tq x Tk x D``
  with ``c`` = 4 forward (``QK^T``, ``PV``), 8 for the ``dkv`` backward kernel (scores and
  ``dP`` recomputed, ``dV``, ``dK``), 6 for ``dq`` (scores, ``dP``, ``dQ``), every block
  counted (causal skipping not credited: the mask is inside the serialized kernel); bytes =
  its operands + results, each once (the kernel re-reads k / v once per query block: a lower
  bound on its traffic).  Its own ``estimated_cycles`` is absent (cycles 0).  Any other custom
  call (another Mosaic kernel, a host call) stays at 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import _hlo_stats as hs
from _hlo_weights import array_bytes, arrays

_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_CONTRACT = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_GROUPS = re.compile(r"feature_group_count=(\d+)")
# Instructions that read or write nothing themselves (views, tuples, control flow).
_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
               "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
               "while", "call", "conditional", "async-start", "async-update", "async-done",
               "custom-call"}
_SLICES = {"slice", "dynamic-slice", "gather"}  # read only what they select
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_NO_FLOPS = {"copy", "copy-start", "copy-done", "broadcast", "reshape", "transpose", "slice",
             "dynamic-slice", "dynamic-update-slice", "pad", "concatenate", "iota", "gather",
             "scatter", "reverse", "select", "slice-start", "slice-done", "convert",
             "bitcast-convert", "sort", "fusion", *(_NO_TRAFFIC)}

# generation: (device kind, dense BF16 FLOP/s per device, HBM bytes/s per device, clock Hz);
# the vendors' pages (cloud.google.com/tpu/docs/v5e, v6e, v5p, tpu7x).  A tpu7x chip is two
# devices: half the chip's 2307 TFLOP/s and 7.37 TB/s each.  The clocks are inferred (peak /
# the MXUs' multiply-adds per cycle: v5e 4 x 128 x 128, v6e 4 x 256 x 256, v5p 4 x 128 x 128
# per core x 2 cores, tpu7x as v6e per core) and only turn cycles into seconds.
CHIPS = {"v5e": ("TPU v5 lite", 197e12, 819e9, 1.5e9),
         "v6e": ("TPU v6 lite", 918e12, 1640e9, 1.75e9),
         "v5p": ("TPU v5", 459e12, 2765e9, 1.75e9),
         "tpu7x": ("TPU7x", 1153.5e12, 3685e9, 2.2e9)}


_FLASH = (("flash_mha_bwd_dkv", 8.0), ("flash_mha_bwd_dq", 6.0), ("flash_attention", 4.0),
          ("splash_mha_dkv", 8.0), ("splash_mha_dq", 6.0), ("splash_mha_fwd", 4.0),
          ("splash_mqa_dkv", 8.0), ("splash_mqa_dq", 6.0), ("splash_mqa_fwd", 4.0))
_FLOAT = re.compile(r"^(bf16|f16|f32)\[")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def flash_cost(ins: hs.Instr, types: dict[str, str]) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a Pallas TPU flash-attention custom call by its own roofline (the
    module doc's rule), None for any other instruction."""
    if ins.opcode != "custom-call" or 'custom_call_target="tpu_custom_call"' not in ins.attrs:
        return None
    m = _OP_NAME.search(ins.attrs)
    label = ins.name + " " + (m.group(1) if m else "")
    c = next((c for key, c in _FLASH if key in label), None)
    floats = [o for o in ins.operands if _FLOAT.match(types.get(o, ""))]
    if c is None or len(floats) < 2:
        return None
    q, k = (_dims(types.get(o, "")) for o in floats[:2])
    if len(q) < 3 or len(k) < 2:
        return None
    flops = c * _prod(q) * k[-2]  # c x (B x N x Tq x D) x Tk
    return flops, array_bytes(ins.type) + sum(array_bytes(types.get(o, "")) for o in ins.operands)


def instr_cycles(ins: hs.Instr) -> int:
    """The compiler's ``estimated_cycles`` of one instruction (0 when it has none)."""
    m = _CYCLES.search(ins.attrs)
    return int(m.group(1)) if m else 0


@dataclass
class Priced:
    """One kernel-level instruction with its price per run of the program.

    ``runs``: how often the program runs it (loop trip counts multiplied); ``cycles``,
    ``flops``, ``bytes`` per run."""

    name: str
    opcode: str
    type: str
    runs: int
    cycles: int
    flops: float
    bytes: float


def _dims(typ: str) -> tuple[int, ...]:
    a = arrays(typ)
    return a[0][1] if a else ()


def _prod(xs: tuple[int, ...] | list[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _gemm_flops(ins: hs.Instr, types: dict[str, str]) -> float:
    out = _prod(_dims(ins.type))
    if ins.opcode == "dot":
        lhs = _dims(types.get(ins.operands[0], ""))
        m = _CONTRACT.search(ins.attrs)
        idx = [int(x) for x in m.group(1).split(",") if x] if m else []
        return 2.0 * out * _prod([lhs[i] for i in idx if i < len(lhs)])
    kernel = _dims(types.get(ins.operands[1], "")) if len(ins.operands) > 1 else ()
    m = _LABELS.search(ins.attrs)
    if not m or len(m.group(2)) != len(kernel):
        return 2.0 * out
    # the kernel's input features (per group) times the valid taps of its window: TPU HLO
    # writes a batched matmul as a convolution whose batch dims are windows over an input
    # dilated by the window size, or over a padded input of size 1 (one valid tap per
    # output either way), so taps = min(ceil(size / lhs_dilate), the input's spatial size)
    k = _prod([d for lab, d in zip(m.group(2), kernel, strict=True) if lab == "i"])
    w = _WINDOW.search(ins.attrs)
    field = dict(re.findall(r"(\w+)=([\dx_]+)", w.group(1))) if w else {}
    sizes = [int(x) for x in field.get("size", "").split("x") if x]
    dil = [int(x) for x in field.get("lhs_dilate", "").split("x") if x] or [1] * len(sizes)
    lhs = _dims(types.get(ins.operands[0], ""))
    spatial = {lab: d for lab, d in zip(m.group(1), lhs, strict=False) if lab.isdigit()}
    taps = _prod([min(-(-s // d), spatial.get(str(i), s))
                  for i, (s, d) in enumerate(zip(sizes, dil, strict=False))])
    return 2.0 * out * k * taps


def fused_flops(mod: hs.HloModule, comp: str, seen: tuple[str, ...] = ()) -> float:
    """FLOPs of one run of a (fused) computation: dots / convolutions exactly, other
    arithmetic one per output element, a reduce one per input element."""
    if comp in seen:
        return 0.0
    types = hs._types(mod, comp)
    total = 0.0
    for ins in mod.computations.get(comp, []):
        if ins.opcode in ("dot", "convolution"):
            total += _gemm_flops(ins, types)
        elif ins.opcode == "fusion":
            total += fused_flops(mod, (ins.called().get("calls") or ("",))[0], (*seen, comp))
        elif ins.opcode in ("reduce", "reduce-window"):
            total += sum(_prod(_dims(types.get(o, ""))) for o in ins.operands[:1])
        elif ins.opcode not in _NO_FLOPS and not ins.opcode.endswith("-done"):
            total += _prod(_dims(ins.type))
    return total


def _traffic(mod: hs.HloModule, ins: hs.Instr, types: dict[str, str]) -> float:
    """Bytes a kernel reads and writes: each operand's size and the result's, except a fusion
    parameter used only by slices (through bitcasts) counts those slices, and one used only as
    the buffer of dynamic-update-slices (updated in place) counts the updates, not itself or
    its share of the result."""
    inner = mod.computations.get((ins.called().get("calls") or ("",))[0], []) \
        if ins.opcode == "fusion" else []
    params = {int(i.operands[0]): i.name for i in inner
              if i.opcode == "parameter" and i.operands and i.operands[0].isdigit()}
    users: dict[str, list[hs.Instr]] = {}
    for i in inner:
        for o in i.operands:
            users.setdefault(o, []).append(i)

    def through(name: str, ops: set[str], depth: int = 0) -> list[hs.Instr] | None:
        """The users of ``name`` (seen through bitcasts) if all are ``ops`` taking it as
        their first operand, else None."""
        us = users.get(name, [])
        if not us or depth > 4:
            return None
        found: list[hs.Instr] = []
        for u in us:
            if u.opcode in ops and u.operands[0] == name:
                found.append(u)
            elif u.opcode == "bitcast" and (sub := through(u.name, ops, depth + 1)) is not None:
                found += sub
            else:
                return None
        return found

    itypes = {i.name: i.type for i in inner}
    total = array_bytes(ins.type)
    for k, o in enumerate(ins.operands):
        full = array_bytes(types.get(o, ""))
        if k in params and (s := through(params[k], _SLICES)) is not None:
            total += sum(array_bytes(u.type) for u in s)
        elif k in params and (d := through(params[k], {"dynamic-update-slice"})) is not None:
            # updated in place: the result holds this buffer; only the updates move
            total += sum(array_bytes(itypes.get(u.operands[1], "")) for u in d) - full
        else:
            total += full
    return max(total, 0.0)


def _instr_traffic(mod: hs.HloModule, ins: hs.Instr, types: dict[str, str]) -> float:
    """`_traffic` of a kernel-level instruction; an unfused dynamic-update-slice moves its
    update twice (in place), an async ``*-start`` (a copy or slice into on-chip memory) its
    result twice (element 1 of its tuple), ``*-done`` and custom calls nothing."""
    if ins.opcode in _NO_TRAFFIC or ins.opcode.endswith("-done"):
        return 0.0
    if ins.opcode == "dynamic-update-slice":
        return 2.0 * array_bytes(types.get(ins.operands[1], ""))
    if ins.opcode.endswith("-start"):
        parts = hs._split_top(re.sub(r"\{[^{}]*\}", "", ins.type).strip()[1:-1])
        return 2.0 * array_bytes(parts[1]) if len(parts) > 1 else 0.0
    return _traffic(mod, ins, types)


def infer_trip_count(mod: hs.HloModule, comp: str, loop: hs.Instr) -> int | None:
    """A ``while``'s trip count when its backend config has none (the TPU compiler writes none):
    a condition whose ROOT is ``compare(get-tuple-element(param, k), constant N),
    direction=LT`` with element ``k`` of the loop's initial tuple a constant ``c`` (or not a
    constant: taken as 0) counts ``N - c`` iterations (a scan's counter steps by one); any
    other condition (a decode loop's "rows left") gives None."""
    cond = (loop.called().get("condition") or ("",))[0]
    instrs = {i.name: i for i in mod.computations.get(cond, [])}
    root = mod.computations.get(cond, [])[-1:] or []
    if not root or root[0].opcode != "compare" or "direction=LT" not in root[0].attrs:
        return None
    a, b = (instrs.get(o) for o in root[0].operands[:2])
    if not (a and b and a.opcode == "get-tuple-element" and b.opcode == "constant"):
        return None
    idx = re.search(r"index=(\d+)", a.attrs)
    try:
        n = int(b.operands[0])
    except (ValueError, IndexError):
        return None
    here = {i.name: i for i in mod.computations.get(comp, [])}
    init = here.get(loop.operands[0]) if loop.operands else None
    start = 0
    if init is not None and init.opcode == "tuple" and idx:
        first = here.get(init.operands[int(idx.group(1))]) if int(idx.group(1)) < len(
            init.operands) else None
        if first is not None and first.opcode == "constant":
            try:
                start = int(first.operands[0])
            except (ValueError, IndexError):
                start = 0
    return max(n - start, 0)


def price(mod: hs.HloModule, comp: str, runs: int = 1, seen: tuple[str, ...] = ()
          ) -> list[Priced]:
    """Every kernel-level instruction one run of ``comp`` executes, with its price.

    ``while`` bodies multiply ``runs`` by their known trip count (by 1 when unknown) and their
    conditions by trip count + 1; ``call`` / ``async-start`` computations are entered; a
    ``conditional`` contributes its branch with the most cycles; fused computations are not
    entered (their instructions are the fusion's).  Custom calls count 0 FLOPs and bytes,
    except a Pallas flash attention (`flash_cost`).
    """
    if comp in seen:
        return []
    seen = (*seen, comp)
    types = hs._types(mod, comp)
    out: list[Priced] = []
    for ins in mod.computations.get(comp, []):
        calls = ins.called()
        if ins.opcode == "while":
            n = ins.trip_count or infer_trip_count(mod, comp, ins) or 1
            out += price(mod, calls["body"][0], runs * n, seen) if "body" in calls else []
            if "condition" in calls:
                out += price(mod, calls["condition"][0], runs * (n + 1), seen)
        elif ins.opcode in ("call", "async-start"):
            for name in calls.get("to_apply", ()) + calls.get("calls", ()):
                out += price(mod, name, runs, seen)
        elif ins.opcode == "conditional":
            branches = [price(mod, b, runs, seen) for key in
                        ("branch_computations", "true_computation", "false_computation")
                        for b in calls.get(key, ())]
            if branches:
                out += max(branches, key=lambda b: sum(p.cycles * p.runs for p in b))
        elif (fc := flash_cost(ins, types)) is not None:
            out.append(Priced(ins.name, ins.opcode, re.sub(r"\{[^{}]*\}", "", ins.type), runs,
                              instr_cycles(ins), *fc))
        elif ins.opcode not in _NO_TRAFFIC or instr_cycles(ins):
            flops = (fused_flops(mod, calls["calls"][0]) if ins.opcode == "fusion"
                     and "calls" in calls else fused_flops_one(ins, types))
            traffic = _instr_traffic(mod, ins, types)
            out.append(Priced(ins.name, ins.opcode, re.sub(r"\{[^{}]*\}", "", ins.type), runs,
                              instr_cycles(ins), flops, traffic))
    return out


def fused_flops_one(ins: hs.Instr, types: dict[str, str]) -> float:
    """FLOPs of one unfused instruction (as `fused_flops` counts it)."""
    if ins.opcode in ("dot", "convolution"):
        return _gemm_flops(ins, types)
    if ins.opcode in ("reduce", "reduce-window"):
        return float(sum(_prod(_dims(types.get(o, ""))) for o in ins.operands[:1]))
    if ins.opcode in _NO_FLOPS or ins.opcode.endswith("-done"):
        return 0.0
    return float(_prod(_dims(ins.type)))


def decode_loops(mod: hs.HloModule) -> list[hs.Instr]:
    """The sampler's decode segments: the top-level loops without a known trip count that have
    more than half the kernels of the largest such body (module order).  (A rollout program
    also holds a small loop of that kind, ~24 kernels against a segment's 685 for Qwen3-0.6B.)"""
    loops = [w for w in hs.top_level_whiles(mod) if w.trip_count is None]
    kernels = {w.name: hs._kernels(hs.kernel_counts(mod, w.called()["body"][0])) for w in loops}
    most = max(kernels.values(), default=0)
    return [w for w in loops if kernels[w.name] > most / 2]


def _body_cycles(mod: hs.HloModule, w: hs.Instr) -> float:
    return sum(p.cycles * p.runs for p in price(mod, w.called()["body"][0]))


def decode_body(mod: hs.HloModule) -> str | None:
    """The decode step's computation: of the decode segments (`decode_loops`), the body whose
    one run the compiler prices highest (the last segment, which attends to the longest prefix
    of the cache), else None.

    (Until 2026-12-06 the rule was `_hlo_stats.decode_loop_stats`': the body with the most
    kernels.  With the cache allocated once the segments' bodies have the same kernels, give
    or take one, and that rule priced the first segment of some programs and the last of
    others.)"""
    loops = decode_loops(mod)
    return max(loops, key=lambda w: _body_cycles(mod, w)).called()["body"][0] if loops else None


def summarize(items: list[Priced], peak: float, bandwidth: float, clock: float,
              top: int = 10) -> dict:
    """Totals of priced instructions and the ``top`` most expensive by cycles x runs.

    Returns:
      dict: ``estimated_cycles``, ``estimated_s`` (at ``clock``), ``flops``, ``bytes``,
      ``roofline_s`` (sum over instructions of ``runs x max(flops / peak, bytes /
      bandwidth)``), ``compute_bound_s`` / ``memory_bound_s`` (the parts of it each side
      sets), ``instructions`` and ``top`` (name, opcode, type, runs, cycles per run, share).
    """
    cyc = sum(p.cycles * p.runs for p in items)
    comp = mem = 0.0
    for p in items:
        f, b = p.runs * p.flops / peak, p.runs * p.bytes / bandwidth
        comp, mem = (comp + f, mem) if f >= b else (comp, mem + b)
    ranked = sorted(items, key=lambda p: -p.cycles * p.runs)[:top]
    return {"estimated_cycles": cyc, "estimated_s": cyc / clock,
            "flops": sum(p.flops * p.runs for p in items),
            "bytes": sum(p.bytes * p.runs for p in items),
            "roofline_s": comp + mem, "compute_bound_s": comp, "memory_bound_s": mem,
            "instructions": sum(p.runs for p in items),
            "top": [{"name": p.name, "opcode": p.opcode, "type": p.type, "runs": p.runs,
                     "cycles": p.cycles, "share": p.cycles * p.runs / cyc if cyc else 0.0}
                    for p in ranked]}


def program_cost(text: str, chip: str, decode: bool = False, top: int = 10) -> dict:
    """`summarize` of a compiled program for a `CHIPS` generation: the whole program (loops x
    trip counts) or, with ``decode``, one decode step (`decode_body`, run once) and
    ``segment_cycles``, the cycles of one run of every decode segment's body (module order)."""
    mod = hs.parse_hlo(text)
    comp = decode_body(mod) if decode else mod.entry
    if comp is None:
        return {"error": "no decode loop (a top-level while without a known trip count)"}
    _, peak, bw, clock = CHIPS[chip]
    out = {"computation": comp, **summarize(price(mod, comp), peak, bw, clock, top)}
    if decode:
        out["segment_cycles"] = [_body_cycles(mod, w) for w in decode_loops(mod)]
    return out
