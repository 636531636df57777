"""Loopback receivers for the audit's notifications: an HTTP webhook receiver, an SMTP server (aiosmtpd)
that requires STARTTLS and AUTH, a listener that accepts and never answers, and a port nothing listens on.
All on 127.0.0.1, all stopped by their context managers.

    with WebhookReceiver() as hook, MailServer(test_ca) as mail:
        ... hook.posts (the JSON documents received), mail.messages (email.message.EmailMessage)
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.lab.tlsca import TestCA

SMTP_USER, SMTP_PASSWORD = "fleetfix", "s3cret-smtp-password"


class WebhookReceiver:
    """Collects the JSON POSTed to it; answers `status` (200 by default)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[dict[str, Any]] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                receiver.posts.append(json.loads(self.rfile.read(length)))
                receiver.content_types.append(self.headers.get("Content-Type", ""))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks/T0K3N-in-the-path"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never says a word: a hung receiver."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MailServer:
    """aiosmtpd on 127.0.0.1: STARTTLS required (certificate from `ca`), AUTH required after it."""

    def __init__(self, ca: TestCA, password: str = SMTP_PASSWORD) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        self.messages: list[EmailMessage] = []
        self.recipients: list[list[str]] = []
        server = self

        class Handler:
            async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
                server.messages.append(email.message_from_bytes(envelope.original_content,
                                                                policy=email.policy.default))
                server.recipients.append(list(envelope.rcpt_tos))
                return "250 OK"

        def authenticator(_server: Any, _session: Any, _envelope: Any, _mechanism: str,
                          auth_data: Any) -> Any:
            ok = (isinstance(auth_data, LoginPassword) and auth_data.login == SMTP_USER.encode()
                  and auth_data.password == password.encode())
            return AuthResult(success=ok, handled=False)

        self.port = closed_port()
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                      tls_context=ca.server_context(), require_starttls=True,
                                      authenticator=authenticator, auth_required=True,
                                      auth_require_tls=True, ready_timeout=10)

    def __enter__(self) -> MailServer:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()
