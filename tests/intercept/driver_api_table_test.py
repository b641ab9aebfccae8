#!/usr/bin/env python3
"""intercept.driver_api_table: every function the toolkit's driver headers declare (cuda.h and
every other header of the toolkit that declares cu* driver functions: cudaProfiler.h, cudaGL.h,
cudaEGL.h, cudaVDPAU.h) is classified in intercept/src/driver_api_classes.csv and exported by
libgpu_scheduler.so (so a call through dlsym, cuGetProcAddress or direct linking reaches a
wrapper), and the check itself catches a function missing from the table.

usage: driver_api_table_test.py LIBRARY -- GEN_DRIVER_API_ARGS...
"""
import csv
import io
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "..", "intercept", "tools", "gen_driver_api.py")
sys.path.insert(0, os.path.dirname(GEN))
import gen_driver_api  # noqa: E402  (its DRIVER_HEADERS and preprocess(), the build's own)


def run_check(args):
    out = subprocess.run([sys.executable, GEN, *args, "--check"], capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


def arg(args, name):
    return args[args.index(name) + 1]


def main():
    library, args = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    failures = []

    rc, text = run_check(args)
    print(text)
    if rc != 0:
        failures.append("the table does not cover the driver headers (see the errors above)")
    m = re.search(r"ABI symbols: (\d+)", text)
    symbols_declared = int(m.group(1)) if m else 0
    if symbols_declared < 400:
        failures.append(f"only {symbols_declared} ABI symbols found in the driver headers")

    # The check must fail when a driver header declares a function the table does not list.
    table = arg(args, "--table")
    with open(table) as f:
        lines = f.readlines()
    dropped = [l for l in lines if l.startswith("cuMemFreeHost,")]
    if len(dropped) != 1:
        failures.append("cuMemFreeHost is not listed exactly once in the table")
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as t:
        t.writelines(l for l in lines if not l.startswith("cuMemFreeHost,"))
    try:
        bad = list(args)
        bad[bad.index("--table") + 1] = t.name
        rc2, text2 = run_check(bad)
    finally:
        os.unlink(t.name)
    if rc2 == 0 or "cuMemFreeHost" not in text2:
        failures.append(f"--check did not catch an unclassified function (rc {rc2}):\n{text2}")

    # ... and when an ABI symbol has no PFN version to pair with (cuGetProcAddress could not hand
    # out its wrapper): the driver headers copied, cudaProfilerTypedefs.h without cuProfilerStop's.
    inc = arg(args, "--cuda-include")
    with tempfile.TemporaryDirectory() as tmp:
        for h, _, _ in gen_driver_api.DRIVER_HEADERS:
            for name in (h, gen_driver_api.typedef_header(h)):
                with open(os.path.join(inc, name)) as f:
                    text = f.read()
                if name == "cudaProfilerTypedefs.h":
                    cut = re.sub(r"typedef[^;]*PFN_cuProfilerStop_v\d+[^;]*;", "", text)
                    if cut == text:
                        failures.append("cudaProfilerTypedefs.h has no PFN_cuProfilerStop typedef to remove")
                    text = cut
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
        bad = list(args)
        bad[bad.index("--cuda-include") + 1] = tmp
        rc3, text3 = run_check(bad)
    if rc3 == 0 or "cuProfilerStop: 1 ABI symbols but 0 PFN versions" not in text3:
        failures.append(f"--check did not catch an ABI without a PFN version (rc {rc3}):\n{text3[-2000:]}")

    # Every declared symbol is exported by the shim.
    nm = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True,
                        check=True).stdout
    exported = {re.sub(r"@.*", "", l.split()[-1]) for l in nm.splitlines() if l.split()}
    # Found here, not taken from the generator: a toolkit header that declares driver functions
    # the generator does not read would leave them reaching the driver around the shim.
    declaring = set()
    for root, _, files in os.walk(inc):
        for name in files:
            if name.endswith(".h"):
                with open(os.path.join(root, name), errors="replace") as f:
                    if re.search(r"\bCUresult\s+CUDAAPI\s+cu\w+\s*\(", f.read()):
                        declaring.add(os.path.relpath(os.path.join(root, name), inc))
    read = {h for h, _, _ in gen_driver_api.DRIVER_HEADERS}
    if declaring - read:
        failures.append(f"{', '.join(sorted(declaring - read))} declare driver functions the generator does "
                        "not read (gen_driver_api.py DRIVER_HEADERS)")
    if "cuda.h" not in declaring or len(declaring) < 2:
        failures.append(f"found driver declarations only in {sorted(declaring)} under {inc}")
    includes = [inc] + [args[i + 1] for i, a in enumerate(args) if a == "--include"]
    pre = gen_driver_api.preprocess(arg(args, "--cxx"), includes)
    declared = set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", pre))
    missing = sorted(declared - exported)
    if missing:
        failures.append(f"{len(missing)} driver functions are not exported by {library}: "
                        f"{', '.join(missing[:20])}")
    for must in ("cuProfilerStart", "cuProfilerStop", "cuGraphicsGLRegisterBuffer", "cuEGLStreamProducerPresentFrame",
                 "cuGraphicsVDPAURegisterVideoSurface"):
        if must not in declared & exported:
            failures.append(f"{must} is not declared and exported (the interop headers were not read)")
    print(f"{len(declared)} driver symbols in {', '.join(sorted(declaring))}, "
          f"{len(declared & exported)} exported by the shim")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
