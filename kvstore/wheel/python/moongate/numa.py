"""``bind_to_numa_node``: runs the calling thread on one NUMA node's CPUs (Mooncake's
``mooncake.store.bind_to_numa_node``), so that the memory it touches first is allocated
there by the kernel's first-touch rule.

Mooncake also sets the thread's memory policy to prefer the node; this binds the CPUs only
(the policy needs a system call Python does not expose). A node that does not exist is
logged and changes nothing, as Mooncake's is.
"""

import logging
import os

logger = logging.getLogger(__name__)


def _cpus(node: int):
    """The CPUs of NUMA node ``node`` (its sysfs ``cpulist``), or None."""
    try:
        with open(f"/sys/devices/system/node/node{int(node)}/cpulist") as f:
            text = f.read().strip()
    except (OSError, ValueError):
        return None
    cpus = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus or None


def bind_to_numa_node(node: int) -> None:
    """Runs the calling thread on the CPUs of NUMA node ``node`` from now on."""
    cpus = _cpus(node)
    if cpus is None:
        logger.warning("bind_to_numa_node(%r): no such NUMA node; nothing changed", node)
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        logger.warning("bind_to_numa_node(%r): %s; nothing changed", node, e)
    return None
