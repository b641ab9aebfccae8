#!/usr/bin/env python3
"""Generates the shim's wrapper for every function the toolkit's driver headers declare.

Inputs: the toolkit's driver headers (DRIVER_HEADERS: cuda.h and the interop and profiler headers
beside it, whose functions libcuda exports too and libcudart looks up) run through the C++
preprocessor with __CUDA_API_VERSION_INTERNAL, which declares every ABI under its own symbol:
cuMemFree, cuMemFree_v2, cuLaunchKernel_ptsz, ...; their *Typedefs.h headers (the
PFN_<name>_v<version> typedefs give each ABI's cuGetProcAddress versions),
src/driver_api_classes.csv (what the shim does with each function) and src/entry_points.def (the
hand-written wrappers).

Outputs (in --out-dir):
  driver_functions.inc  ORION_DRIVER_FUNCTION(base, symbol, min_version, max_version, per_thread,
                        class, hand) for every symbol, sorted by symbol (dlsym and cuGetProcAddress
                        hand out &::symbol, the shim's wrapper, for any of them)
  driver_wrappers.cpp   a wrapper for every symbol without a hand-written one: order-free ones call
                        the driver; every other one first releases everything the shim holds
  driver_api_summary.txt counts per class, for the README and the test

--check: exit 1 when a function is missing from the table, a row names a function no driver
header declares, a function's ABI symbols and PFN versions do not pair up, or a row's wrapper column disagrees with entry_points.def (the build itself only
warns: an unclassified function gets the release-everything default).
"""
import argparse
import collections
import csv
import io
import os
import re
import subprocess
import sys

CLASSES = ("held", "stream_ordered", "synchronising", "order_free", "release_all")
HAND_CLASSES = ("held", "stream_ordered", "synchronising")
VMAX = 0x7FFFFFFF
ABI_RE = re.compile(r"^(cu\w+?)(?:_v(\d+))?(_ptsz|_ptds)?$")


# Every header of the toolkit that declares driver functions (libcuda.so.1 exports them all), with
# the windowing-system header each needs first and the Debian package that has it. A function the
# shim has no wrapper for would reach the driver around it (libcudart asks cuGetProcAddress for
# cuProfilerStart at start-up) while work is held: each gets the release-everything default unless
# the table says otherwise. Windows-only ones (cuWGLGetDevice, cudaD3D*.h) are not declared here.
DRIVER_HEADERS = (("cuda.h", None, None),
                  ("cudaProfiler.h", None, None),
                  ("cudaGL.h", "GL/gl.h", "libgl-dev"),
                  ("cudaEGL.h", "EGL/egl.h", "libegl-dev"),
                  ("cudaVDPAU.h", "vdpau/vdpau.h", "libvdpau-dev"))


def typedef_header(header):
    return header[:-2] + "Typedefs.h"


def preprocess(cxx, include_dirs):
    """The driver headers, preprocessed; include_dirs: the toolkit's first, then where the
    windowing-system headers are when they are not on the compiler's own path."""
    src = "#define __CUDA_API_VERSION_INTERNAL 1\n"
    for header, needs, _ in DRIVER_HEADERS:
        src += (f"#include <{needs}>\n" if needs else "") + f"#include <{header}>\n"
    flags = [f for d in include_dirs for f in ("-I", d)]
    out = subprocess.run([cxx, "-E", "-P", "-x", "c++", *flags, "-"], input=src,
                         capture_output=True, text=True)
    if out.returncode != 0:
        missing = [f"{needs} ({package})" for _, needs, package in DRIVER_HEADERS
                   if needs and needs in out.stderr]
        hint = (f"\nmissing: {', '.join(missing)}: install them (scripts/install-deps.sh)" if missing else "")
        sys.exit(f"gen_driver_api: preprocessing the driver headers with {cxx} failed:\n{out.stderr}{hint}")
    return out.stdout


def declarations(text):
    """symbol -> parameter list string, for every CUresult-returning cu* declaration."""
    decls = {}
    for m in re.finditer(r"\bCUresult\s+(cu\w+)\s*\(([^;{}]*?)\)\s*(?:__attribute__\(\(.*?\)\)\s*)*;",
                         text, re.S):
        decls[m.group(1)] = " ".join(m.group(2).split())
    return decls


