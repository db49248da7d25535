"""Who may talk to a run's actor systems over ZeroMQ: per-run CURVE keys, a ZAP handler, private ``ipc://``
directories (docs/live.md, "Security").

Every process of a run has a CURVE key pair (RFC 26) in one ``0700`` directory as pyzmq's certificate files
(``NAME.key``, ``NAME.key_secret`` ``0600``): :meth:`RunKeys.generate` writes them, :meth:`RunKeys.load` reads one
process's secret and every public key; a ROUTER is a CURVE server and each DEALER a client of its peer's key, and a
ZAP handler (RFC 27, :func:`start_authenticator`) admits the run's keys only. Without keys ``tcp://`` and abstract
``ipc://@`` endpoints are refused unless ``insecure=True``; :func:`check_private_ipc` refuses an ``ipc://`` socket
whose directory others could reach (the sticky bit does not make a directory private: others could still take the
socket's name or connect). :func:`is_wildcard` tells a bind on all interfaces, which is warned about."""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from dualpath_emu.errors import SecurityError

__all__ = [
    "PUBLIC_SUFFIX", "SECRET_SUFFIX", "ZAP_DOMAIN", "BoundedLog", "RunAuthenticator", "RunKeys", "SecurityError",
    "check_private_ipc", "check_process_name", "is_wildcard", "start_authenticator"
]  # fmt: skip

PUBLIC_SUFFIX: Final = ".key"  # pyzmq's name for a public certificate file: ``NAME.key``.
SECRET_SUFFIX: Final = ".key_secret"  # pyzmq's name for a secret certificate file: ``NAME.key_secret``.

ZAP_DOMAIN: Final = "dualpath-emu"  # The ZAP domain of a run's CURVE servers (:meth:`RunKeys.make_server`).

_PRIVATE_BITS: Final = stat.S_IRWXG | stat.S_IRWXO  # 0o077: any permission for the group or others
_KEY_Z85_BYTES: Final = 40  # a 32-byte key in Z85

_log = logging.getLogger(__name__)


