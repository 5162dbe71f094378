"""A fake `nvidia-smi` answering the queries connector-tax makes, from fakegpu's state file:

    nvidia-smi --query-gpu=index,pci.bus_id,memory.used,memory.total --format=csv,noheader,nounits
    nvidia-smi [-i N] -L

Anything else: exit 2 with a line naming it, so a new query the code makes fails loudly here.
"""

from __future__ import annotations

import sys

import fakegpu

FIELDS = {
    "index": lambda d, doc: str(d["index"]),
    "pci.bus_id": lambda d, doc: d["bus_id"],
    "memory.used": lambda d, doc: str(fakegpu.used_mib(doc, d["index"])),
    "memory.total": lambda d, doc: str(d["total_mib"]),
    "name": lambda d, doc: d["name"],
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = None
    if "-i" in argv:
        only = argv[argv.index("-i") + 1]
    with fakegpu.state() as doc:
        gpus = [d for d in doc["gpus"] if only is None or str(d["index"]) == only]
        if only is not None and not gpus:
            print(f"No devices were found matching {only}", file=sys.stderr)
            return 6
        if "-L" in argv:
            for d in gpus:
                print(f"GPU {d['index']}: {d['name']} (UUID: GPU-fake-{d['index']})")
            return 0
        query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
        if query is not None and "--format=csv,noheader,nounits" in argv:
            names = query.split(",")
            if any(n not in FIELDS for n in names):
                print(f"fake nvidia-smi: unknown field in {query}", file=sys.stderr)
                return 2
            for d in gpus:
                print(", ".join(FIELDS[n](d, doc) for n in names))
            return 0
    print(f"fake nvidia-smi: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
