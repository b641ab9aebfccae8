#!/usr/bin/env python3
"""Checks that trainer/ keeps its layout: one library per folder, dependencies one way.

Reads each trainer/<folder>/CMakeLists.txt (`ourgpipe_trainer_library(<folder> ... PUBLIC ...
PRIVATE ...)`) and every source and header under trainer/ and models/, and fails, naming the file
and line, when
  - a folder includes a public header of a folder it does not link (directly, or through a PUBLIC
    dependency of one it links): the compiler alone would accept it through transitive include
    paths, so the CMake graph and the code would drift apart;
  - a file includes another folder's private file, or a trainer header that does not exist;
  - anything in trainer/ names a model (models/ depends on trainer/, never the reverse);
  - models/ includes trainer headers beyond what models_all links;
  - the folder graph has a cycle.
Usage: check_layering.py [PROJECT_ROOT]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
trainer = root / "trainer"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Headers from outside trainer/ that a folder may include by bare name (their include directory is
# added in that folder's CMakeLists.txt).
# tensorboard_event.pb.h: protoc's output in the build folder, flat with some CMake versions
# (the GPU image's), under proto/ with others (trainer/tensorboard/CMakeLists.txt declares both).
EXTERNAL_BARE = {"orion.h": {"device", "distributed"}, "tensorboard_event.pb.h": {"tensorboard"}}
errors = []


def parse_library(folder):
    text = (trainer / folder / "CMakeLists.txt").read_text()
    m = re.search(r"ourgpipe_trainer_library\(\s*" + re.escape(folder) + r"\b(.*?)\)", text, re.S)
    if not m:
        errors.append(f"trainer/{folder}/CMakeLists.txt: no ourgpipe_trainer_library({folder} ...)")
        return set(), set()
    public, private, mode = set(), set(), None
    for word in m.group(1).split():
        if word in ("SOURCES", "PUBLIC", "PRIVATE"):
            mode = word
        elif word.startswith("trainer_") and mode in ("PUBLIC", "PRIVATE"):
            dep = word[len("trainer_"):]
            if dep != "torch_base":
                (public if mode == "PUBLIC" else private).add(dep)
    return public, private


folders = sorted(p.name for p in trainer.iterdir()
                 if p.is_dir() and (p / "CMakeLists.txt").exists() and (p / "include").exists())
public = {}
private = {}
for f in folders:
    public[f], private[f] = parse_library(f)
    for dep in public[f] | private[f]:
        if dep not in folders:
            errors.append(f"trainer/{f}/CMakeLists.txt: links trainer_{dep}, which is not a trainer folder")


def public_closure(f, seen=None):
    seen = set() if seen is None else seen
    for dep in public.get(f, ()):
        if dep not in seen:
            seen.add(dep)
            public_closure(dep, seen)
    return seen


def allowed(f):
    out = {f}
    for dep in public[f] | private[f]:
        out |= {dep} | public_closure(dep)
    return out


# Cycles in the folder graph (static libraries that need each other).
state = {}


def visit(f, path):
    state[f] = "open"
    for dep in sorted(public.get(f, set()) | private.get(f, set())):
        if state.get(dep) == "open":
            errors.append("trainer folders depend on each other in a cycle: " + " -> ".join(path + [f, dep]))
        elif dep in folders and dep not in state:
            visit(dep, path + [f])
    state[f] = "done"


for f in folders:
    if f not in state:
        visit(f, [])


# The models' folders (gpt/, bert/, common/, ...): "<folder>/x.h" names a model.
MODEL_FOLDERS = {p.name for p in (root / "models").iterdir() if p.is_dir()}


def public_header_exists(folder, rest):
    return (trainer / folder / "include" / "trainer" / folder / rest).is_file()


def check_file(path, owner, allowed_folders):
    rel = path.relative_to(root)
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        inc = m.group(1)
        where = f"{rel}:{n}"
        if inc.startswith("trainer/"):
            parts = inc.split("/", 2)
            if len(parts) != 3 or not public_header_exists(parts[1], parts[2]):
                errors.append(f'{where}: "{inc}" is not a public trainer header '
                              f"(public headers live in trainer/<folder>/include/trainer/<folder>/)")
            elif parts[1] not in allowed_folders:
                errors.append(f'{where}: "{inc}": {owner} does not link trainer_{parts[1]}; '
                              f"add it to {owner}'s CMakeLists.txt or drop the include")
        elif inc.startswith("models/") or inc.split("/", 1)[0] in MODEL_FOLDERS:
            if owner != "models":
                errors.append(f'{where}: "{inc}": trainer/ must not name a model')
        elif "/" not in inc:
            if (path.parent / inc).is_file():
                continue
            if owner in EXTERNAL_BARE.get(inc, ()):
                continue
            errors.append(f'{where}: "{inc}" is not a file of this folder (another folder\'s private '
                          f"file, or a header whose include directory this folder does not declare)")


for f in folders:
    ok = allowed(f)
    for path in sorted((trainer / f).rglob("*")):
        if path.suffix in (".h", ".cpp"):
            check_file(path, f, ok)
for path in sorted((trainer / "tools").glob("*.cpp")):
    check_file(path, "tools", set(folders))

# models/: only what models_all links (models/CMakeLists.txt declares it).
models_cmake = (root / "models" / "CMakeLists.txt").read_text()
m = re.search(r"target_link_libraries\(models_all PUBLIC(.*?)(PRIVATE|\))", models_cmake, re.S)
model_deps = set()
for word in (m.group(1).split() if m else []):
    if word.startswith("trainer_"):
        model_deps |= {word[len("trainer_"):]} | public_closure(word[len("trainer_"):])
if not model_deps:
    errors.append("models/CMakeLists.txt: models_all links no trainer_<folder> library")
for path in sorted((root / "models").rglob("*")):
    if path.suffix in (".h", ".cpp"):
        check_file(path, "models", model_deps)

stray = [p.relative_to(root) for p in trainer.iterdir()
         if p.is_file() and p.suffix in (".h", ".cpp")]
for p in stray:
    errors.append(f"{p}: a source at the top of trainer/; put it in the folder of its idea")

if errors:
    print("\n".join(errors))
    print(f"check_layering: {len(errors)} problem(s)")
    sys.exit(1)
print(f"check_layering: {len(folders)} trainer folders, dependencies one way, no cycles, "
      f"models/ sees only {sorted(model_deps)}")
