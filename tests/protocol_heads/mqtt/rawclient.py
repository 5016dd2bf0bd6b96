"""A scripted MQTT client on a real socket for the hostile-client tests: packets built with our codec, replies
read with our decoder, and the socket's own knobs (source address, receive buffer, reset) within reach."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct

from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import MQTT_311, Connect, Packet


class RawClient:
    """``await RawClient.open(port)``; ``send(packet)``; ``await next()`` for the next packet from the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, level: int) -> None:
        self.reader = reader
        self.writer = writer
        self.level = level
        self._decoder = Decoder(protocol_level=level)
        self._packets: list[Packet] = []

    @classmethod
    async def open(
        cls, port: int, *, level: int = MQTT_311, source: str | None = None, tls: ssl.SSLContext | None = None
    ) -> RawClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source is not None:
            sock.bind((source, 0))  # 127.0.0.2 and up: another source address on loopback (Linux)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, ssl=tls, server_hostname="localhost" if tls else None)
        return cls(reader, writer, level)

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, self.level))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def login(self, connect: Connect) -> Packet:
        self.send(connect)
        return await self.next()

    async def next(self, timeout_s: float = 10.0) -> Packet:
        """The next packet; raises EOFError when the server closed the connection first."""
        async with asyncio.timeout(timeout_s):
            while not self._packets:
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("the server closed the connection")
                self._packets.extend(self._decoder.receive_data(data))
        return self._packets.pop(0)

    async def closed_by_server(self, timeout_s: float = 10.0) -> bool:
        """Read until the server closes (EOF or reset); True once it has."""
        async with asyncio.timeout(timeout_s):
            try:
                while await self.reader.read(65536):
                    pass
            except ConnectionError:
                pass
        return True

    def reset(self) -> None:
        """Vanish as a crashed client does: RST, not FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass
