"""A TCP relay across network namespaces: listens at addresses inside the real node's namespace, connects to a port on
the host's loopback. The node's kubelet reaches the API server through it (its 127.0.0.1:<port> in the namespace),
and so do the node's pods (the kubernetes Service's address, DNAT-ed in the namespace to the bridge's address).
Run by e2e/node.py as `python -m e2e.netns_forward NETNS_PATH HOST_PORT ADDRESS:PORT...`; TLS passes through untouched.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET)")


def listen_inside(netns_path: str, addresses: list[tuple[str, int]]) -> list[socket.socket]:
    """Listening sockets bound inside the namespace (a socket keeps its namespace); the thread comes back to its own."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _enter(target)
        sockets = []
        for host, port in addresses:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(256)
            sock.setblocking(False)
            sockets.append(sock)
        return sockets
    finally:
        _enter(own)
        os.close(own)
        os.close(target)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(sockets: list[socket.socket], host_port: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", host_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    servers = [await asyncio.start_server(relay, sock=sock) for sock in sockets]
    print(f"relaying {[s.getsockname() for s in sockets]} to 127.0.0.1:{host_port}", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> None:
    netns_path, host_port, *listen = argv
    addresses = [(a.rpartition(":")[0], int(a.rpartition(":")[2])) for a in listen]
    asyncio.run(serve(listen_inside(netns_path, addresses), int(host_port)))


if __name__ == "__main__":
    main(sys.argv[1:])
