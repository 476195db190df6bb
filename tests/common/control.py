"""What the Python tests share to talk to a process's control socket (docs/PROTOCOL.md): the server answers
and closes, so an answer is everything read until the end of the stream."""
import socket


def read_all(s):
    """Everything the server sends until it closes, then closes s."""
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data


def request(path, line, timeout):
    """Sends line (bytes, its newline included) to the control socket at path; returns the whole answer (bytes).
    timeout guards each socket operation against a hang; it decides nothing else."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(line)
    return read_all(s)
