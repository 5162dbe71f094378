"""Where a GPU sits on the host: its NUMA node, that node's CPUs, the host's RDMA devices.

Read from sysfs: a GPU's PCI address (nvidia-smi's pci.bus_id) names its device folder,
/sys/bus/pci/devices/<domain:bus:dev.fn>/numa_node; a node's CPUs are
/sys/devices/system/node/node<N>/cpulist; RDMA devices are /sys/class/infiniband/<name>.

`CONNECTOR_TAX_SYSFS` reads all of it from another folder instead of /sys: a rehearsal of a host
this machine is not (tests/fake_gpu_host.py builds one with two NUMA nodes). The CPUs such a
host names are then the ones a job may lease (serving.cpus), though this machine may lack them:
they are leased, recorded, and not pinned.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_ENV = "CONNECTOR_TAX_SYSFS"


def sysfs() -> Path:
    return Path(os.environ.get(SYSFS_ENV) or "/sys")


def rehearsed() -> bool:
    """The host's topology is read from an injected folder, not this machine's /sys."""
    return bool(os.environ.get(SYSFS_ENV))


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return sorted(set(out))


def pci_address(bus_id: str) -> str:
    """nvidia-smi's '00000000:1B:00.0' as sysfs names it: '0000:1b:00.0'."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def numa_node(bus_id: str | None) -> int | None:
    """The NUMA node of the PCI device, or None (unknown, or -1: a host without NUMA)."""
    if not bus_id:
        return None
    try:
        node = int((sysfs() / "bus/pci/devices" / pci_address(bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node: int | None) -> list[int]:
    """The CPUs of NUMA node `node` ([] when unknown)."""
    if node is None:
        return []
    try:
        return parse_cpulist((sysfs() / f"devices/system/node/node{node}/cpulist").read_text())
    except (OSError, ValueError):
        return []


def leasable_cpus() -> list[int]:
    """The CPUs a job may lease: this process's allowed set; on a rehearsed host, its CPUs."""
    if rehearsed():
        try:
            return parse_cpulist((sysfs() / "devices/system/cpu/online").read_text())
        except (OSError, ValueError):
            pass
    return sorted(os.sched_getaffinity(0))


def rdma_devices() -> list[str]:
    """The host's RDMA devices (mlx5_0, ...), as the kernel lists them."""
    try:
        return sorted(p.name for p in (sysfs() / "class/infiniband").iterdir())
    except OSError:
        return []
