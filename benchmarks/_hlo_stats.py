"""Kernels, loops and FP8 GEMMs of compiled HLO text; FP8-fed dots of StableHLO text.

Helpers of ``benchmarks/gpu_rollout.py`` and of the deviceless-compile test.
Two views of one program:

* `decode_loop_stats` reads ``compiled.as_text()`` (optimized HLO).  The
  decode loops are the top-level ``while`` instructions whose trip count XLA
  could not derive (no ``known_trip_count`` in their backend config: they exit
  when every row is done); the prefill's layer scan and the uniform draws have
  known trip counts.  Per loop it counts the kernels of its body, i.e. the
  ``fusion`` and ``custom-call`` instructions (descending into ``call`` /
  ``async-start`` computations and nested loops, times their known trip
  count), and the FP8 GEMMs among them: custom calls with a float8 operand
  (``__cublas$lt$matmul$f8``) and GEMM fusions whose fused computation takes
  a float8 parameter and holds a ``dot``.
* `stablehlo_f8_dots` reads ``lowered.as_text()`` (before XLA): the
  ``dot_general`` ops whose operands are float8 values converted straight into
  the dot, and those that read a dequantized copy (a ``multiply`` of a
  converted float8 value) instead.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_ONE_CALL = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)"
                       r"=%?([\w.\-]+)")
_LIST_CALL = re.compile(r"\b(branch_computations|calls)=\{([^}]*)\}")
_F8 = re.compile(r"^f8e")
# Instructions that launch nothing (views, tuples, constants, control flow handled apart).
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain", "while",
         "call", "conditional", "async-start", "async-update", "async-done"}


@dataclass(frozen=True)
class Instr:
    """One HLO instruction: ``%name = type opcode(operands), attrs``."""

    name: str
    type: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str

    def called(self) -> dict[str, tuple[str, ...]]:
        """Computations this instruction calls, by attribute (``body``, ``to_apply``, ...)."""
        out: dict[str, tuple[str, ...]] = {}
        for key, names in _LIST_CALL.findall(self.attrs):
            out[key] = tuple(n.strip().lstrip("%") for n in names.split(",") if n.strip())
        for key, name in _ONE_CALL.findall(self.attrs):
            out.setdefault(key, (name,))
        return out

    @property
    def trip_count(self) -> int | None:
        m = _TRIP.search(self.attrs)
        return int(m.group(1)) if m else None


@dataclass
class HloModule:
    """Computations (name -> instructions) of an HLO module and the entry's name."""

    computations: dict[str, list[Instr]]
    entry: str


