"""What a host's NVIDIA GPUs are and how they are, read from one gathering command (pure but for `gather_command`).

One shell command (`gather_command`) collects everything on the host in one round trip: `nvidia-smi -q -x`, the
PCI devices from sysfs (lspci is not on every host), the kernel module's version, Xid events from the kernel log,
the NCCL/cuDNN/CUDA packages (Debian packages and pip wheels) and NCCL's own version through its library.
testinfra's `host.run` and the launcher's ssh both run it; `host_facts` turns its output into one JSON-ready dict,
and `problems` judges a host's health from that dict alone, without kiln's version matrix.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass

MARK = "### kiln-gpu"
NVIDIA_VENDOR = "0x10de"
GPU_ABSENT_RC = 3  # a section that needs an NVIDIA device, on a host without one (gather_command)
_GPU_HERE = (f"{{ [ -e /dev/nvidiactl ] || grep -qsx {NVIDIA_VENDOR} /sys/bus/pci/devices/*/vendor || "
             f"{{ echo 'no NVIDIA device on this host'; exit {GPU_ABSENT_RC}; }}; }}")
# PCI classes of a GPU: 0x0300 VGA controller, 0x0302 3D controller (the data-centre parts).
GPU_CLASSES = ("0x0300", "0x0302")
SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
DEB_PACKAGES = re.compile(r"^(libnccl2|libcudnn\d+(-cuda-\d+)?|cuda-toolkit-\d+-\d+|cuda-cudart-\d+-\d+|"
                          r"nvidia-driver-\d+\S*|nvidia-container-toolkit) ")
WHEELS = ("nvidia-nccl-", "nvidia-cudnn-", "nvidia-cuda-runtime", "tensorflow", "torch", "jax", "cupy", "horovod")

_WHEELS_CODE = (
    "import importlib.metadata as m, json\n"
    f"wanted = {WHEELS!r}\n"
    "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()\n"
    "                  if (d.metadata['Name'] or '').lower().startswith(wanted)}))\n"
)
_NCCL_CODE = (
    "import ctypes\n"
    "lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); lib.ncclGetVersion(ctypes.byref(v)); v = v.value\n"
    "major, rest = divmod(v, 10000 if v >= 10000 else 1000)\n"
    "print(f'{major}.{rest // 100}.{rest % 100}')\n"
)


def gather_command(python: str = "python3", timeout: int = 60) -> str:
    """One POSIX shell command printing every section as `### kiln-gpu NAME`, its output, `### kiln-gpu-rc N`. The
    two that start the host's Python (its wheels, NCCL's version) run only where an NVIDIA device is (a driver's
    control node or an NVIDIA device on the PCI bus): elsewhere they say so and end with GPU_ABSENT_RC (a CPU
    node's Python, under TCG a booted image's, took 20 s to list its wheels for nothing)."""
    sections = {
        "smi": f"timeout {timeout} nvidia-smi -q -x",
        "pci": 'for d in /sys/bus/pci/devices/*; do [ -r "$d/class" ] && '
               'echo "${d##*/} $(cat "$d/vendor") $(cat "$d/class")"; done',
        "module": "cat /proc/driver/nvidia/version",
        "kernel_log": 'log=$(dmesg 2>/dev/null || sudo -n dmesg) || exit 1; '
                      "printf '%s\\n' \"$log\" | grep -E 'NVRM: Xid' | tail -n 50; true",
        "debs": "dpkg-query -W -f '${Package} ${Version}\\n' | grep -E '^(libnccl|libcudnn|cuda-|nvidia-)'; true",
        "cuda_toolkit": "cat /usr/local/cuda/version.json 2>/dev/null || /usr/local/cuda/bin/nvcc --version",
        "wheels": f"{_GPU_HERE} && timeout {timeout} {shlex.quote(python)} -c {shlex.quote(_WHEELS_CODE)}",
        "nccl_library": f"{_GPU_HERE} && timeout {timeout} {shlex.quote(python)} -c {shlex.quote(_NCCL_CODE)}",
    }
    return "; ".join(f"echo '{MARK} {name}'; ( {command} ) 2>&1; echo \"{MARK}-rc $?\""
                     for name, command in sections.items())


@dataclass(frozen=True)
class Section:
    rc: int
    text: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def split_sections(output: str) -> dict[str, Section]:
    """The gathering command's output, section by section."""
    sections: dict[str, Section] = {}
    name, lines = None, []
    for line in output.splitlines():
        if line.startswith(f"{MARK}-rc ") and name:
            sections[name] = Section(int(line.split()[-1]), "\n".join(lines))
            name, lines = None, []
        elif line.startswith(f"{MARK} "):
            name, lines = line.split(maxsplit=2)[2], []
        elif name:
            lines.append(line)
    return sections


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    bus_id: str
    architecture: str | None
    memory_mib: dict[str, int | None]
    persistence_mode: bool | None
    ecc_enabled: bool | None
    ecc_uncorrectable: dict[str, int | None]
    ecc_correctable_volatile: int | None
    retired_pages: dict[str, int | bool | None]
    remapped_rows: dict[str, int | bool | None]
    clocks_mhz: dict[str, int | None]
    slowdowns: list[str]
    temperature_c: int | None
    power_w: dict[str, float | None]
    pcie: dict[str, int | None]
    mig: bool | None
    compute_processes: int = 0


