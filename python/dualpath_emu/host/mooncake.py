"""KV bytes through Mooncake's Transfer Engine (``[host] transfer_engine = "mooncake"``; docs/host-backend.md).

The byte channel's chunks go as one-sided writes (``transfer_sync_write``, over the engine's TCP transport) into
a receive region the peer registered, a slot per sending peer (:data:`SLOTS` × :data:`SLOT_BYTES`, assigned in an
``mc-hello`` handshake, written as a ring); the ZeroMQ socket carries only each chunk's header, and the receiver
checks the bytes in its region as for an inline chunk.

**No authentication**: any peer that reaches the engine's transport or handshake reads and writes the registered
regions. The engine binds ``0.0.0.0``/``[::]`` whatever it is given, so :class:`MooncakeWire` redirects its
libraries' wildcard ``bind`` calls to the run's address (:func:`confine_binds`), checks in ``/proc`` that it
listens there alone (else refuses to start) and says where (:attr:`MooncakeWire.listening`)."""

from __future__ import annotations

import ctypes
import ipaddress
import mmap
import os
import socket
import struct
from pathlib import Path
from typing import Any, Final

from dualpath_emu.errors import BackendUnavailable
from dualpath_emu.host.transport import PATTERN_BYTES, pattern_region

__all__ = [
    "SLOTS",
    "SLOT_BYTES",
    "MooncakeUnavailable",
    "MooncakeWire",
    "check_available",
    "confine_binds",
    "listening_sockets",
]

SLOTS: Final = 8  # Sending peers a process can receive from.
SLOT_BYTES: Final = 8 << 20
"""The ring each sending peer writes its chunks into (a chunk is checked long before the ring comes round)."""


class MooncakeUnavailable(BackendUnavailable):
    """The Transfer Engine cannot be used here (not installed, or its native libraries are missing)."""


def check_available() -> None:
    """Raise :class:`MooncakeUnavailable` (saying what to install) unless the Transfer Engine loads here."""
    try:
        import mooncake.engine  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: F401
    except ImportError as error:
        raise MooncakeUnavailable(_missing(error)) from None


def _missing(error: ImportError) -> str:
    return (
        f"Mooncake's Transfer Engine is not usable here ({error}); install mooncake-transfer-engine-non-cuda "
        'and Debian\'s libibverbs1 (make does both), or use the default transfer engine, "zmq"'
    )


class MooncakeWire:
    """This process's Transfer Engine: its receive region and the send region with the pattern."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        try:
            from mooncake.engine import TransferEngine  # type: ignore[import-not-found,unused-ignore]
        except ImportError as error:
            raise MooncakeUnavailable(_missing(error)) from None
        address = confine_binds(host)
        before = set(listening_sockets())
        self.engine: Any = TransferEngine()
        status = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if status != 0:
            raise MooncakeUnavailable(f"Mooncake's Transfer Engine did not start on {host} (status {status})")
        self.listening = sorted(
            f"{a}:{p}" if ":" not in a else f"[{a}]:{p}" for (a, p) in listening_sockets() if (a, p) not in before
        )
        """Where the engine listens, read back from ``/proc`` (``address:port`` each)."""
        stray = [entry for entry in self.listening if entry.rsplit(":", 1)[0].strip("[]") != address]
        if stray or not self.listening:
            raise MooncakeUnavailable(
                f"Mooncake's Transfer Engine listens on {', '.join(stray) or 'nothing seen'}, "
                f"not only on {address}: refused (it has no authentication)"
            )
        self.host = host
        self.region_bytes = SLOTS * SLOT_BYTES
        self.receive = int(self.engine.allocate_managed_buffer(self.region_bytes))
        self.send = int(self.engine.allocate_managed_buffer(2 * PATTERN_BYTES))
        if not self.receive or not self.send:
            raise MooncakeUnavailable("Mooncake's Transfer Engine could not register its buffers")
        self.engine.write_bytes_to_buffer(self.send, pattern_region(), 2 * PATTERN_BYTES)

    @property
    def endpoint(self) -> str:
        """Where peers reach this engine (``host:port``)."""
        return f"{self.host}:{self.engine.get_rpc_port()}"

    def write(self, target: str, remote: int, pattern_offset: int, nbytes: int) -> None:
        """Write ``nbytes`` of the pattern to address ``remote`` of engine ``target`` (blocks: run it off the loop)."""
        status = self.engine.transfer_sync_write(target, self.send + pattern_offset, remote, nbytes)
        if status != 0:
            raise ConnectionError(f"Mooncake transfer of {nbytes} B to {target} failed (status {status})")

    def received(self, offset: int, nbytes: int) -> bytes:
        """The bytes at ``offset`` of this process's receive region."""
        data: bytes = self.engine.read_bytes_from_buffer(self.receive + offset, nbytes)
        return data

    def close(self) -> None:
        for address in (self.receive, self.send):
            if address:
                self.engine.free_managed_buffer(
                    address, self.region_bytes if address == self.receive else 2 * PATTERN_BYTES
                )
        self.receive = self.send = 0


