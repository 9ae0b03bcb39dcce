#!/usr/bin/env python3
"""One TCP stream with and without Linux's MSG_ZEROCOPY: its rate, the sender's CPU, and how
many of the zero-copy sends the kernel copied anyway.

    python3 benches/zerocopy.py server PORT                        # on the receiving host
    python3 benches/zerocopy.py client HOST PORT plain|zc MIB KIB  # on the sending host

The client sends MIB mebibytes in sends of KIB kibibytes from one buffer (plain: ``send``;
zc: ``send`` with ``MSG_ZEROCOPY`` on a socket with ``SO_ZEROCOPY``, reading the completions
from the socket's error queue as it goes and all of them before it stops), then prints::

    zc, sends of 256 KiB: 8.51 Gbit/s, sender CPU 90 % of a core, 16384 sends, copied by the kernel 16384 of 16384

A completion flagged ``SO_EE_CODE_ZEROCOPY_COPIED`` is a send the kernel copied after all (it
does whenever the receiving socket is on the same kernel: loopback, or a veth into a network
namespace, as on `benches/cluster.sh`'s cluster), so zero copy saved nothing there. The
sender's CPU includes the kernel's work on its behalf (on a veth, the receiving side's too).
README, "Performance against the link", has a run. Linux only; the server serves one client
at a time until it is stopped.
"""

import mmap
import resource
import select
import socket
import struct
import sys
import time

# Linux's values (socket.h, errqueue.h); Python's socket module lacks most of them.
SO_ZEROCOPY = 60
MSG_ZEROCOPY = 0x4000000
MSG_ERRQUEUE = 0x2000
SO_EE_ORIGIN_ZEROCOPY = 5
SO_EE_CODE_ZEROCOPY_COPIED = 1
ENOBUFS = 105


def serve(port):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(1)
    buf = bytearray(1 << 20)
    while True:
        conn, _ = listener.accept()
        while conn.recv_into(buf):
            pass
        conn.close()


class Completions:
    """The zero-copy completions read so far from a socket's error queue."""

    def __init__(self, sock):
        self.sock = sock
        self.done = 0
        self.copied = 0

    def reap(self, block):
        """Reads what the error queue holds; with `block`, first waits (parked, at most a
        second) until it holds something: reading an empty error queue never blocks."""
        if block:
            poll = select.poll()
            poll.register(self.sock, select.POLLERR)
            poll.poll(1000)
        flags = MSG_ERRQUEUE | socket.MSG_DONTWAIT
        while True:
            try:
                _, ancillary, _, _ = self.sock.recvmsg(0, 4096, flags)
            except BlockingIOError:
                return
            for _level, _kind, data in ancillary:
                # struct sock_extended_err: errno, origin, type, code, pad, info, data
                _, origin, _, code, _, first, last = struct.unpack("IBBBBII", data[:16])
                if origin == SO_EE_ORIGIN_ZEROCOPY:
                    self.done += last - first + 1
                    if code & SO_EE_CODE_ZEROCOPY_COPIED:
                        self.copied += last - first + 1


def send(host, port, mode, mib, kib):
    chunk = kib * 1024
    view = memoryview(mmap.mmap(-1, chunk))
    sock = socket.create_connection((host, port))
    zc = mode == "zc"
    if zc:
        sock.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    completions = Completions(sock)
    sends = 0
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(mib * 1024 * 1024 // chunk):
        at = 0
        while at < chunk:
            try:
                at += sock.send(view[at:], MSG_ZEROCOPY if zc else 0)
            except OSError as e:
                if e.errno != ENOBUFS:  # too many sends not yet completed: wait for one
                    raise
                completions.reap(True)
                continue
            sends += 1
        if zc:
            completions.reap(False)
    while zc and completions.done < sends:
        completions.reap(True)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)  # the server closes once it has read everything
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    line = f"{mode}, sends of {kib} KiB: {mib * 1048576 * 8 / 1e9 / took:.2f} Gbit/s, "
    line += f"sender CPU {cpu / took * 100:.0f} % of a core, {sends} sends"
    if zc:
        line += f", copied by the kernel {completions.copied} of {completions.done}"
    print(line, flush=True)


def main(argv):
    if len(argv) == 3 and argv[1] == "server":
        serve(int(argv[2]))
    elif len(argv) == 7 and argv[1] == "client" and argv[4] in ("plain", "zc"):
        send(argv[2], int(argv[3]), argv[4], int(argv[5]), int(argv[6]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
