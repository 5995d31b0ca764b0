"""Weight bytes a decode step reads, and dequantized weight copies, in compiled HLO text.

Helpers of ``benchmarks/deviceless_kernels_tpu.py`` (pure text, no jax), on top of
`_hlo_stats.parse_hlo`:

* `loop_weight_reads` / `weight_reads_per_step`: the loop-invariant elements of a ``while``
  body's tuple (``get-tuple-element`` index ``k`` of the body's parameter that the ROOT tuple
  passes back at ``k``, unchanged or only moved: copies, bitcasts, async slices) that reach
  a kernel holding a ``dot`` or ``convolution``
  (TPU HLO turns dots into convolutions inside ``kOutput`` fusions), directly or through
  a kernel that converts it from float8 (a dequantized copy), followed through views, copies,
  slices (TPU's async ``slice-start`` / ``slice-done``) and non-GEMM custom calls (TPU's
  ``ConcatBitcast`` of merged weights), and through the ROOT tuple into another element when
  the step prefetches a weight for the next step (TPU copies slices of a weight into on-chip
  memory, ``S(1)``, and carries them; the next step's dot reads that element).  Each such array is
  counted once, at its logical size (elements x dtype bits / 8; layout padding and tiling not
  counted): the bytes of weights one step reads from memory, by dtype.
* `dequant_copies`: every kernel-level instruction (a ``fusion`` that is not nested in another
  fusion, or a bare ``convert``) that converts a float8 value to a wider float without holding
  a dot / convolution itself, i.e. writes the converted array to memory.  Those whose output has
  a weight's shape (the sorted dims of a rank >= 2 float parameter of the entry computation, or
  of one layer of a stacked one) are dequantized weight copies; others (e.g. an FP8 KV cache
  read back) are listed apart.  Kernels that hold a dot and take or convert a float8 value are
  counted as the positive evidence: there the convert lives inside the GEMM's fusion.
"""

from __future__ import annotations

import re

import _hlo_stats as hs

_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
         "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
         "f4e2m1fn": 4}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")
_INDEX = re.compile(r"\bindex=(\d+)")
_PASS = {"bitcast", "copy", "copy-start", "copy-done", "reshape", "transpose",
         "get-tuple-element", "tuple", "opt-barrier"}
_DOT = {"dot", "convolution"}
_GEMM = re.compile(r"gemm|matmul|cublas", re.I)


def arrays(typ: str) -> list[tuple[str, tuple[int, ...]]]:
    """``(dtype, dims)`` of each array in an HLO type (one for an array, several for a tuple)."""
    return [(d, tuple(int(x) for x in dims.split(",") if x))
            for d, dims in _ARRAY.findall(re.sub(r"\{[^{}]*\}", "", typ))]


def dtype_bits(dtype: str) -> int:
    """Bits of one element of an HLO dtype (``f8e4m3fn`` -> 8, ``bf16`` -> 16)."""
    return 8 if dtype.startswith("f8") else _BITS.get(dtype, 0)


def array_bytes(typ: str) -> int:
    """Logical bytes of an HLO array type (a tuple: the sum of its arrays)."""
    total = 0
    for d, dims in arrays(typ):
        n = 1
        for x in dims:
            n *= x
        total += n * dtype_bits(d) // 8
    return total


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


def fused_computations(mod: hs.HloModule) -> set[str]:
    """Computations inside fusions (called by a ``fusion``, or by anything within one)."""
    out: set[str] = set()
    todo = [n for instrs in mod.computations.values() for i in instrs if i.opcode == "fusion"
            for n in i.called().get("calls", ())]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        todo.extend(n for i in mod.computations.get(name, []) for ns in i.called().values()
                    for n in ns)
    return out


def _walk(mod: hs.HloModule, comp: str, seen: frozenset = frozenset()):
    """The instructions of ``comp`` and of every computation it calls (fusions nested)."""
    if comp in seen:
        return
    for ins in mod.computations.get(comp, []):
        yield comp, ins
        for names in ins.called().values():
            for name in names:
                yield from _walk(mod, name, seen | {comp})


def _fusion_facts(mod: hs.HloModule, comp: str) -> tuple[bool, bool]:
    """(holds a dot / convolution, takes or converts a float8 value) for a fused computation."""
    dot = f8 = False
    for c, ins in _walk(mod, comp):
        dot |= ins.opcode in _DOT
        if ins.opcode == "parameter" or ins.opcode == "convert":
            src = hs._types(mod, c).get(ins.operands[0], "") if ins.opcode == "convert" else ""
            f8 |= ins.type.startswith("f8") or src.startswith("f8")
    return dot, f8


