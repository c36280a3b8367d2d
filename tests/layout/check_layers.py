#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The layer picture of README.md ("Layout"), checked against the code: every #include "<folder>/..." in the
# library's folders must name the folder itself or one the picture allows below it. A new upward or sideways
# include fails here with the file and line, so the README and the includes cannot drift apart.
import pathlib
import re
import sys

# What each folder may include (besides itself): exactly the arrows of README.md's picture.
ALLOWED = {
    "base": set(),
    "io": {"base"},
    "stack": {"base", "io"},
    "threading": {"base", "io", "stack"},
    "mpa": {"base"},
    "ddp": {"base"},
    "rdmap": {"base", "ddp", "mpa"},
    "verbs": {"base", "io", "stack", "threading", "mpa", "ddp", "rdmap"},
}
# The installed API (include/softrdma, included as <softrdma/...>): its vocabulary headers sit at the bottom of the
# picture (plain structs, standard C++ only: every layer may use them); the API's classes (verbs.hpp) are
# verbs' alone. An API header includes only standard headers and other API headers.
API_VOCABULARY = {"softrdma/iwarp.hpp", "softrdma/config.hpp", "softrdma/diagnostics.hpp", "softrdma/log.hpp"}
API_VERBS_ONLY = {"softrdma/verbs.hpp"}
# The protocol layers know nothing of the packet path (DPDK, lwIP) either.
FORBIDDEN_SYSTEM = {
    "mpa": ("rte_", "lwip/"),
    "ddp": ("rte_", "lwip/"),
    "rdmap": ("rte_", "lwip/"),
    "base": ("rte_", "lwip/"),
}

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
bad = []
checked = 0


def includes(path):
    """(line number, included name) of every #include in a file."""
    global checked
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = include.match(line)
        if m:
            checked += 1
            yield n, m.group(1)


for folder, allowed in ALLOWED.items():
    for path in sorted((root / folder).rglob("*")):
        if path.suffix not in (".hpp", ".cpp", ".h", ".c"):
            continue
        for n, target in includes(path):
            top = target.split("/", 1)[0] if "/" in target else None
            if top in ALLOWED and top != folder and top not in allowed:
                bad.append(f"{path.relative_to(root)}:{n}: {folder}/ includes {target} ({top}/ is not below {folder}/)")
            if target.startswith("softrdma/"):
                if target not in API_VOCABULARY | API_VERBS_ONLY:
                    bad.append(f"{path.relative_to(root)}:{n}: {target} is not an API header")
                elif target in API_VERBS_ONLY and folder != "verbs":
                    bad.append(f"{path.relative_to(root)}:{n}: {folder}/ includes {target} (the API's classes are verbs')")
            if any(target.startswith(p) for p in FORBIDDEN_SYSTEM.get(folder, ())):
                bad.append(f"{path.relative_to(root)}:{n}: {folder}/ includes {target} (no DPDK or lwIP here)")
api = root / "include" / "softrdma"
headers = sorted(api.glob("*.hpp"))
if {f"softrdma/{h.name}" for h in headers} != API_VOCABULARY | API_VERBS_ONLY:
    bad.append(f"include/softrdma holds {sorted(h.name for h in headers)}: update the lists in {sys.argv[0]}")
for path in headers:
    for n, target in includes(path):
        # Standard C++ headers: a bare name (<vector>, <cstdint>); ours: <softrdma/...> vocabulary.
        if not (re.fullmatch(r"[a-z_]+", target) or target in API_VOCABULARY):
            bad.append(f"{path.relative_to(root)}:{n}: the API includes {target} (standard C++ and API vocabulary only)")
for b in bad:
    print(b)
print(f"{checked} includes checked, {len(bad)} against the layer picture")
sys.exit(1 if bad or checked == 0 else 0)