# --- binding the engine to the run's address -------------------------------------------------------------
# Mooncake (0.3.x and its main branch) binds its handshake (transfer_metadata_plugin.cpp, INADDR_ANY) and its TCP
# transport (an asio acceptor on [::]) to every interface and takes no bind address. Its libraries call libc's
# bind through their GOT, so pointing those slots at a wrapper that swaps a wildcard address for the run's binds
# them to that address, before the engine starts; MooncakeWire then checks the result in /proc.

_AF_INET, _AF_INET6 = int(socket.AF_INET), int(socket.AF_INET6)
_BIND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, use_errno=True)
_RELOCATIONS = {62: (6, 7), 183: (1025, 1026)}
"""The GOT relocation types (GLOB_DAT, JUMP_SLOT) by ELF machine: x86-64, AArch64."""
_confined: dict[str, Any] = {}
"""The wrapper installed (kept alive here), the real bind, the address, the objects patched."""


def confine_binds(host: str) -> str:
    """Make the Transfer Engine bind ``host``'s address where it asks for every interface; returns it."""
    try:
        address = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError) as error:
        raise MooncakeUnavailable(
            f"Mooncake's Transfer Engine: cannot resolve the run's host {host!r}: {error}"
        ) from None
    if ipaddress.ip_address(address).is_unspecified:
        raise MooncakeUnavailable(
            f"Mooncake's Transfer Engine has no authentication: it is not started on {host} "
            "(every interface); give the run a host address (--host)"
        )
    _confined["address"] = address  # the wrapper reads it at each call
    if "wrapper" not in _confined:
        try:
            import mooncake.engine  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as error:
            raise MooncakeUnavailable(_missing(error)) from None
        libc = ctypes.CDLL(None, use_errno=True)
        real = _BIND(ctypes.cast(libc.bind, ctypes.c_void_p).value or 0)
        wrapper = _BIND(_bound_to_run)
        _confined.update(real=real, wrapper=wrapper, libc=libc)
        roots = _package_dirs(Path(mooncake.engine.__file__).parent)
        patched = [
            path
            for path, base in _loaded_objects()
            if any(path.startswith(r) for r in roots)
            if _patch_got(path, base, ctypes.cast(wrapper, ctypes.c_void_p).value or 0)
        ]
        if not patched:
            _confined.pop("wrapper")
            raise MooncakeUnavailable(
                "Mooncake's Transfer Engine: found no bind() of its libraries to confine to "
                f"{address}: refused (it would listen on every interface)"
            )
        _confined["patched"] = patched
    return address