class BoundedLog:
    """Counts occurrences of one thing and logs them boundedly (the first ones, then summaries)."""

    def __init__(
        self, logger: logging.Logger, what: str, *, first: int = 100, interval_s: float = 10.0, detail_chars: int = 300,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.logger = logger
        self.what = what
        self.first = first
        self.interval_s = interval_s
        self.detail_chars = detail_chars
        self.count = 0
        self._clock = clock
        self._next_power = 10
        while self._next_power <= first:
            self._next_power *= 10
        self._last_line_s = clock()
        self._logged_count = 0

    def note(self, detail: str) -> str | None:
        """Count one; the text to record as an event, or None when it is only counted."""
        self.count += 1
        count = self.count
        if len(detail) > self.detail_chars:
            detail = detail[: self.detail_chars] + f"... ({len(detail):,} characters)"
        if count <= self.first:
            self._logged_count = count
            self._last_line_s = self._clock()
            self.logger.warning("%s: %s", self.what, detail)
            return detail
        if count == self._next_power:
            self._next_power *= 10
            return self._summary(f"so far, the first {self.first} logged one by one; the latest: {detail}")
        if self._clock() - self._last_line_s >= self.interval_s:
            self._summary(f"so far, the first {self.first} logged one by one; the latest: {detail}")
        return None

    def flush(self) -> None:
        """Log the count if some occurrences were not logged yet (e.g. when the transport closes)."""
        if self.count > self._logged_count:
            self._summary(f"in all, the first {self.first} logged one by one")

    def _summary(self, tail: str) -> str:
        self._logged_count = self.count
        self._last_line_s = self._clock()
        text = f"{self.count:,} {tail}"
        self.logger.warning("%s: %s", self.what, text)
        return text


def check_process_name(name: object) -> str:
    """``name`` if it is a valid process name (letters, digits, ``-``, ``_``); else :class:`SecurityError`."""
    if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise SecurityError(f"process name {name!r}: expected a non-empty name of letters, digits, '-' and '_'")
    if name.startswith("-"):
        raise SecurityError(f"process name {name!r}: expected a name that does not begin with '-'")
    return name


def _owner_problem(path: Path, st: os.stat_result) -> str | None:
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    if euid is not None and st.st_uid != euid:
        return f"{path} belongs to uid {st.st_uid}, not to you (uid {euid})"
    return None


def _private_file(path: Path, what: str) -> None:
    """``path`` must be a regular file (not a link) of the user's that the group and others cannot use."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SecurityError(f"{path}: no such file ({what})") from None
    except OSError as error:
        raise SecurityError(f"{path}: cannot read {what}: {error.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecurityError(f"{path}: expected a regular file ({what}), not a link or another kind of file")
    problem = _owner_problem(path, st)
    if problem is not None:
        raise SecurityError(f"{problem} ({what})")
    if st.st_mode & _PRIVATE_BITS:
        raise SecurityError(
            f"{path}: {what} is accessible by others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"expected 0600 (chmod 600 {path})"
        )


def _private_directory(directory: Path) -> None:
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise SecurityError(
            f"{directory}: no such directory (make a run's keys with `dualpath-emu keys DIR --process NAME ...`)"
        ) from None
    except OSError as error:
        raise SecurityError(f"{directory}: cannot read the keys directory: {error.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SecurityError(f"{directory}: expected the directory of a run's keys, not a file")
    problem = _owner_problem(directory, st)
    if problem is not None:
        raise SecurityError(problem)
    if st.st_mode & _PRIVATE_BITS:
        raise SecurityError(
            f"{directory}: the keys directory is accessible by others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"expected 0700 (chmod 700 {directory})"
        )


def _read_certificate(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise SecurityError(f"{path}: not a ZeroMQ certificate: {error}") from None
    for key, which in ((public, "public"), (secret, "secret")):
        if key is None:
            continue
        try:
            if len(key) != _KEY_Z85_BYTES or len(z85.decode(key)) != 32:
                raise ValueError
        except (ValueError, TypeError, KeyError):
            raise SecurityError(f"{path}: its {which} key is not a 40-character Z85 CURVE key") from None
    return public, secret


class RunKeys:
    """The CURVE key pairs of one run's processes, in a directory readable by the user only.

    An instance is one process's view: :attr:`own` (the process it acts as), whose secret key it holds, and
    the public key of every process in :attr:`names`. Keys are Z85 text (40 bytes), as pyzmq's socket
    options take them. The repr shows no key."""

    __slots__ = ("directory", "own", "names", "_public", "_secrets")

    directory: Path
    own: str
    names: tuple[str, ...]

    def __init__(self, directory: Path, own: str, public: Mapping[str, bytes], secrets: Mapping[str, bytes]) -> None:
        if own not in public or own not in secrets:
            raise SecurityError(f"{directory}: no key pair for process {own!r}")
        self.directory = directory
        self.own = own
        self.names = tuple(sorted(public))
        self._public = dict(public)
        self._secrets = dict(secrets)

    def __repr__(self) -> str:
        return f"RunKeys(directory={str(self.directory)!r}, own={self.own!r}, names={self.names!r})"

    @classmethod
    def generate(cls, directory: Path, names: Iterable[str]) -> RunKeys:
        """Write a new key pair for each of ``names`` into ``directory`` (created, or empty: never over another
        run's keys) and return the keys as the first name's process. The directory is made ``0700`` before each
        secret file (``0600``) is written in it. :class:`SecurityError` for a bad or repeated name, a directory
        that is not empty or not the user's, or an OS error."""
        directory = Path(directory)
        wanted = [check_process_name(name) for name in names]
        if not wanted:
            raise SecurityError("a run's keys need at least one process name")
        repeated = sorted({name for name in wanted if wanted.count(name) > 1})
        if repeated:
            raise SecurityError(f"process name {repeated[0]!r} is given more than once")
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(directory)
            if not stat.S_ISDIR(st.st_mode):
                raise SecurityError(f"{directory}: expected a directory for the keys, not a file")
            problem = _owner_problem(directory, st)
            if problem is not None:
                raise SecurityError(problem)
            if any(directory.iterdir()):
                raise SecurityError(
                    f"{directory}: not empty; a run's keys go in a new or empty directory (they are never "
                    "written over another run's keys)"
                )
            os.chmod(directory, 0o700)  # an existing empty directory, or a umask that masked mkdir's mode
            public: dict[str, bytes] = {}
            secrets: dict[str, bytes] = {}
            for name in wanted:
                public_file, secret_file = zmq.auth.create_certificates(directory, name)
                os.chmod(secret_file, 0o600)
                os.chmod(public_file, 0o600)  # nothing secret, but the directory is private anyway
                public[name], secret = zmq.auth.load_certificate(secret_file)
                assert secret is not None
                secrets[name] = secret
        except OSError as error:
            raise SecurityError(f"{directory}: cannot write the keys: {error.strerror or error}") from None
        return cls(directory, wanted[0], public, secrets)

    @classmethod
    def load(cls, directory: Path, own: str) -> RunKeys:
        """Process ``own``'s secret key and every public key from ``directory``, checked first."""
        directory = Path(directory)
        check_process_name(own)
        _private_directory(directory)
        secret_path = directory / f"{own}{SECRET_SUFFIX}"
        _private_file(secret_path, f"the secret key of process {own!r}")
        own_public, secret = _read_certificate(secret_path)
        if secret is None:
            raise SecurityError(f"{secret_path}: holds no secret key")
        public: dict[str, bytes] = {}
        try:
            files = sorted(directory.glob(f"*{PUBLIC_SUFFIX}"))
        except OSError as error:
            raise SecurityError(f"{directory}: cannot list the keys: {error.strerror}") from None
        for path in files:
            name = path.name[: -len(PUBLIC_SUFFIX)]
            try:
                check_process_name(name)
            except SecurityError:
                raise SecurityError(f"{path}: not named after a process (NAME{PUBLIC_SUFFIX})") from None
            _private_file(path, f"the public key of process {name!r}")  # nobody else may add or change one
            public[name], _ = _read_certificate(path)
        if own not in public:
            raise SecurityError(f"{directory / (own + PUBLIC_SUFFIX)}: no such file (the public key of {own!r})")
        if public[own] != own_public:
            raise SecurityError(f"{directory}: {own}{PUBLIC_SUFFIX} and {own}{SECRET_SUFFIX} hold different keys")
        return cls(directory, own, public, {own: secret})

    def as_process(self, name: str) -> RunKeys:
        """The same run's keys as process ``name`` sees them (if this instance holds its secret key)."""
        if name not in self._secrets:
            raise SecurityError(f"{self.directory}: the secret key of process {name!r} is not loaded here")
        return RunKeys(self.directory, name, self._public, {name: self._secrets[name]})

    def public_key(self, name: str) -> bytes:
        """Process ``name``'s public key (Z85); :class:`SecurityError` if it is not one of :attr:`names`."""
        key = self._public.get(name)
        if key is None:
            known = ", ".join(self.names)
            raise SecurityError(f"{self.directory}: no public key for process {name!r} (the run's: {known})")
        return key

    def public_keys(self) -> frozenset[bytes]:
        """Every process's public key (Z85)."""
        return frozenset(self._public.values())

    def make_server(self, socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` a CURVE server of this process's keys (before it binds), ZAP enforced."""
        socket.setsockopt(zmq.CURVE_SECRETKEY, self._secrets[self.own])
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self._public[self.own])
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def make_client(self, socket: zmq.Socket[Any], peer: str) -> None:
        """Make ``socket`` a CURVE client of this process's keys that accepts only ``peer`` as the server."""
        server_key = self.public_key(peer)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self._secrets[self.own])
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self._public[self.own])
        socket.setsockopt(zmq.CURVE_SERVERKEY, server_key)


class RunAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler in a thread (it must answer while the loop is busy), admitting the run's keys."""

    def __init__(self, context: zmq.Context[Any], public_keys: Iterable[bytes], where: str = "") -> None:
        super().__init__(context, log=logging.getLogger(f"{__name__}.zap"))
        self._run_keys = frozenset(public_keys)
        self.admitted = 0
        self.denials = BoundedLog(_log, f"denied a ZeroMQ handshake{where}")
        for domain in (ZAP_DOMAIN, "*"):  # "*": a server without a domain
            self.configure_curve_callback(domain, credentials_provider=self)

    @property
    def denied(self) -> int:
        """How many handshakes were denied."""
        return self.denials.count

    def callback(self, domain: str, key: bytes) -> bool:
        """The credentials check pyzmq calls for a CURVE client's key (Z85)."""
        if key in self._run_keys:
            self.admitted += 1
            return True
        self.denials.note(f"CURVE client key {key[:8].decode('ascii', 'replace')}... is not one of the run's")
        return False

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Deny every mechanism but CURVE (pyzmq's base class would admit NULL), then check the key."""
        if len(msg) >= 6 and msg[5] != b"CURVE":
            self.denials.note(f"mechanism {msg[5][:16]!r} from {msg[3][:64]!r}: only CURVE is admitted")
            self._send_zap_reply(msg[1], b"400", b"CURVE only")
            return
        await super().handle_zap_message(msg)

    def stop(self) -> None:
        """Stop the handler's thread and close its sockets; log the final count of denials."""
        super().stop()
        self.denials.flush()


def start_authenticator(context: zmq.Context[Any], keys: RunKeys) -> RunAuthenticator:
    """Start a ZAP handler admitting only ``keys``' run's keys, before a CURVE server binds (``.stop()`` it last)."""
    authenticator = RunAuthenticator(context, keys.public_keys(), f" for process {keys.own!r}")
    authenticator.start()
    return authenticator


def _host_of(host_or_endpoint: str) -> str:
    text = host_or_endpoint.strip()
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "tcp":
            return rest  # ipc, inproc: never a wildcard address
        text = rest
        if text.startswith("["):
            return text[1 : text.find("]")] if "]" in text else text
        return text.rsplit(":", 1)[0] if ":" in text else text
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    return text


def is_wildcard(host_or_endpoint: str) -> bool:
    """Whether a host (``0.0.0.0``, ``*``, ``::``, ``[::]``, ``""``) or tcp endpoint means every interface."""
    if "://" in host_or_endpoint and not host_or_endpoint.strip().startswith("tcp://"):
        return False
    host = _host_of(host_or_endpoint)
    if host in ("*", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified
    except ValueError:
        return False  # a name or an interface (eth0): not the wildcard


def check_private_ipc(endpoint: str) -> None:
    """Refuse (:class:`SecurityError`, naming the directory and the fix) an ``ipc://`` endpoint other users could
    reach or take over: an abstract socket, a directory not the user's or open to the group or others, or one below
    a directory others may write to without the sticky bit. A directory that does not exist yet is the binder's to
    check: give every socket a directory made before the run (``tempfile.mkdtemp``)."""
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"not an ipc:// endpoint: {endpoint!r}")
    path = endpoint[len("ipc://") :]
    if path.startswith("@"):
        raise SecurityError(
            f"{endpoint}: an abstract socket has no permissions, any local process can connect; use a path in a "
            "private directory, or keys"
        )
    directory = Path(os.path.abspath(path)).parent
    try:
        st: os.stat_result | None = os.stat(directory)
    except FileNotFoundError:
        st = None  # not there (yet): a bind fails with ENOENT, a connection waits for the peer's bind
    except OSError as error:
        raise SecurityError(f"{endpoint}: cannot use the socket's directory {directory}: {error.strerror}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise SecurityError(f"{endpoint}: cannot use the socket's directory {directory}: not a directory")
        problem = _owner_problem(directory, st)
        if problem is not None:
            raise SecurityError(f"{endpoint}: {problem}; ipc sockets go in a directory of yours")
        if st.st_mode & _PRIVATE_BITS:
            raise SecurityError(
                f"{endpoint}: the socket's directory {directory} is accessible by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); use a directory only you can use (chmod 700 {directory}, "
                "or tempfile.mkdtemp()), or keys"
            )
    for ancestor in directory.parents:
        try:
            mode = os.stat(ancestor).st_mode
        except OSError:
            continue  # cannot look: the OS will refuse to reach the socket through it as well
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            raise SecurityError(
                f"{endpoint}: {ancestor} (above the socket's directory) is writable by others without the sticky "
                f"bit (mode {stat.S_IMODE(mode):04o}), so they could replace {directory}; use another directory"
            )
