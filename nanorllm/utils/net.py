"""Whether a URL names this machine, so that its requests bypass the proxy variables (HTTP_PROXY, ...).

A proxy set for a cluster cannot reach a server on this machine, and a request sent through it hands the proxy
the Bearer key it carries. 127.0.0.1 is not the only way to say "here": 0.0.0.0 and `::` (which a client
connects to as this machine), localhost, all of 127.0.0.0/8, ::1 and the addresses of the host's own
interfaces name it too. An address is the host's own when a socket can be bound to it: the kernel's answer, with
no list of interfaces to read and no packet sent.
"""

import ipaddress
import socket
from urllib.parse import urlparse


def is_local(url: str) -> bool:
    """Whether `url`'s host is this machine (by name, loopback, unspecified or one of its interface addresses)."""
    host = (urlparse(url).hostname or "").rstrip(".").lower()
    if host in ("localhost", socket.gethostname().lower()) or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than this host's: resolving it here could hang, and a proxy may be its route
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or _bindable(ip)


def _bindable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a socket can be bound to `ip` (at a free port, closed at once): only this host's addresses can."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:  # numeric: no name is looked up; a link-local address keeps its scope (fe80::1%eth0)
        address = socket.getaddrinfo(str(ip), 0, family, socket.SOCK_DGRAM, 0, socket.AI_NUMERICHOST)[0][4]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind(address)
        return True
    except OSError:
        return False