@dataclass(frozen=True)
class SmiReport:
    driver: str | None
    cuda: str | None
    gpus: list[Gpu]


def _number(text: str | None) -> float | None:
    """The number at the start of `81559 MiB`, `50 C`, `16x`; None for N/A and the like."""
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", text or "")
    return float(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _flag(text: str | None, yes: tuple[str, ...] = ("yes", "enabled", "active")) -> bool | None:
    word = (text or "").strip().lower()
    if word in yes:
        return True
    if word in ("no", "disabled", "not active"):
        return False
    return None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uncorrectable(counters: ElementTree.Element | None) -> int | None:
    """Uncorrectable ECC errors in one counter group, across drivers: newer ones split SRAM/DRAM
    (`dram_uncorrectable`, `sram_uncorrectable_*`), older ones count `double_bit/total`."""
    if counters is None:
        return None
    values = [_int(e.text) for e in counters.iter() if "uncorrectable" in e.tag and len(e) == 0]
    double_bit = counters.find("double_bit/total")
    if double_bit is not None:
        values.append(_int(double_bit.text))
    return _sum(values)


def _correctable(counters: ElementTree.Element | None) -> int | None:
    if counters is None:
        return None
    values = [_int(e.text) for e in counters.iter() if e.tag.endswith("_correctable") and len(e) == 0]
    single_bit = counters.find("single_bit/total")
    if single_bit is not None:
        values.append(_int(single_bit.text))
    return _sum(values)


def _gpu(index: int, element: ElementTree.Element) -> Gpu:
    text = element.findtext
    reasons = element.find("clocks_event_reasons")
    if reasons is None:  # drivers before 535 call them throttle reasons
        reasons = element.find("clocks_throttle_reasons")
    active = []
    for reason in reasons if reasons is not None else []:
        name = re.sub(r"^clocks_(event|throttle)_reason_", "", reason.tag)
        if _flag(reason.text) and name != "gpu_idle":
            active.append(name)
    power = element.find("gpu_power_readings")
    if power is None:
        power = element.find("power_readings")
    power_text = power.findtext if power is not None else (lambda _path: None)
    return Gpu(
        index=index,
        name=(text("product_name") or "").strip(),
        uuid=(text("uuid") or "").strip(),
        bus_id=(element.get("id") or text("pci/pci_bus_id") or "").strip(),
        architecture=(text("product_architecture") or "").strip() or None,
        memory_mib={part: _int(text(f"fb_memory_usage/{part}")) for part in ("total", "used", "free")},
        persistence_mode=_flag(text("persistence_mode")),
        ecc_enabled=_flag(text("ecc_mode/current_ecc")),
        ecc_uncorrectable={"volatile": _uncorrectable(element.find("ecc_errors/volatile")),
                           "aggregate": _uncorrectable(element.find("ecc_errors/aggregate"))},
        ecc_correctable_volatile=_correctable(element.find("ecc_errors/volatile")),
        retired_pages={
            "single_bit": _int(text("retired_pages/multiple_single_bit_retirement/retired_count")),
            "double_bit": _int(text("retired_pages/double_bit_retirement/retired_count")),
            "pending": _flag(text("retired_pages/pending_retirement")),
        },
        remapped_rows={
            "correctable": _int(text("remapped_rows/remapped_row_corr")),
            "uncorrectable": _int(text("remapped_rows/remapped_row_unc")),
            "pending": _flag(text("remapped_rows/remapped_row_pending")),
            "failure": _flag(text("remapped_rows/remapped_row_failure")),
        },
        clocks_mhz={"sm": _int(text("clocks/sm_clock")), "memory": _int(text("clocks/mem_clock")),
                    "max_sm": _int(text("max_clocks/sm_clock")), "max_memory": _int(text("max_clocks/mem_clock"))},
        slowdowns=active,
        temperature_c=_int(text("temperature/gpu_temp")),
        power_w={"draw": _number(power_text("instant_power_draw") or power_text("power_draw")),
                 "limit": _number(power_text("current_power_limit") or power_text("power_limit"))},
        pcie={"gen": _int(text("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
              "max_gen": _int(text("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
              "width": _int(text("pci/pci_gpu_link_info/link_widths/current_link_width")),
              "max_width": _int(text("pci/pci_gpu_link_info/link_widths/max_link_width"))},
        mig=_flag(text("mig_mode/current_mig")),
        compute_processes=len(element.findall("processes/process_info")),
    )


def parse_smi_xml(text: str) -> SmiReport:
    """`nvidia-smi -q -x`: the driver, the CUDA version the driver supports, and every GPU."""
    start = min((i for i in (text.find("<?xml"), text.find("<nvidia_smi_log")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"not nvidia-smi XML: {text.strip()[:200]!r}")
    root = ElementTree.fromstring(text[start:])
    gpus = [_gpu(i, element) for i, element in enumerate(root.findall("gpu"))]
    return SmiReport(driver=(root.findtext("driver_version") or "").strip() or None,
                     cuda=(root.findtext("cuda_version") or "").strip() or None, gpus=gpus)


def parse_pci_gpus(text: str) -> list[str]:
    """NVIDIA display controllers among `ADDRESS VENDOR CLASS` lines (from /sys/bus/pci/devices)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1].lower() == NVIDIA_VENDOR and fields[2].lower()[:6] in GPU_CLASSES:
            found.append(fields[0])
    return found


def parse_module_version(text: str) -> dict[str, str | None]:
    """/proc/driver/nvidia/version: the kernel module's version, and whether it is the open one."""
    match = re.search(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    if not match:
        return {"version": None, "flavour": None}
    return {"version": match.group(1), "flavour": "open" if "Open Kernel Module" in match.group(0) else "proprietary"}


def parse_cuda_toolkit(text: str) -> str | None:
    """The toolkit's version from /usr/local/cuda/version.json (`12.5.1`), else from `nvcc --version`
    (`V13.0.88`: CUDA 13 ships no version.json)."""
    if text.strip().startswith("{"):
        return json.loads(text).get("cuda", {}).get("version")
    match = re.search(r"\bV(\d+\.\d+\.\d+)", text)
    return match.group(1) if match else None


def parse_xid(text: str) -> list[dict[str, str | int]]:
    """Xid events in kernel log lines: `NVRM: Xid (PCI:0000:00:06): 79, pid=..., GPU has fallen off the bus.`"""
    events = []
    for line in text.splitlines():
        match = re.search(r"NVRM: Xid \((?:PCI:)?([^)]*)\): (\d+),\s*(.*)", line)
        if match:
            events.append({"pci": match.group(1), "xid": int(match.group(2)), "text": match.group(3).strip()})
    return events


# What an Xid event means for the node, by NVIDIA's Xid catalog's "Resolution Bucket (Immediate Action)" (r590),
# as awslabs/awsome-distributed-ai's GPU cluster health check encodes it
# (4.validation_and_observability/2.gpu-cluster-healthcheck/checks/0-nvidia-smi-check.sh): the program's own
# fault (restart the program; the node is fine), reset the GPU, reboot the node, replace the node, or a record
# that asks for nothing now. Codes not listed are judged as "unknown" (a problem: see NVIDIA's catalog).
XID_APPLICATION, XID_RESET, XID_REBOOT, XID_REPLACE, XID_RECORD = (
    "an application error (restart the program; the node is fine)", "reset the GPU", "reboot the node",
    "replace the node", "recorded, no action now")
XID_CLASSES = {
    # 45 (preemptive cleanup): logged when a GPU process is ended, killed or after another error (that error,
    # if any, is an event of its own)
    8: XID_APPLICATION, 11: XID_APPLICATION, 13: XID_APPLICATION, 31: XID_APPLICATION, 43: XID_APPLICATION,
    45: XID_APPLICATION,
    94: XID_APPLICATION, 126: XID_APPLICATION,
    48: XID_RESET, 64: XID_RESET, 74: XID_RESET, 95: XID_RESET, 109: XID_RESET, 110: XID_RESET, 119: XID_RESET,
    120: XID_RESET, 136: XID_RESET, 140: XID_RESET, 143: XID_RESET, 155: XID_RESET, 156: XID_RESET,
    158: XID_RESET,
    79: XID_REBOOT, 151: XID_REBOOT, 168: XID_REBOOT,
    54: XID_REPLACE,
    63: XID_RECORD, 92: XID_RECORD, 121: XID_RECORD, 162: XID_RECORD, 163: XID_RECORD, 164: XID_RECORD,
    165: XID_RECORD,
}
NODE_FINE = (XID_APPLICATION, XID_RECORD)
_RECOVERY = re.compile(r"recovery action changed from .* to 0x[0-9a-f]+ \(([^)]*)\)", re.IGNORECASE)


def xid_class(code: int, text: str = "") -> str:
    """What Xid `code` asks of the node (XID_CLASSES); Xid 154 says it itself: `GPU recovery action changed from
    0x0 (None) to 0x1 (GPU Reset Required)`."""
    if code == 154:
        match = _RECOVERY.search(text)
        action = match.group(1).lower() if match else ""
        if "reboot" in action:
            return XID_REBOOT
        if "reset" in action or "drain" in action:
            return XID_RESET
        if action == "none":
            return XID_RECORD
    return XID_CLASSES.get(code, "unknown (see NVIDIA's Xid catalog)")


def xid_findings(facts: dict) -> tuple[list[str], list[str]]:
    """(problems, notes) of the kernel log's Xid events: those that ask something of the node are problems;
    a program's own fault and a mere record are notes."""
    found, notes = [], []
    for event in facts.get("xid", {}).get("events", []):
        kind = xid_class(int(event["xid"]), str(event["text"]))
        line = f"Xid {event['xid']} on {event['pci']}: {event['text']} ({kind})"
        (notes if kind in NODE_FINE else found).append(line)
    return found, notes


def parse_debs(text: str) -> dict[str, str]:
    """The GPU stack's Debian packages among `PACKAGE VERSION` lines."""
    return {line.split()[0]: line.split()[1] for line in text.splitlines()
            if DEB_PACKAGES.match(line) and len(line.split()) >= 2}


def _upstream(version: str) -> str:
    """`2.28.3-1+cuda13.0` -> `2.28.3` (a Debian version's upstream part)."""
    return version.split(":")[-1].split("-")[0]


def _library(name: str, debs: dict[str, str], wheels: dict[str, str], loaded: str | None,
             deb_pattern: str, wheel_prefix: str) -> dict:
    found = {}
    if loaded:
        found["library"] = loaded
    for package, version in sorted(debs.items()):
        if re.match(deb_pattern, package):
            found[f"deb {package}"] = _upstream(version)
    for package, version in sorted(wheels.items()):
        if package.startswith(wheel_prefix):
            found[f"wheel {package}"] = version
    version = next(iter(found.values()), None)
    return {"version": version, "found": found} if found else {"version": None, "found": {}, "why": f"no {name}"}


def host_facts(output: str) -> dict:
    """Everything the gathering command found, as one JSON-ready dict (what `--facts-json` writes)."""
    sections = split_sections(output)
    missing = Section(127, "")
    smi_section = sections.get("smi", missing)
    facts: dict = {"gpus": [], "driver": {"version": None}, "cuda": {"driver_supports": None}, "errors": {}}
    if smi_section.ok:
        report = parse_smi_xml(smi_section.text)
        facts["gpus"] = [asdict(gpu) for gpu in report.gpus]
        facts["driver"]["version"] = report.driver
        facts["cuda"]["driver_supports"] = report.cuda
    else:
        facts["errors"]["nvidia-smi"] = _failure(smi_section, "nvidia-smi is not installed")
    facts["pci_gpus"] = parse_pci_gpus(sections.get("pci", missing).text)
    module = sections.get("module", missing)
    facts["driver"]["module"] = parse_module_version(module.text) if module.ok else None
    toolkit = sections.get("cuda_toolkit", missing)
    facts["cuda"]["toolkit"] = parse_cuda_toolkit(toolkit.text) if toolkit.ok else None
    kernel_log = sections.get("kernel_log", missing)
    facts["xid"] = {"readable": kernel_log.ok, "events": parse_xid(kernel_log.text)}
    debs = parse_debs(sections.get("debs", missing).text)
    wheels_section = sections.get("wheels", missing)
    wheels = json.loads(wheels_section.text.strip().splitlines()[-1]) if wheels_section.ok else {}
    nccl = sections.get("nccl_library", missing)
    loaded = nccl.text.strip().splitlines()[-1] if nccl.ok and nccl.text.strip() else None
    facts["packages"] = {"debs": debs, "wheels": wheels}
    facts["nccl"] = _library("NCCL", debs, wheels, loaded, r"libnccl2$", "nvidia-nccl-")
    facts["cudnn"] = _library("cuDNN", debs, wheels, None, r"libcudnn\d", "nvidia-cudnn-")
    return facts


def _failure(section: Section, absent: str) -> str:
    if section.rc == 127:
        return absent
    return f"exited {section.rc}: " + (section.text.strip().splitlines() or ["no output"])[-1][:300]


def problems(facts: dict, expect_gpus: int | None = None) -> list[str]:
    """What is wrong with a host's GPUs, judged from its facts alone (no version matrix): missing GPUs,
    the driver, ECC errors, pages or rows waiting for a reset, hardware slowdowns, Xid events."""
    found = []
    gpus, pci = facts.get("gpus", []), facts.get("pci_gpus", [])
    module = facts.get("driver", {}).get("module")
    if "nvidia-smi" in facts.get("errors", {}):
        found.append(f"nvidia-smi: {facts['errors']['nvidia-smi']}")
    if pci and not module:
        found.append(f"{len(pci)} NVIDIA GPU(s) on the PCI bus but the driver is not loaded "
                     "(no /proc/driver/nvidia/version)")
    smi_driver = facts.get("driver", {}).get("version")
    if module and smi_driver and module.get("version") != smi_driver:
        found.append(f"the kernel module is {module.get('version')} but nvidia-smi's library is {smi_driver}: "
                     "a driver upgrade waits for a reboot")
    if pci and len(gpus) != len(pci):
        seen = {_bus(g["bus_id"]) for g in gpus}
        lost = [address for address in pci if _bus(address) not in seen]
        found.append(f"nvidia-smi sees {len(gpus)} GPU(s), the PCI bus has {len(pci)}"
                     + (f" (not seen: {', '.join(lost)})" if lost else ""))
    if expect_gpus is not None and len(gpus) != expect_gpus:
        found.append(f"{len(gpus)} GPU(s), expected {expect_gpus}")
    for gpu in gpus:
        found += [f"GPU {gpu['index']} ({gpu['bus_id']}): {problem}" for problem in gpu_problems(gpu)]
    return found + xid_findings(facts)[0]


def gpu_problems(gpu: dict) -> list[str]:
    found = []
    volatile = gpu["ecc_uncorrectable"]["volatile"]
    if volatile:
        found.append(f"{volatile} uncorrectable ECC error(s) since the driver loaded")
    if gpu["retired_pages"]["pending"]:
        found.append("a page retirement is pending: reset the GPU or reboot")
    rows = gpu["remapped_rows"]
    if rows["failure"]:
        found.append("row remapping failed: the GPU needs service")
    elif rows["pending"]:
        found.append("a row remap is pending: reset the GPU or reboot")
    if gpu["slowdowns"]:
        active = [s for s in gpu["slowdowns"] if s in SLOWDOWNS]
        if active:
            found.append("clocks held down by " + ", ".join(active))
    return found


def _bus(address: str) -> str:
    """`00000000:00:06.0` (nvidia-smi) and `0000:00:06.0` (sysfs) name the same device."""
    domain, _, rest = address.lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("", "", domain)
    return f"{int(domain or '0', 16):04x}:{bus}:{rest}"
