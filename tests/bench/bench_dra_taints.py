"""Benchmark: health as device taints in the DRA plugin (issue 30). Prints figures; not a test.

The plugin on its process loop in this process (the simulated NVML's XID injection is a hook on it), probing every
second as ``dra-plugin`` does by default, against the fake API server with DRADeviceTaints on:

  - an XID to its taint on the API server, and a recovery to the taint gone: p50 and the worst, over ``--faults``
    XIDs on the 8 GPUs of dgx-h100;
  - budget: 0 ResourceSlice writes while idle (``--idle`` seconds, the issue's budget), with one GPU lost (tainted,
    it never recovers) and one gone from the probe (published tainted, held).

    python tests/bench/bench_dra_taints.py [--faults 40] [--idle 60]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from labeller.host.machine import NodeOptions, open_host  # noqa: E402
from tests.bench.bench_dra import slice_writes, wait  # noqa: E402
from tests.draplugin.conftest import NODE, Dirs, dra_config, plugin_on_loop  # noqa: E402
from tests.fakes.apiserver import FakeApiServer  # noqa: E402
from tests.fakes.drakubelet import FakeDraKubelet  # noqa: E402
from tests.plugin.profile_files import l40s_node, write_yaml  # noqa: E402

NVIDIA = "gpu.nvidia.com"
RECOVERY_S = 0.5


def taints(api: FakeApiServer, name: str) -> list[str]:
    return [t["key"] for s in api.slices(NODE, NVIDIA) for d in s["spec"]["devices"] if d["name"] == name
            for t in d.get("taints", [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=40, help="XIDs injected, one GPU at a time")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle to count writes over")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    with tempfile.TemporaryDirectory(prefix="bdt-", dir="/tmp") as folder, \
            FakeApiServer(feature_gates={"DRADeviceTaints"}) as api, FakeDraKubelet(Path(folder) / "reg") as kubelet:
        work = Path(folder)
        dirs = Dirs(work / "reg", work / "plugins", work / "cdi", work / "mps")
        config, profile = work / "config.yaml", work / "node.yaml"
        write_yaml(config, dra_config("nvidia"))
        write_yaml(profile, l40s_node(8, config=dra_config("nvidia")))
        api.create_node(NODE)
        with open_host(NodeOptions(simulate=str(profile), config_path=config)) as host, \
                plugin_on_loop(host, api.write_kubeconfig(work / "kubeconfig"), NODE, dirs, config_path=config,
                               recovery_seconds=RECOVERY_S, probe_interval=1.0) as (plugin, _, _):
            del kubelet  # registered: ready waits for it
            nvml = host.handles["nvidia"]
            names = sorted(plugin.drivers[NVIDIA].snapshot.by_name)
            tainted, untainted = [], []
            for i in range(args.faults):
                name = names[i % len(names)]
                began = time.monotonic()
                nvml.inject_xid(plugin.drivers[NVIDIA].snapshot.by_name[name].health_key, 79)
                wait(lambda name=name: taints(api, name))
                tainted.append(time.monotonic() - began)
                began = time.monotonic()
                wait(lambda name=name: not taints(api, name))
                untainted.append(time.monotonic() - began - RECOVERY_S)
            print(f"XID -> taint on the API server: p50 {statistics.median(tainted) * 1000:.1f} ms, worst "
                  f"{max(tainted) * 1000:.1f} ms ({args.faults} XIDs)")
            print(f"recovered -> taint gone: p50 {statistics.median(untainted) * 1000:.1f} ms, worst "
                  f"{max(untainted) * 1000:.1f} ms after the {RECOVERY_S:g} s recovery (the health poll is 0.05 s)")
            write_yaml(profile, l40s_node(7, config=dra_config("nvidia")))  # the last GPU gone from the probe
            wait(lambda: taints(api, names[-1]))
            # a GPU lost (it never recovers): on the NVML the edited profile was replayed with
            host.handles["nvidia"].set_lost(plugin.drivers[NVIDIA].snapshot.by_name[names[0]].health_key, True)
            wait(lambda: taints(api, names[0]) and plugin.publisher.in_sync)
            idle_from, probes = time.monotonic(), plugin.probes
            time.sleep(args.idle)
            print(f"idle {args.idle:.0f} s with a GPU lost (tainted) and one gone from the probe: "
                  f"{slice_writes(api, idle_from)} ResourceSlice writes over {plugin.probes - probes} probes "
                  "(budget: 0)")


if __name__ == "__main__":
    main()
