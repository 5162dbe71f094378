"""A fake GPU host for tests: GPUs behind a fake `nvidia-smi`, a NUMA topology behind a fake
sysfs (CONNECTOR_TAX_SYSFS), and a `vllm` stand-in that serves with `ctax sim` (tests/fake_gpu/).

    host = FakeGpuHost(tmp_path, gpus=8, nodes=2, cpus_per_node=24)
    host.hold("2", 30000)               # a foreign process on GPU 2, until host.free("2")
    env = {**os.environ, **host.env()}  # PATH first: its nvidia-smi and vllm

Each NUMA node gets an equal share of the GPUs (lowest indexes on node 0) and `cpus_per_node`
CPUs numbered node by node; the CPUs need not exist on this machine (serving.topology: leased,
not pinned). `rdma` names fake RDMA devices under class/infiniband.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "fake_gpu"
TOTAL_MIB = 97871  # an H20's 96 GB as nvidia-smi reports it


class FakeGpuHost:
    def __init__(
        self,
        root: Path,
        gpus: int = 8,
        nodes: int = 2,
        cpus_per_node: int = 24,
        release_s: float = 3.0,
        rdma: tuple[str, ...] = (),
    ) -> None:
        self.root = Path(root)
        self.bin = self.root / "bin"
        self.sysfs = self.root / "sys"
        self.state_file = self.root / "gpu_state.json"
        self.gpus = gpus
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.bin.mkdir(parents=True, exist_ok=True)
        devices = []
        for i in range(gpus):
            node = i * nodes // gpus
            bus = f"00000000:{0x18 + 0x10 * i:02X}:00.0"
            devices.append({"index": i, "bus_id": bus, "total_mib": TOTAL_MIB, "name": "NVIDIA H20", "node": node})
            folder = self.sysfs / "bus/pci/devices" / f"0000:{0x18 + 0x10 * i:02x}:00.0"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "numa_node").write_text(f"{node}\n")
        for node in range(nodes):
            folder = self.sysfs / f"devices/system/node/node{node}"
            folder.mkdir(parents=True, exist_ok=True)
            first = node * cpus_per_node
            (folder / "cpulist").write_text(f"{first}-{first + cpus_per_node - 1}\n")
        (self.sysfs / "devices/system/cpu").mkdir(parents=True, exist_ok=True)
        (self.sysfs / "devices/system/cpu/online").write_text(f"0-{nodes * cpus_per_node - 1}\n")
        for name in rdma:
            (self.sysfs / "class/infiniband" / name).mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"gpus": devices, "holders": [], "release_s": release_s}, indent=1))
        self._script("nvidia-smi", "nvidia_smi")
        self._script("vllm", "vllm_shim")

    def _script(self, name: str, module: str) -> None:
        path = self.bin / name
        path.write_text(
            f"#!{sys.executable}\n"
            f"# connector-tax stand-in: ctax sim behind `{name}` on a fake GPU host (tests/fake_gpu/{module}.py)\n"
            f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport {module}\nsys.exit({module}.main())\n",
            encoding="utf-8",
        )
        path.chmod(0o755)

    def env(self, config: Path | None = None) -> dict[str, str]:
        out = {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "CONNECTOR_TAX_SYSFS": str(self.sysfs),
            "FAKE_GPU_STATE": str(self.state_file),
        }
        if config is not None:
            out["FAKE_VLLM_CONFIG"] = str(config)
        return out

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def _edit(self, change) -> None:
        sys.path.insert(0, str(HERE))
        try:
            import fakegpu

            with fakegpu.state(str(self.state_file)) as doc:
                change(doc)
        finally:
            sys.path.remove(str(HERE))

    def holders(self) -> list[dict[str, Any]]:
        """Who holds memory now, those gone since the last look marked with their gone_at."""
        out: list[dict[str, Any]] = []
        self._edit(lambda doc: out.extend(doc["holders"]))
        return out

    def hold(self, gpu: str, mib: int, pid: int | None = None, variant: str = "(foreign)") -> None:
        """A process outside the study holding `mib` on `gpu` (until free(), or its pid's end)."""
        self._edit(lambda doc: doc["holders"].append({"gpu": gpu, "mib": mib, "pid": pid, "variant": variant}))

    def free(self, gpu: str) -> None:
        self._edit(lambda doc: doc.update(holders=[h for h in doc["holders"] if str(h["gpu"]) != gpu]))

    def node_of(self, gpu: str) -> int:
        return int(gpu) * self.nodes // self.gpus
