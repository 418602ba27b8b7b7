"""Benchmark: in-process AMD probe + labels on the real 63-partition MI300X CPX capture.

The capture is replayed as the built-in profile ``mi300x-x8-cpx`` builds it: the capture plus the
PCI entries a real /sys has (the probe refuses a host root without them).

Budget: median and p95 <= 50 ms. Prints figures; it is not a test.

    python tests/bench/bench_amd_probe.py [--runs 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from labeller.model import sharing
from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.nodelabels import node_labels
from vendors import VENDORS, pci
from vendors.amd import probe as amd
from vendors.simulate import simulated_node

GPU_CLASSES = {vendor.discovery.pci_vendor_id: vendor.discovery.pci_classes for vendor in VENDORS}

PROFILE = "mi300x-x8-cpx"  # vendors/profiles/sysfs/mi300x-x8-cpx, the real capture
BUDGET_MS = 50.0


def one_run(root: Path, config: Config) -> float:
    start = time.perf_counter()
    pci_gpus, _ = pci.scan(root, GPU_CLASSES)
    part, report = amd.probe(root, pci_gpus, config)
    inventory = Inventory(pci_gpus=pci_gpus, parts=(part,) if part else (), reports=(report,))
    labels = node_labels(inventory, config, sharing.derive(inventory, config, VENDORS), VENDORS)
    elapsed = (time.perf_counter() - start) * 1000
    if part is None or len(labels.labels) < 10:
        raise SystemExit(f"unexpected result: {report}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    config = Config()
    with simulated_node(PROFILE) as node:
        cold = one_run(node.host_root, config)  # includes parsing amdgpu.ids once
        times = sorted(one_run(node.host_root, config) for _ in range(args.runs))
    median = statistics.median(times)
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    verdict = "OK" if p95 <= BUDGET_MS else "OVER BUDGET"
    print(f"AMD probe+labels, MI300X CPX capture (63 partitions), {args.runs} runs: "
          f"cold {cold:.2f} ms, median {median:.2f} ms, p95 {p95:.2f} ms; budget {BUDGET_MS:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