def _converts_f8(mod: hs.HloModule, comp: str) -> bool:
    """Whether a fused computation (nested fusions included) converts float8 to a wider float."""
    for c, ins in _walk(mod, comp):
        if (ins.opcode == "convert"
                and hs._types(mod, c).get(ins.operands[0], "").startswith("f8")
                and any(_is_float(d) and not d.startswith("f8") for d, _ in arrays(ins.type))):
            return True
    return False


def _moves_data(ins: hs.Instr) -> bool:
    """Whether an instruction only moves or views data (copies, bitcasts, async slices, TPU's
    ``ConcatBitcast``), so a weight passed through it is still that weight."""
    if ins.opcode == "custom-call":
        m = hs._TARGET.search(ins.attrs)
        return not (m and _GEMM.search(m.group(1)))
    return ins.opcode in _PASS or ins.opcode == "slice" or ins.opcode.endswith(("-start",
                                                                                 "-done"))


def _carried(by_name: dict[str, hs.Instr], gtes: dict[str, int], op: str, k: int) -> bool:
    """Whether ROOT element ``k`` (value ``op``) is body element ``k`` itself, directly or moved
    (TPU re-lays or re-pins some weights each step: copy-start -> slice-start -> ConcatBitcast)."""
    todo, seen = [op], set()
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if cur in gtes:
            if gtes[cur] != k:
                return False
            continue
        ins = by_name.get(cur)
        if ins is None or not ins.operands or not _moves_data(ins):
            return False
        todo.extend(ins.operands)
    return True


def loop_weight_reads(mod: hs.HloModule, body: str) -> dict:
    """Loop-invariant arrays of a ``while`` body that reach a dot / convolution kernel.

    Args:
      mod: the parsed module.
      body: the name of the loop's body computation.

    Returns:
      dict: ``weight_bytes`` (their logical bytes, each array once), ``weight_arrays``,
      ``weight_bytes_by_dtype``, ``invariant_bytes_read`` / ``invariant_arrays_read`` (every
      loop-invariant array some instruction other than the ROOT tuple reads).
    """
    instrs = mod.computations.get(body, [])
    if not instrs:
        return {}
    param = next((i.name for i in instrs if i.opcode == "parameter"), "")
    root = instrs[-1]  # scheduled HLO prints the ROOT last
    gtes = {i.name: int(m.group(1)) for i in instrs
            if i.opcode == "get-tuple-element" and i.operands[:1] == (param,)
            and (m := _INDEX.search(i.attrs))}
    by_name = {i.name: i for i in instrs}
    invariant = {k for k, op in enumerate(root.operands)
                 if root.opcode == "tuple" and _carried(by_name, gtes, op, k)}
    by_index: dict[int, list[str]] = {}
    for g, k in gtes.items():
        by_index.setdefault(k, []).append(g)
    users: dict[str, list[hs.Instr]] = {}
    for ins in instrs:
        for op in ins.operands:
            users.setdefault(op, []).append(ins)
    out = {"weight_bytes": 0, "weight_arrays": 0, "weight_bytes_by_dtype": {},
           "invariant_bytes_read": 0, "invariant_arrays_read": 0}
    by_type = {i.name: i.type for i in instrs}
    done: set[int] = set()
    for name, k in gtes.items():
        if k not in invariant or k in done:
            continue
        reads = feeds_dot = False
        todo, seen = [name], set()
        todo.extend(by_index[k])  # every gte of the same element
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            for u in users.get(cur, []):
                if u is root:  # carried to another element: a prefetch for the next step
                    todo.extend(g for j, op in enumerate(root.operands)
                                if op == cur and j not in invariant for g in by_index.get(j, ()))
                    continue
                reads = True
                if u.opcode in _PASS or u.opcode.endswith(("-start", "-done")):
                    todo.append(u.name)  # views, copies, async slices (TPU: slice-start)
                elif u.opcode == "custom-call":
                    m = hs._TARGET.search(u.attrs)
                    if m and _GEMM.search(m.group(1)):
                        feeds_dot = True
                    else:  # e.g. TPU's ConcatBitcast of merged weights: follow its output
                        todo.append(u.name)
                elif u.opcode == "fusion":
                    called = u.called().get("calls", ())
                    feeds_dot |= any(_fusion_facts(mod, c)[0] for c in called)
                    if any(_converts_f8(mod, c) for c in called):
                        todo.append(u.name)  # a dequantizing kernel: follow its output
                elif u.opcode in ("slice", "dynamic-slice", "concatenate"):
                    todo.append(u.name)
        done.add(k)
        nbytes = array_bytes(by_type[name])
        if reads:
            out["invariant_bytes_read"] += nbytes
            out["invariant_arrays_read"] += 1
        if feeds_dot:
            out["weight_bytes"] += nbytes
            out["weight_arrays"] += 1
            for d, _ in arrays(by_type[name]):
                out["weight_bytes_by_dtype"][d] = out["weight_bytes_by_dtype"].get(d, 0) + nbytes
    return out


