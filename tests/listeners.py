"""What the suite listens on: the TCP listening sockets of a process and its descendants, read from
``/proc`` (Linux), so that a test can say that nothing it started listens beyond loopback.

conftest.py runs a :class:`Watch` for the whole session (each xdist worker watches the processes it
starts); ``tests/test_loopback.py`` checks the watch itself and the suite's servers.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of each of its threads)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in (PROC / str(p) / "task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # (gone meanwhile)
                pass
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[::-1])
    return socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket ``pid`` listens on."""
    inodes = _socket_inodes(pid)
    if not inodes:
        return []
    out = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (PROC / str(pid) / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                host, port = fields[1].split(":")
                out.append((_address(host, family), int(port, 16)))
    return out


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "localhost") or address.startswith("::ffff:127.")


def _torch_store(pid: int, address: str) -> bool:
    """Whether a listener may be torch's rendezvous store (torchrun's agent, rank 0 of an
    ``env://`` group): torch binds it to ``::`` (every interface) in whichever process hosts it,
    and has no option to bind it to loopback; the tests name 127.0.0.1 as its address. Counted as
    torch's: ``::`` in a process that loaded libtorch."""
    if address != "::":
        return False
    try:
        maps = (PROC / str(pid) / "maps").read_text()
    except OSError:  # ended between the two reads: what it loaded cannot be told, so not counted
        return True
    return not maps or "libtorch" in maps  # (empty: it is exiting, a zombie has no maps; CI saw one)


def _loopback_only_namespace(pid: int) -> bool:
    """Whether ``pid`` runs in a network namespace whose only interface is loopback (``unshare -n``):
    whatever it binds (torchft's managers bind ``::``), it cannot be reached from beyond it."""
    try:
        lines = (PROC / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return False
    names = {line.split(":", 1)[0].strip() for line in lines if ":" in line}
    return names == {"lo"}


def beyond_loopback(root: int, ignored: frozenset[int] | set[int] = frozenset()) -> list[str]:
    """Each socket ``root`` or a process below it (but ``ignored``) listens on beyond loopback, as
    ``"name (pid): address:port"`` (torch's rendezvous store excepted: see :func:`_torch_store`)."""
    found = []
    for pid in descendants(root):
        if pid in ignored:
            continue
        wide = [(a, p) for a, p in listening(pid) if not is_loopback(a) and not _torch_store(pid, a)]
        if wide and _loopback_only_namespace(pid):
            wide = []
        if wide:  # still there once its maps were read (not a process that ended meanwhile)
            wide = [listener for listener in wide if listener in listening(pid)]
        for address, port in wide:
            try:
                name = (PROC / str(pid) / "comm").read_text().strip()
            except OSError:
                name = "?"
            found.append(f"{name} ({pid}): {address}:{port}")
    return found


class Watch:
    """Looks every ``period_s`` at what ``root`` and its descendants listen on; ``seen`` keeps
    each listener beyond loopback it found (listeners that live less than a period may be missed)."""

    def __init__(self, root: int | None = None, period_s: float = 1.0):
        self.root, self.period_s = root or os.getpid(), period_s
        self.seen: list[str] = []
        self.ignored: set[int] = set()  # processes a test starts to listen wide on purpose
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopback-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._look()

    def _look(self) -> None:
        for item in beyond_loopback(self.root, self.ignored):
            if item not in self.seen:
                self.seen.append(item)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._look()