def split_params(params):
    """[(type, name)] with the names replaced by a0, a1, ... (an unnamed parameter keeps its
    whole text as the type)."""
    if params in ("", "void"):
        return []
    builtin = {"int", "char", "short", "long", "float", "double", "void", "unsigned", "signed"}
    out = []
    for i, p in enumerate(params.split(",")):
        p = p.strip()
        words = [w for w in re.findall(r"[A-Za-z_]\w*", p) if w not in ("const", "volatile", "struct")]
        named = len(words) >= 2 and words[-1] not in builtin
        if named:
            out.append((re.sub(r"\b" + words[-1] + r"\s*$", "", p).rstrip(), f"a{i}"))
        else:
            out.append((p, f"a{i}"))
    return out


def abi_key(symbol):
    m = ABI_RE.match(symbol)
    return m.group(1), int(m.group(2) or 1), bool(m.group(3))


def version_ranges(symbols, typedefs_text):
    """symbol -> (min, max) cuGetProcAddress versions: the k-th ABI of a name (name, name_v2, ...)
    answers from its k-th PFN typedef version up to the next one's."""
    versions = collections.defaultdict(set)
    for name, ver, pt in re.findall(r"PFN_(cu\w+?)_v(\d+)(_ptsz|_ptds)?\)\s*\(", typedefs_text):
        versions[(name, bool(pt))].add(int(ver))
    groups = collections.defaultdict(list)
    for s in symbols:
        base, k, pt = abi_key(s)
        groups[(base, pt)].append((k, s))
    ranges, problems = {}, []
    for key, lst in groups.items():
        lst.sort()
        vs = sorted(versions.get(key, ()))
        if len(vs) != len(lst):
            problems.append(f"{key[0]}: {len(lst)} ABI symbols but {len(vs)} PFN versions in the *Typedefs.h headers "
                            "(cuGetProcAddress would hand out the driver's own: the shim stops holding work)")
            for _, s in lst:
                ranges[s] = (0, 0)  # never answered by name; only by dlsym and direct linking
            continue
        for i, (_, s) in enumerate(lst):
            ranges[s] = (vs[i], vs[i + 1] if i + 1 < len(vs) else VMAX)
    return ranges, problems


def read_table(path):
    rows = {}
    with open(path, newline="") as f:
        lines = [l for l in f if not l.startswith("#")]
    for r in csv.DictReader(io.StringIO("".join(lines))):
        fn, cls, wrapper = r["function"].strip(), r["class"].strip(), r["wrapper"].strip()
        if wrapper not in ("hand", "generated"):
            sys.exit(f"gen_driver_api: {path}: {fn}: wrapper must be 'hand' or 'generated', not '{wrapper}'")
        if cls in HAND_CLASSES and wrapper != "hand":
            sys.exit(f"gen_driver_api: {path}: {fn}: class '{cls}' needs a hand-written wrapper")
        if cls not in CLASSES:
            sys.exit(f"gen_driver_api: {path}: {fn}: unknown class '{cls}' (one of {', '.join(CLASSES)})")
        if fn in rows:
            sys.exit(f"gen_driver_api: {path}: {fn} is listed twice")
        rows[fn] = (cls, r["why"].strip(), wrapper)
    return rows