def weight_reads_per_step(text: str) -> dict:
    """`loop_weight_reads` of the decode loop `_hlo_stats.decode_loop_stats` reports (the
    top-level loop without a known trip count with the most kernels; else the loop with the
    most kernels), plus its ``body`` name."""
    mod = hs.parse_hlo(text)
    loops = hs.top_level_whiles(mod)
    if not loops:
        return {}
    decode = [w for w in loops if w.trip_count is None] or loops
    w = max(decode, key=lambda w: hs._kernels(hs.kernel_counts(mod, w.called()["body"][0])))
    body = w.called()["body"][0]
    return {"body": body, **loop_weight_reads(mod, body)}


def dot_operand_dtypes(text: str) -> dict[str, int]:
    """``"lhs x rhs -> out"`` dtypes of the dots / convolutions in the decode loop body of
    `weight_reads_per_step` (nested computations entered once each): whether the GEMMs take
    float8 operands themselves (``f8e4m3fn x f8e4m3fn -> f32``) or converted ones."""
    mod = hs.parse_hlo(text)
    body = weight_reads_per_step(text).get("body", "")
    out: dict[str, int] = {}
    for comp, ins in _walk(mod, body):
        if ins.opcode in _DOT:
            types = hs._types(mod, comp)
            key = (" x ".join(types.get(o, "?").split("[")[0] for o in ins.operands[:2])
                   + " -> " + ins.type.split("[")[0])
            out[key] = out.get(key, 0) + 1
    return out


def _weight_shapes(mod: hs.HloModule) -> set[tuple[int, ...]]:
    """Sorted dims of the entry's rank >= 2 float parameters and of one layer of each."""
    shapes: set[tuple[int, ...]] = set()
    for ins in mod.computations.get(mod.entry, []):
        if ins.opcode != "parameter":
            continue
        for d, dims in arrays(ins.type):
            if _is_float(d) and len(dims) >= 2:
                shapes.add(tuple(sorted(dims)))
                if len(dims) >= 3:
                    shapes.add(tuple(sorted(dims[1:])))
    return shapes


def dequant_copies(text: str) -> dict:
    """Dequantized float8 weight copies written to memory by a compiled program.

    Args:
      text: ``compiled.as_text()``.

    Returns:
      dict: ``weight_copies`` (kernel-level instructions converting float8 to a wider float
      outside any dot, whose output has a weight's shape: name, type, computation, op_name),
      ``other_f8_converts`` (the same with other shapes), ``f8_dot_kernels`` (kernels holding a
      dot / convolution that take or convert a float8 value), ``f8_arrays`` (instructions
      anywhere with a float8 result) and ``verdict``: ``"no dequantized weight copy"`` (float8
      dot kernels and no copy), ``"dequantized weight copy"`` or ``"no float8 weights"``.
    """
    mod = hs.parse_hlo(text)
    fused = fused_computations(mod)
    shapes = _weight_shapes(mod)
    copies, others, f8_dots, f8_arrays = [], [], 0, 0
    for comp, instrs in mod.computations.items():
        f8_arrays += sum(i.type.startswith("f8") for i in instrs)
        if comp in fused:
            continue
        types = hs._types(mod, comp)
        for ins in instrs:
            if ins.opcode == "fusion":
                called = (ins.called().get("calls") or ("",))[0]
                dot, f8 = _fusion_facts(mod, called)
                if dot:
                    f8_dots += f8
                    continue
                if not _converts_f8(mod, called):
                    continue
            elif not (ins.opcode == "convert"
                      and types.get(ins.operands[0], "").startswith("f8")):
                continue
            outs = [dims for d, dims in arrays(ins.type) if _is_float(d) and not d.startswith("f8")]
            if not outs:
                continue
            m = re.search(r'op_name="([^"]*)"', ins.attrs)
            entry = {"name": ins.name, "type": re.sub(r"\{[^{}]*\}", "", ins.type),
                     "computation": comp, "op_name": m.group(1) if m else ""}
            weight = any(tuple(sorted(dims)) in shapes for dims in outs)
            (copies if weight else others).append(entry)
    verdict = ("dequantized weight copy" if copies else
               "no dequantized weight copy" if f8_dots else "no float8 weights")
    return {"verdict": verdict, "weight_copies": copies, "other_f8_converts": others,
            "f8_dot_kernels": f8_dots, "f8_arrays": f8_arrays}
