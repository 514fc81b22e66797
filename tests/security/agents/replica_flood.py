"""Hostile Rune process tool: connects to its agent's gateway socket as fast as it can.

For ``seconds`` (from its input) it connects, reads until the daemon closes, and connects again.
Answers ``{"connections": N, "answered": M}``: how many connections the daemon took, and how many of
them it answered (a 403) instead of closing at once.
"""

import json
import os
import socket
import sys
import time

arguments = json.load(sys.stdin)
path = os.path.join(arguments["folder"], "gateway.sock")
ends = time.monotonic() + float(arguments["seconds"])
connections = answered = 0
while time.monotonic() < ends:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    connections += 1
    answered += data.startswith(b"HTTP/1.1 403")
print(json.dumps({"connections": connections, "answered": answered}))