def read_entry_points(path):
    text = open(path).read()
    entries = {}
    for base, sym, lo, hi, pt in re.findall(
            r"^ORION_ENTRY\((\w+),\s*(\w+),\s*\w+,\s*(\w+),\s*(\w+),\s*(\d)\)", text, re.M):
        entries[sym] = (base, int(lo), VMAX if hi == "ORION_VMAX" else int(hi), pt == "1")
    aliases = re.findall(r"^ORION_ALIAS\((\w+),\s*(\w+),\s*(\w+),", text, re.M)
    return entries, [(b, s, int(lo)) for b, s, lo in aliases]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-include", required=True)
    ap.add_argument("--include", action="append", default=[],
                    help="another folder with headers the driver headers include (GL, EGL, VDPAU)")
    ap.add_argument("--cxx", required=True)
    ap.add_argument("--table", required=True)
    ap.add_argument("--entry-points", required=True)
    ap.add_argument("--out-dir")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()

    decls = declarations(preprocess(a.cxx, [a.cuda_include, *a.include]))
    if len(decls) < 100:
        sys.exit(f"gen_driver_api: found only {len(decls)} declarations in {a.cuda_include}/cuda.h")
    typedefs = "".join(open(os.path.join(a.cuda_include, typedef_header(h))).read()
                       for h, _, _ in DRIVER_HEADERS)
    ranges, range_problems = version_ranges(decls, typedefs)
    table = read_table(a.table)
    hand, aliases = read_entry_points(a.entry_points)
    for base, sym, lo in aliases:  # the driver answers `base` with another function from `lo` on
        for s, (rlo, rhi) in list(ranges.items()):
            if abi_key(s)[0] == base and rhi > lo:
                ranges[s] = (rlo, max(rlo, lo))

    errors, warnings = [], list(range_problems)
    functions = collections.defaultdict(list)
    for s in decls:
        functions[abi_key(s)[0]].append(s)
    cls_of = {}
    for fn, syms in sorted(functions.items()):
        row = table.get(fn)
        if row is None:
            errors.append(f"{fn} ({', '.join(sorted(syms))}) is not in {os.path.basename(a.table)}: "
                          "classify it (the shim releases everything before it until then)")
            cls = "release_all"
        else:
            cls = row[0]
        hand_syms = [s for s in syms if s in hand]
        wrapper = row[2] if row else "generated"
        if wrapper == "hand" and len(hand_syms) != len(syms):
            missing = sorted(set(syms) - set(hand_syms))
            errors.append(f"{fn} has a hand-written wrapper, but {', '.join(missing)} is not in "
                          "entry_points.def (a generated wrapper would only pass through or release)")
        if wrapper == "generated" and hand_syms:
            errors.append(f"{fn} is marked generated, but entry_points.def wraps {', '.join(hand_syms)}")
        for s in syms:
            cls_of[s] = cls
    for fn in table:
        if fn not in functions:
            errors.append(f"{os.path.basename(a.table)} lists {fn}, which no driver header declares")
    for s, (base, lo, hi, pt) in hand.items():
        if s not in decls:
            errors.append(f"entry_points.def wraps {s}, which no driver header declares")
        elif ranges.get(s) != (lo, hi):
            errors.append(f"entry_points.def gives {s} versions [{lo}, {hi}), the *Typedefs.h headers {list(ranges.get(s))}")

    if a.check:  # a new toolkit's surprise fails the test (intercept.driver_api_table), not the build
        for e in errors + warnings:
            print("error:", e)
        print(summary(decls, cls_of, hand, table))
        return 1 if errors or warnings else 0

    for e in errors + warnings:
        print(f"gen_driver_api: warning: {e}", file=sys.stderr)
    os.makedirs(a.out_dir, exist_ok=True)
    write_if_changed(os.path.join(a.out_dir, "driver_functions.inc"), functions_inc(decls, ranges, cls_of, hand))
    write_if_changed(os.path.join(a.out_dir, "driver_wrappers.cpp"), wrappers_cpp(decls, cls_of, hand))
    write_if_changed(os.path.join(a.out_dir, "driver_api_summary.txt"), summary(decls, cls_of, hand, table))
    return 0


def write_if_changed(path, text):
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path, "w") as f:
        f.write(text)


def class_enum(cls):
    return {"held": "kHeld", "stream_ordered": "kStreamOrdered", "synchronising": "kSynchronising",
            "order_free": "kOrderFree", "release_all": "kReleaseAll"}[cls]


def functions_inc(decls, ranges, cls_of, hand):
    out = ["// Generated by intercept/tools/gen_driver_api.py from the driver headers, their typedefs and",
           "// driver_api_classes.csv. Do not edit.",
           "// ORION_DRIVER_FUNCTION(base, symbol, min_version, max_version, per_thread, class, hand)"]
    for s in sorted(decls):
        base, _, pt = abi_key(s)
        lo, hi = ranges[s]
        out.append(f"ORION_DRIVER_FUNCTION({base}, {s}, {lo}, {hi}, {int(pt)}, {class_enum(cls_of[s])}, "
                   f"{int(s in hand)})")
    return "\n".join(out) + "\n"