def _balanced(s: str, start: int) -> int:
    """Index just past the bracket group opening at ``s[start]`` (``(`` or ``{``)."""
    open_, close = s[start], {"(": ")", "{": "}"}[s[start]]
    depth = 0
    for i in range(start, len(s)):
        depth += (s[i] == open_) - (s[i] == close)
        if depth == 0:
            return i + 1
    return len(s)


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in s:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _parse_instr(line: str) -> Instr | None:
    m = re.match(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.find(" ")
        end = len(rest) if end < 0 else end
    typ, rest = rest[:end], rest[end:].lstrip()
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    close = _balanced(rest, op.end() - 1)
    args = re.sub(r"/\*.*?\*/", " ", rest[op.end():close - 1])  # drop /*index=5*/ comments
    operands = tuple(p.split()[-1].lstrip("%") for p in _split_top(args) if p.split())
    return Instr(m.group(1), typ, op.group(1), operands, rest[close:])


def _depth(line: str) -> int:
    return sum((ch in "({") - (ch in ")}") for ch in line)


def _joined(lines: list[str]) -> list[str]:
    """Lines with an instruction that spans several (a Pallas kernel's ``kernel_metadata``
    frontend attribute holds newlines) joined into one, so its tail starting at column 0 is
    not taken for the end of the computation."""
    out: list[str] = []
    depth = 0
    for line in lines:
        if depth > 0:
            out[-1] += " " + line
        else:
            out.append(line)
        if line[:1].isspace() or depth > 0:
            depth = max(depth + _depth(line), 0) if out[-1][:1].isspace() else 0
    return out


def parse_hlo(text: str) -> HloModule:
    """Parse HLO module text (``compiled.as_text()``) into its computations.

    Args:
      text: the module text; metadata sections (``FileNames`` ...) are skipped.

    Returns:
      `HloModule`; ``entry`` is the ``ENTRY`` computation ("" if none).
    """
    comps: dict[str, list[Instr]] = {}
    entry, cur = "", None
    for line in _joined(text.splitlines()):
        if line and not line[0].isspace():
            head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$", line)
            cur = None
            if head and not line.startswith("HloModule"):
                cur = head.group(2)
                comps[cur] = []
                if head.group(1):
                    entry = cur
            continue
        if cur is not None:
            ins = _parse_instr(line)
            if ins is not None:
                comps[cur].append(ins)
    return HloModule(comps, entry)


def _types(mod: HloModule, comp: str) -> dict[str, str]:
    return {i.name: i.type for i in mod.computations.get(comp, [])}


def _is_fp8_gemm(mod: HloModule, comp: str, ins: Instr, types: dict[str, str]) -> bool:
    if ins.opcode == "custom-call":
        m = _TARGET.search(ins.attrs)
        target = m.group(1) if m else ""
        return "f8" in target or any(_F8.match(types.get(o, "")) for o in ins.operands)
    if ins.opcode == "fusion":
        inner = mod.computations.get((ins.called().get("calls") or ("",))[0], [])
        has_dot = any(i.opcode in ("dot", "custom-call") for i in inner)
        return has_dot and any(i.opcode == "parameter" and _F8.match(i.type) for i in inner)
    return False


def kernel_counts(mod: HloModule, comp: str, _seen: tuple[str, ...] = ()) -> Counter:
    """Kernels one run of computation ``comp`` launches.

    Returns:
      Counter with ``fusion``, ``custom-call``, ``fp8_gemm`` (FP8 GEMMs among
      them), ``unknown_trip_loops`` (nested loops counted once) and
      ``other:<opcode>`` for any other instruction that is not free.
    """
    c: Counter = Counter()
    if comp in _seen:
        return c
    seen = (*_seen, comp)
    types = _types(mod, comp)
    for ins in mod.computations.get(comp, []):
        calls = ins.called()
        if ins.opcode in ("fusion", "custom-call"):
            c[ins.opcode] += 1
            c["fp8_gemm"] += _is_fp8_gemm(mod, comp, ins, types)
        elif ins.opcode == "while":
            n = ins.trip_count
            c["unknown_trip_loops"] += n is None
            inner = kernel_counts(mod, calls["body"][0], seen) if "body" in calls else Counter()
            for k, v in inner.items():
                c[k] += v * (n or 1)
        elif ins.opcode in ("call", "async-start"):
            for name in calls.get("to_apply", ()) + calls.get("calls", ()):
                c.update(kernel_counts(mod, name, seen))
        elif ins.opcode == "conditional":
            branches = [kernel_counts(mod, b, seen) for key in
                        ("branch_computations", "true_computation", "false_computation")
                        for b in calls.get(key, ())]
            if branches:
                c.update(max(branches, key=lambda b: b["fusion"] + b["custom-call"]))
        elif ins.opcode not in _FREE and not ins.opcode.endswith("-done"):
            c[f"other:{ins.opcode}"] += 1
    return c


def top_level_whiles(mod: HloModule) -> list[Instr]:
    """``while`` instructions reached from the entry without entering another loop's body."""
    found: list[Instr] = []

    def walk(comp: str, seen: tuple[str, ...]) -> None:
        if comp in seen:
            return
        for ins in mod.computations.get(comp, []):
            if ins.opcode == "while":
                found.append(ins)
            elif ins.opcode in ("call", "conditional", "async-start"):
                for names in ins.called().values():
                    for name in names:
                        walk(name, (*seen, comp))

    walk(mod.entry, ())
    return found


def _kernels(c: Counter) -> int:
    return c["fusion"] + c["custom-call"]


def decode_loop_stats(text: str) -> dict:
    """Kernels per decode step and FP8 GEMMs of a compiled rollout program.

    Args:
      text: ``compiled.as_text()`` of the rollout program.

    Returns:
      dict: ``kernels_per_step`` (fusions + custom calls of the largest decode
      loop body), ``fusions_per_step``, ``custom_calls_per_step``,
      ``fp8_gemms_per_step``, ``condition_kernels`` (the loop condition runs
      once per step too), ``decode_loops`` (one per decode segment),
      ``decode_loop_rule``, ``other_ops_per_step``, ``fp8_gemms_total`` (every
      FP8 GEMM instruction of the module, counted once each),
      ``custom_call_targets`` and ``while_loops`` (every top-level loop with
      its known trip count and body kernels).
    """
    mod = parse_hlo(text)
    loops = top_level_whiles(mod)
    bodies = {w.name: kernel_counts(mod, w.called()["body"][0]) for w in loops}
    decode = [w for w in loops if w.trip_count is None]
    rule = "top-level while loops without a known trip count"
    if not decode and loops:
        decode = [max(loops, key=lambda w: _kernels(bodies[w.name]))]
        rule = "no loop without a known trip count: the loop with the most kernels"
    out: dict = {"decode_loops": len(decode), "decode_loop_rule": rule}
    if decode:
        w = max(decode, key=lambda w: _kernels(bodies[w.name]))
        b = bodies[w.name]
        out.update(
            kernels_per_step=_kernels(b), fusions_per_step=b["fusion"],
            custom_calls_per_step=b["custom-call"], fp8_gemms_per_step=b["fp8_gemm"],
            condition_kernels=_kernels(kernel_counts(mod, w.called()["condition"][0])),
            kernels_per_step_by_loop=[_kernels(bodies[d.name]) for d in decode],
            other_ops_per_step={k[6:]: v for k, v in sorted(b.items()) if k.startswith("other:")},
        )
    total, targets = 0, set()
    for comp, instrs in mod.computations.items():
        types = _types(mod, comp)
        for ins in instrs:
            if ins.opcode == "custom-call" and (m := _TARGET.search(ins.attrs)):
                targets.add(m.group(1))
            if ins.opcode in ("custom-call", "fusion"):
                total += _is_fp8_gemm(mod, comp, ins, types)
    out.update(fp8_gemms_total=total, custom_call_targets=sorted(targets),
               while_loops=[{"body": w.called()["body"][0], "known_trip_count": w.trip_count,
                             "kernels": _kernels(bodies[w.name])} for w in loops])
    return out


# ----------------------------------------------------------------------------- StableHLO

_SSA = re.compile(r"^\s*(%[\w#]+)(?::\d+)?\s*=\s*\"?([\w.]+)\"?\s*(.*)$")
_SHAPE_OPS = {"stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim",
              "stablehlo.convert"}
_DOT_KEYS = ("dots", "f8_dots", "f8_one_operand_dots", "dequantized_dots")


def _functions(text: str) -> dict[str, list[str]]:
    """``func.func`` name -> its lines (signature line first)."""
    funcs: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"^\s*func\.func\s+(?:public\s+|private\s+)?@([\w.\-]+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        if cur is not None:
            funcs[cur].append(line)
    return funcs


def _dot_kinds(lines: list[str]) -> list[tuple[int, tuple[str | None, ...]]]:
    """``(line index, operand kinds)`` of every dot_general of one function.

    An operand's kind is ``"f8"`` for a float8 value converted straight into
    the dot, ``"dequant"`` for a value computed by a ``multiply`` of such a
    value (or reshaped / converted from one), else None.
    """
    kind: dict[str, str] = {}
    dots = []
    for i, line in enumerate(lines):
        m = _SSA.match(line)
        if not m:
            continue
        res, op, rest = m.groups()
        args = tuple(re.findall(r"%[\w#]+", rest.split(" : ")[0]))
        sig = re.search(r":\s*\((tensor<[^>]*>)\)\s*->", rest)
        if op == "stablehlo.convert" and sig and "xf8E" in sig.group(1):
            kind[res] = "f8"
        elif ((op == "stablehlo.multiply" and any(a in kind for a in args))
              or (op in _SHAPE_OPS and args and kind.get(args[0]) == "dequant")):
            kind[res] = "dequant"
        elif op == "stablehlo.dot_general":
            dots.append((i, tuple(kind.get(a) for a in args[:2])))
    return dots


def _tally(kinds: tuple[str | None, ...], c: Counter) -> None:
    c["dots"] += 1
    c["f8_dots"] += kinds == ("f8", "f8")
    c["f8_one_operand_dots"] += kinds.count("f8") == 1
    c["dequantized_dots"] += "dequant" in kinds


def _region_end(lines: list[str], start: int) -> int:
    """Index past the last line of the op at ``lines[start]`` and its ``{ ... }`` regions."""
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if i > start and depth <= 0:
            return i + 1
    return len(lines)


def stablehlo_f8_dots(text: str) -> dict:
    """The dot_generals of a StableHLO module (``lowered.as_text()``) by operand kind.

    Args:
      text: the module text.

    Returns:
      dict: ``dots`` (every dot_general of the text, each once), ``f8_dots``
      (both operands float8 values converted directly into the dot),
      ``f8_one_operand_dots``, ``dequantized_dots`` (an operand is a multiply
      of a converted float8 value: a dequantized weight or cache copy),
      ``f8_dots_by_function`` and ``whiles``: for each ``stablehlo.while`` in
      text order, its function and the same counts inside its regions plus the
      functions called there (each call site counted).
    """
    funcs = _functions(text)
    dots = {name: _dot_kinds(lines) for name, lines in funcs.items()}

    def count(name: str, lo: int, hi: int, seen: tuple[str, ...]) -> Counter:
        c: Counter = Counter()
        for i, kinds in dots[name]:
            if lo <= i < hi:
                _tally(kinds, c)
        for line in funcs[name][lo:hi]:
            for callee in re.findall(r"func\.call\s+@([\w.\-]+)", line):
                if callee in funcs and callee not in seen:
                    c.update(count(callee, 0, len(funcs[callee]), (*seen, callee)))
        return c

    whiles = []
    for name, lines in funcs.items():
        for i, line in enumerate(lines):
            if re.search(r"=\s*stablehlo\.while\b", line):
                c = count(name, i, _region_end(lines, i), (name,))
                whiles.append({"function": name, **{k: c[k] for k in _DOT_KEYS}})
    total: Counter = Counter()
    for name in funcs:
        for _, kinds in dots[name]:
            _tally(kinds, total)
    by_fn = {name: sum(k == ("f8", "f8") for _, k in d) for name, d in dots.items()}
    return {**{k: total[k] for k in _DOT_KEYS},
            "f8_dots_by_function": {k: v for k, v in by_fn.items() if v}, "whiles": whiles}
