"""Machines for system tests: Linux network namespaces on one bridge, each with its own IP.

Each namespace has its own interfaces, addresses, ports and loopback, so a SuperLink in one and
SuperNodes in others talk over a real (virtual) Ethernet link exactly as separate hosts would, and
a process bound to a namespace's 127.0.0.1 cannot be reached from any other. Given host names, every namespace
resolves them through its own /etc/hosts (`ip netns exec` mounts /etc/netns/<namespace>/hosts over it). Needs root
and iproute2.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from fedbayes.deploy.launcher import Host


def require_root_networking() -> None:
    """Fail (never skip) with what is missing: CI runs as root with iproute2."""
    import os

    if os.geteuid() != 0:
        pytest.fail("the netns system tests create network namespaces and need root (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.fail("the netns system tests need iproute2's `ip`: apt-get install iproute2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


NETNS_ETC = Path("/etc/netns")  # iproute2's per-namespace /etc


class NetnsLab:
    """Namespaces `<tag>-<name>` on bridge `fb<tag>`, addresses 10.77.<n>.10, .11, ... in the order given.
    `host_names`: machine name -> the host names that resolve to its address, in every namespace."""

    def __init__(self, names: list[str], host_names: Mapping[str, list[str]] | None = None) -> None:
        require_root_networking()
        self.host_names = dict(host_names or {})
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"fb{self.tag}"
        self.subnet = self._free_subnet()
        self.hosts = {name: Host(f"{self.subnet}.{10 + i}", f"fb{self.tag}-{name}") for i, name in enumerate(names)}
        self._forward_rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]

    @staticmethod
    def _free_subnet() -> str:
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
        while True:
            subnet = f"10.77.{random.randint(1, 254)}"
            if f"{subnet}." not in routes:
                return subnet

    def __enter__(self) -> NetnsLab:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for index, host in enumerate(self.hosts.values()):
                veth = f"{self.bridge}v{index}"
                _ip("netns", "add", host.netns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
                _ip("link", "set", veth, "master", self.bridge, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
            self._write_hosts_files()
            # A Docker engine that ran on this machine leaves the FORWARD policy at DROP, and bridged
            # frames pass through iptables (br_netfilter): let this bridge's traffic through.
            if shutil.which("iptables"):
                subprocess.run(["iptables", "-I", *self._forward_rule], check=True, capture_output=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _write_hosts_files(self) -> None:
        if not self.host_names:
            return
        lines = ["127.0.0.1 localhost"]
        lines += [f"{self.hosts[name].address} {' '.join(names)}" for name, names in self.host_names.items()]
        for host in self.hosts.values():
            folder = NETNS_ETC / str(host.netns)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def __exit__(self, *exc_info) -> None:
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            shutil.rmtree(NETNS_ETC / str(host.netns), ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        if shutil.which("iptables"):
            subprocess.run(["iptables", "-D", *self._forward_rule], capture_output=True)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]