# Calls that end a context (every ABI of these bases): the driver unloads the context's modules,
# so function handles the shim catalogued (name, parameter layout, communication class) may be
# handed out again for other kernels, and its streams and events go. After a successful call the
# generated wrapper tells the shim (orion::generated::ContextEnd): base -> the ContextEnd factory
# and the type of the first parameter it takes (None: none).
CONTEXT_ENDING = {"cuCtxDestroy": ("destroy", "CUcontext"),
                  "cuCtxDetach": ("unnamed", None),
                  "cuDevicePrimaryCtxRelease": ("primary_release", "CUdevice"),
                  "cuDevicePrimaryCtxReset": ("primary_reset", "CUdevice"),
                  "cuGreenCtxDestroy": ("green_destroy", "CUgreenCtx")}


def wrappers_cpp(decls, cls_of, hand):
    handwritten_ending = sorted(s for s in hand if abi_key(s)[0] in CONTEXT_ENDING)
    if handwritten_ending:
        # Only generated wrappers get the ContextEnd hook: a hand-written one must use it.
        raise SystemExit(f"{', '.join(handwritten_ending)} end a context (CONTEXT_ENDING) but have hand-written "
                         "wrappers: use orion::generated::ContextEnd there and drop them from CONTEXT_ENDING")
    gen = [s for s in sorted(decls) if s not in hand]
    out = ["// Generated by intercept/tools/gen_driver_api.py: the shim's wrapper for every driver",
           "// function without a hand-written one. Do not edit.",
           '#include "generated_wrapper_support.h"', "",
           "namespace orion::generated {",
           "namespace {",
           f"const char* const kSymbols[{len(gen)}] = {{"]
    out += [f'    "{s}",' for s in gen]
    out += ["};", "}  // namespace", f"void* g_real[{len(gen)}];",
            "void resolve(void* handle) {",
            f"  for (size_t i = 0; i < {len(gen)}; ++i) g_real[i] = real_dlsym(handle, kSymbols[i]);",
            "}", "}  // namespace orion::generated", ""]
    for i, s in enumerate(gen):
        params = split_params(decls[s])
        plist = ", ".join(f"{t} {n}" for t, n in params)
        args = ", ".join(n for _, n in params)
        release = cls_of[s] != "order_free"
        out.append(f"ORION_EXPORT CUresult CUDAAPI {s}({plist}) {{")
        out.append(f"  const auto real = reinterpret_cast<decltype(&::{s})>(::orion::generated::real({i}));")
        out.append("  if (real == nullptr) return ::orion::generated::missing();")
        if release:
            out.append(f"  ::orion::generated::release_held_work(::orion::DriverFunctionId::{s});")
        if abi_key(s)[0] in CONTEXT_ENDING:
            if not release:
                raise SystemExit(f"{s} ends a context but is classified order_free in driver_api_classes.csv")
            factory, arg_type = CONTEXT_ENDING[abi_key(s)[0]]
            if arg_type is not None and (not params or params[0][0] != arg_type):
                raise SystemExit(f"{s}: ContextEnd::{factory} takes its first parameter as {arg_type}, "
                                 f"cuda.h declares ({decls[s]})")
            arg = params[0][1] if arg_type is not None else ""
            out.append(f"  auto ending = ::orion::generated::ContextEnd::{factory}({arg});")
            out.append(f"  const CUresult rc = real({args});")
            out.append("  if (rc == CUDA_SUCCESS) ending.ended();")
            out.append("  return rc;")
        else:
            out.append(f"  return real({args});")
        out.append("}")
    return "\n".join(out) + "\n"


def summary(decls, cls_of, hand, table):
    by_cls = collections.Counter(cls_of.values())
    fns = collections.defaultdict(set)
    for s, c in cls_of.items():
        fns[c].add(abi_key(s)[0])
    lines = [f"driver functions: {len({abi_key(s)[0] for s in decls})}, ABI symbols: {len(decls)}, "
             f"hand-written wrappers: {sum(1 for s in decls if s in hand)}, "
             f"generated: {sum(1 for s in decls if s not in hand)}"]
    for c in CLASSES:
        lines.append(f"  {c:15s} {len(fns[c]):4d} functions {by_cls[c]:4d} symbols")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