def _bound_to_run(fd: int, addr: int | None, length: int) -> int:
    """bind() for the engine's libraries: a wildcard address becomes the run's; anything else as asked."""
    real = _confined["real"]
    if not addr or length < 16:
        return int(real(fd, addr, length))
    family = ctypes.c_ushort.from_address(addr).value
    asked = bytearray(ctypes.string_at(addr, length))
    run = ipaddress.ip_address(_confined["address"]).packed
    if family == _AF_INET and asked[4:8] == bytes(4) and len(run) == 4:
        asked[4:8] = run
    elif family == _AF_INET6 and length >= 24 and asked[8:24] == bytes(16):
        asked[8:24] = run if len(run) == 16 else b"\0" * 10 + b"\xff" * 2 + run  # IPv4-mapped
    else:
        return int(real(fd, addr, length))
    return int(real(fd, ctypes.create_string_buffer(bytes(asked), length), length))


def _package_dirs(package: Path) -> list[str]:
    """The folders the engine's libraries load from: the package's and the wheel's ``*.libs`` beside it."""
    return [str(package) + os.sep, *(str(p) + os.sep for p in package.parent.glob("mooncake*.libs"))]


class _LinkMap(ctypes.Structure):
    pass


_LinkMap._fields_ = [("l_addr", ctypes.c_size_t), ("l_name", ctypes.c_char_p), ("l_ld", ctypes.c_void_p),
                     ("l_next", ctypes.POINTER(_LinkMap)), ("l_prev", ctypes.POINTER(_LinkMap))]  # fmt: skip


def _loaded_objects() -> list[tuple[str, int]]:
    """Every shared object loaded in this process, with its load base (the dynamic linker's own list)."""
    libc = ctypes.CDLL(None)
    handle = ctypes.CDLL(None)._handle
    head = ctypes.POINTER(_LinkMap)()
    if libc.dlinfo(ctypes.c_void_p(handle), 2, ctypes.byref(head)) != 0:  # RTLD_DI_LINKMAP
        return []
    out = []
    node = head
    while node:
        name = node.contents.l_name
        if name:
            out.append((os.path.realpath(name.decode(errors="replace")), int(node.contents.l_addr)))
        node = node.contents.l_next
    return out


def _patch_got(path: str, base: int, target: int) -> bool:
    """Point the GOT slots of ``bind`` in the loaded object ``path`` (at ``base``) at ``target``: whether any."""
    slots = [base + offset for offset in _bind_slots(path)]
    if not slots or not target:
        return False
    libc = _confined["libc"]
    page = mmap.PAGESIZE
    for slot in slots:
        start = slot & ~(page - 1)
        writable = _writable(slot)
        if not writable and libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(page), 3) != 0:  # RELRO
            raise MooncakeUnavailable(f"Mooncake's Transfer Engine: cannot confine {path}'s bind(): mprotect failed")
        ctypes.c_void_p.from_address(slot).value = target
        if not writable:
            libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(page), 1)
    return True


def _writable(address: int) -> bool:
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return "w" in perms
    return False


def _bind_slots(path: str) -> list[int]:
    """The offsets of the GOT slots the dynamic linker fills with ``bind`` in the ELF file ``path``."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:  # 64-bit little-endian only
            return []
        machine = struct.unpack_from("<H", elf, 18)[0]
        kinds = _RELOCATIONS.get(machine)
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        if kinds is None or not shoff:
            return []
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        offsets = []
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != 4 or sections[link][1] != 11:  # SHT_RELA against SHT_DYNSYM
                continue
            symtab, strtab = sections[link], sections[sections[link][6]]
            for at in range(offset, offset + size, entsize or 24):
                r_offset, r_info = struct.unpack_from("<QQ", elf, at)
                if r_info & 0xFFFFFFFF not in kinds:
                    continue
                name_at = strtab[4] + struct.unpack_from("<I", elf, symtab[4] + (r_info >> 32) * (symtab[9] or 24))[0]
                if elf[name_at : elf.find(b"\0", name_at)] == b"bind":
                    offsets.append(r_offset)
        return offsets


def listening_sockets(pid: int | str = "self") -> dict[tuple[str, int], int]:
    """The TCP sockets process ``pid`` listens on: ``(address, port)`` to socket inode, from ``/proc``."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or int(fields[9]) not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # /proc prints 32-bit words
            ip = ipaddress.ip_address(packed)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            out[(str(ip), int(hex_port, 16))] = int(fields[9])
    return out
