"""Notifications of what changed between two audit runs: a webhook (JSON, Slack/Mattermost-compatible) and
e-mail over SMTP. Configured in the policy file's `notify:` section (docs/audit.md, "Notifications"):

    notify:
      min_severity: warning                 # the lowest severity that counts as a problem (default)
      dashboard_url: https://ops.example/fleetfix/{run}.html    # optional; {run}: the run id
      webhook: {url: "@env:FLEETFIX_WEBHOOK_URL", timeout: 10}
      email:
        host: smtp.example.org
        port: 587                           # 465: implicit TLS; else STARTTLS (starttls: true, default)
        username: fleetfix
        password: "@env:SMTP_PASSWORD"
        from: fleetfix@example.org
        to: [gpu-ops@example.org]

What is sent, and when: `notice_of` reads the run's drift (the audit's own, against each target's last
result) and keeps the changes at or above min_severity: findings that are new or resolved, a severity that
crossed min_severity, a target that became unreachable or recovered, and the findings of a target with no
earlier result. Nothing changed: nothing is sent. The first run of a history has no baseline, so its
problems are all new: they are sent once. Changes the drift puts down to a policy change, and targets
that left the inventory, are not sent (the operator made them).

Secrets: the webhook URL (it holds the token: Slack's and Mattermost's docs both say to treat it as a
secret) and the SMTP password are references only (`@env:`/`@file:`, fleetfix.secrets), resolved when the
notification is sent, never printed: an error names the host and the reference, and any error text is
redacted of the resolved values before it is shown or recorded.

Failure is bounded and contained: each channel has a timeout (the whole attempt runs under it, so a
receiver that accepts and never answers costs at most that long), and a failed channel is recorded in the
run (`notification` in its args: `audit show` and the JSON report show it) and printed as one line; the
audit's record and exit code stay what its findings say.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetfix.errors import one_line
from fleetfix.secrets import Redactor, is_reference, resolve_reference
from fleetfix.terminal import safe_line

if TYPE_CHECKING:
    from fleetfix.audit.drift import Drift, FindingChange
    from fleetfix.audit.model import StoredRun, TargetResult
    from fleetfix.audit.store import AuditStore

MinSeverity = Literal["error", "warning", "info"]
_RANK = {"info": 0, "warning": 1, "error": 2}
UNREACHABLE = "UNREACHABLE"  # the code a target that could not be probed is listed under
MAX_LISTED = 100  # changes listed per kind (new, resolved); the counts always say how many there are
MAX_MESSAGE = 300  # characters of one finding's message
SMTPS_PORT = 465


def _no_control(value: str) -> str:
    if safe_line(value) != value:
        raise ValueError("control characters (newline, tab, ...) are not allowed")
    return value


def _reference(value: str) -> str:
    if not is_reference(value):
        raise ValueError("give it as a reference, @env:NAME or @file:PATH: it is a secret, never written "
                         "in the file itself")
    return _no_control(value)


def _address(value: str) -> str:
    _no_control(value)
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain or any(char in value for char in " ,;<>\"()"):
        raise ValueError(f"{value!r} is not a plain e-mail address (user@domain)")
    return value


class WebhookConfig(BaseModel):
    """An incoming webhook: a POST of JSON with a `text` field (what Slack and Mattermost show)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # a reference: the URL carries the webhook's token
    timeout: float = Field(default=10.0, gt=0, le=300)
    ca_file: str | None = None  # trust this CA (PEM) instead of the system's, for an internal receiver

    _url = field_validator("url")(_reference)


class EmailConfig(BaseModel):
    """An SMTP submission server: STARTTLS (or implicit TLS on port 465), certificate verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    port: int = Field(default=587, ge=1, le=65535)
    starttls: bool | None = None  # default: true, except on port 465 (implicit TLS)
    ca_file: str | None = None
    username: str | None = None
    password: str | None = None  # a reference
    sender: str = Field(alias="from")
    to: list[Annotated[str, AfterValidator(_address)]] = Field(min_length=1)
    timeout: float = Field(default=30.0, gt=0, le=300)

    _host = field_validator("host", "username")(lambda value: value if value is None else _no_control(value))
    _password = field_validator("password")(lambda value: value if value is None else _reference(value))
    _sender = field_validator("sender")(_address)

    @model_validator(mode="after")
    def _consistent(self) -> EmailConfig:
        if self.port == SMTPS_PORT and self.starttls:
            raise ValueError("port 465 is implicit TLS: leave starttls out (or use port 587 for STARTTLS)")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.username is not None and not self.encrypted:
            raise ValueError("starttls: false would send the password unencrypted")
        return self

    @property
    def implicit_tls(self) -> bool:
        return self.port == SMTPS_PORT

    @property
    def encrypted(self) -> bool:
        return self.implicit_tls or self.starttls is not False


class NotifyConfig(BaseModel):
    """The policy file's `notify:` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_severity: MinSeverity = "warning"
    dashboard_url: str | None = None
    webhook: WebhookConfig | None = None
    email: EmailConfig | None = None

    _dashboard = field_validator("dashboard_url")(
        lambda value: value if value is None else _no_control(value))

    @model_validator(mode="after")
    def _some_channel(self) -> NotifyConfig:
        if self.webhook is None and self.email is None:
            raise ValueError("notify needs a webhook or an email (or both)")
        return self

    def dashboard(self, run_id: int) -> str | None:
        return None if self.dashboard_url is None else self.dashboard_url.replace("{run}", str(run_id))


# ---------------------------------------------------------------- what is sent


@dataclass(frozen=True)
class Change:
    """One change a notification lists. The strings are sanitised: one line, no control characters."""

    target: str
    code: str
    severity: str
    message: str
    was: str | None = None  # for a severity that crossed min_severity: the severity before

    def to_json(self) -> dict[str, Any]:
        data = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.was is not None:
            data["previous_severity"] = self.was
        return data


def _clean(text: str) -> str:
    line = safe_line(text)
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 1] + "…"


@dataclass(frozen=True)
class Notice:
    """What one run's notification says: new and resolved problems, per target."""

    run: int
    baseline: int | None
    new: list[Change] = field(default_factory=list)
    resolved: list[Change] = field(default_factory=list)
    dashboard_url: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.new or self.resolved)

    @property
    def first_run(self) -> bool:
        return self.baseline is None

    def subject(self) -> str:
        """`fleetfix audit: 2 new problems, 1 resolved`: counts only (nothing a target wrote)."""
        count = len(self.new)
        parts = [f"{count} new problem{'' if count == 1 else 's'}"]
        if self.resolved:
            parts.append(f"{len(self.resolved)} resolved")
        return "fleetfix audit: " + ", ".join(parts)

    def text(self, *, slack: bool = False) -> str:
        """The summary as plain text (mail), or with Slack's control characters escaped and each message
        in a code span (webhook: Slack reads `<...>` as links and mentions, Mattermost Markdown)."""

        def plain(value: str) -> str:
            return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") if slack else value

        def message(value: str) -> str:
            return "`" + plain(value).replace("`", "'") + "`" if slack else value

        compared = ("first run of this history" if self.first_run
                    else f"compared with run {self.baseline}")
        lines = [f"{self.subject()} (run {self.run}, {compared})"]
        if self.dashboard_url:
            lines.append(f"Dashboard: {plain(self.dashboard_url)}")
        for title, changes in (("New", self.new), ("Resolved", self.resolved)):
            if not changes:
                continue
            lines += ["", f"{title}:"]
            for change in changes[:MAX_LISTED]:
                was = f", was {change.was}" if change.was else ""
                lines.append(f"- {plain(change.target)}: {change.code} ({change.severity}{was}) "
                             f"{message(change.message)}")
            if len(changes) > MAX_LISTED:
                lines.append(f"- ... and {len(changes) - MAX_LISTED} more")
        return "\n".join(lines) + "\n"

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON: `text` for Slack/Mattermost, the same changes as fields per target."""
        targets: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for kind, changes in (("new", self.new), ("resolved", self.resolved)):
            for change in changes[:MAX_LISTED]:
                entry = targets.setdefault(change.target, {"new": [], "resolved": []})
                entry[kind].append(change.to_json())
        return {
            "text": self.text(slack=True),
            "source": "fleetfix audit",
            "run": self.run,
            "baseline": self.baseline,
            "first_run": self.first_run,
            "dashboard_url": self.dashboard_url,
            "counts": {"new": len(self.new), "resolved": len(self.resolved)},
            "truncated": len(self.new) > MAX_LISTED or len(self.resolved) > MAX_LISTED,
            "targets": [{"target": name, **entry} for name, entry in targets.items()],
        }


def _counts(severity: str, least: str) -> bool:
    return _RANK.get(severity, 0) >= _RANK[least]


def _findings(result: TargetResult, least: str) -> list[Change]:
    return [Change(_clean(result.target), finding.code, finding.severity.value, _clean(finding.summary))
            for finding in result.findings if _counts(finding.severity.value, least)]


def _not_probed(result: TargetResult | None, name: str) -> Change:
    status = "not probed" if result is None else result.status
    error = None if result is None else result.error
    return Change(_clean(name), UNREACHABLE, "error", _clean(f"{status}: {error}" if error else status))


def _listed(change: FindingChange, was: str | None = None) -> Change:
    finding = change.finding
    return Change(_clean(change.target), finding.code, finding.severity.value, _clean(finding.summary),
                  was=was)


def notice_of(run: StoredRun, drift: Drift, config: NotifyConfig) -> Notice:
    """The changes of the run's drift that the notification reports (see the module's doc)."""
    least = config.min_severity
    results = {result.target: result for result in run.targets}
    new: list[Change] = []
    resolved: list[Change] = []
    if drift.baseline is None:  # the first run: every problem is new
        fresh = list(results)
    else:
        fresh = [*drift.appeared, *drift.recovered]
        new += [_listed(change) for change in drift.new_findings
                if _counts(change.finding.severity.value, least)]
        resolved += [_listed(change) for change in drift.resolved_findings
                     if _counts(change.finding.severity.value, least)]
        for change in drift.severity_changed:
            now, was = change.finding.severity.value, change.previous_severity or "info"
            if _counts(now, least) != _counts(was, least):
                (new if _counts(now, least) else resolved).append(_listed(change, was=was))
        new += [_not_probed(results.get(name), name) for name in drift.became_unreachable]
        resolved += [Change(_clean(name), UNREACHABLE, "error", "probed again") for name in drift.recovered]
    for name in sorted(set(fresh)):
        result = results.get(name)
        if result is None:
            continue
        new += _findings(result, least) if result.reachable else [_not_probed(result, name)]
    return Notice(run.info.id, drift.baseline, new, resolved, config.dashboard(run.info.id))


# ---------------------------------------------------------------- sending


class NotifyError(Exception):
    """Why one channel's notification was not delivered (one line, no secret in it)."""


def _bounded(attempt: Callable[[], None], seconds: float, what: str) -> None:
    """Run attempt, waiting at most `seconds` (plus a little for the socket timeouts to fire): a receiver
    that accepts and never answers, or trickles its answer, cannot hold the audit longer. The attempt runs
    in a daemon thread; left behind, its sockets time out on their own."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            attempt()
            outcome.append(None)
        except BaseException as error:  # handed to the caller's thread
            outcome.append(error)

    worker = threading.Thread(target=run, name=f"notify {what}", daemon=True)
    worker.start()
    worker.join(seconds + 1.0)
    if not outcome:
        raise NotifyError(f"no answer within {seconds:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _tls_context(ca_file: str | None) -> Any:
    import ssl

    # Verification on (the default context's hostname check and CERT_REQUIRED); ca_file replaces the
    # system's trust store with the one CA an internal receiver uses.
    return ssl.create_default_context(cafile=ca_file)


def send_webhook(config: WebhookConfig, notice: Notice, redactor: Redactor) -> None:
    """POST the notice's payload as JSON; NotifyError unless the receiver answers 2xx."""
    url = resolve_reference(config.url, "webhook url")
    redactor.add([url])
    parts = urllib.parse.urlsplit(url)
    redactor.add([part for part in (parts.path, parts.query) if len(part) > 1])
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise NotifyError(f"url {config.url}: not an http(s) URL")
    host = parts.hostname
    from fleetfix.wheels.httpfetch import is_loopback

    loopback = is_loopback(host)
    if parts.scheme.lower() == "http" and not loopback:
        raise NotifyError(f"url {config.url}: https only (plain http only to a loopback receiver): the URL "
                          "carries the webhook's token")
    body = json.dumps(notice.payload()).encode()

    def post() -> None:
        import http.client
        import urllib.error
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            # A webhook answers; it does not send the POST on (urllib would resend it as a GET).
            def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                                 headers: Any, newurl: str) -> None:
                raise NotifyError(f"HTTP {code}: the receiver redirected the POST (not followed)")

        handlers: list[urllib.request.BaseHandler] = [
            NoRedirect(), urllib.request.HTTPSHandler(context=_tls_context(config.ca_file))]
        if loopback:  # a proxy from the environment never sees a loopback receiver
            handlers.append(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "fleetfix"})
        try:
            with urllib.request.build_opener(*handlers).open(request, timeout=config.timeout) as response:
                response.read(64 * 1024)
        except NotifyError:
            raise
        except urllib.error.HTTPError as error:
            error.close()
            raise NotifyError(f"HTTP {error.code} {one_line(error.reason)}") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, NotifyError):
                raise error.reason from None
            raise NotifyError(one_line(error.reason)) from None
        except (OSError, http.client.HTTPException) as error:
            raise NotifyError(one_line(error)) from None

    try:
        _bounded(post, config.timeout, "webhook")
    except NotifyError as error:
        raise NotifyError(f"{host}: {error}") from None


def mail_message(config: EmailConfig, notice: Notice) -> Any:
    """The e-mail: the subject is counts only, the body the plain-text summary. EmailMessage with the
    SMTP policy refuses a header holding CR or LF, on top of nothing a target wrote reaching a header."""
    from email.message import EmailMessage
    from email.policy import SMTP
    from email.utils import formatdate, make_msgid

    message = EmailMessage(policy=SMTP)
    message["Subject"] = notice.subject()
    message["From"] = config.sender
    message["To"] = ", ".join(config.to)
    message["Date"] = formatdate(localtime=True)
    message["Message-ID"] = make_msgid(domain=config.sender.rpartition("@")[2])
    message.set_content(notice.text())
    return message


def send_email(config: EmailConfig, notice: Notice, redactor: Redactor) -> None:
    """Submit the notice by SMTP: STARTTLS (required, not opportunistic) or implicit TLS, then AUTH."""
    password = None if config.password is None else resolve_reference(config.password, "email password")
    if password is not None:
        redactor.add([password])
    message = mail_message(config, notice)

    def submit() -> None:
        import smtplib
        import socket

        # EHLO names this machine as the kernel does: smtplib's default, socket.getfqdn(), asks the
        # resolver (a DNS query, or a wait on one that does not answer) before a byte goes to the server.
        name = socket.gethostname() or "localhost"
        context = _tls_context(config.ca_file) if config.encrypted else None
        try:
            smtp: smtplib.SMTP
            if config.implicit_tls:
                smtp = smtplib.SMTP_SSL(config.host, config.port, local_hostname=name,
                                        timeout=config.timeout, context=context)
            else:
                smtp = smtplib.SMTP(config.host, config.port, local_hostname=name, timeout=config.timeout)
            with smtp:
                smtp.ehlo()
                if config.encrypted and not config.implicit_tls:
                    smtp.starttls(context=context)  # SMTPNotSupportedError when the server offers none
                    smtp.ehlo()
                if config.username is not None and password is not None:
                    smtp.login(config.username, password)
                refused = smtp.send_message(message)
            if refused:
                raise NotifyError(f"recipients refused: {', '.join(sorted(refused))}")
        except smtplib.SMTPAuthenticationError as error:
            raise NotifyError(f"authentication failed ({error.smtp_code} {_smtp_text(error.smtp_error)})"
                              ) from None
        except smtplib.SMTPResponseException as error:
            raise NotifyError(f"{error.smtp_code} {_smtp_text(error.smtp_error)}") from None
        except (smtplib.SMTPException, OSError) as error:
            raise NotifyError(one_line(error)) from None

    try:
        _bounded(submit, config.timeout, "email")
    except NotifyError as error:
        raise NotifyError(f"{config.host}:{config.port}: {error}") from None


def _smtp_text(value: bytes | str) -> str:
    return one_line(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)


# ---------------------------------------------------------------- the outcome, recorded


@dataclass(frozen=True)
class Outcome:
    """What a run's notification did: recorded in the run (args["notification"]) and shown by reports."""

    status: Literal["sent", "failed", "unchanged"]
    new: int = 0
    resolved: int = 0
    channels: dict[str, str] = field(default_factory=dict)  # channel -> "sent" or "failed: why"

    @property
    def failures(self) -> dict[str, str]:
        return {name: state for name, state in self.channels.items() if state != "sent"}

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "new": self.new, "resolved": self.resolved,
                "channels": dict(self.channels)}

    def line(self) -> str:
        """One line: `notification: webhook sent, email failed: ...`."""
        if self.status == "unchanged":
            return "notification: nothing changed, nothing sent"
        channels = ", ".join(f"{name} {state}" for name, state in self.channels.items())
        return f"notification ({self.new} new, {self.resolved} resolved): {channels}"


def notification_lines(args: Mapping[str, Any]) -> list[str]:
    """The report's line for a run's recorded notification (none when the run has none)."""
    recorded = args.get("notification")
    if not isinstance(recorded, dict):
        return []
    channels = recorded.get("channels")
    outcome = Outcome(status=recorded.get("status", "failed"), new=int(recorded.get("new") or 0),
                      resolved=int(recorded.get("resolved") or 0),
                      channels={str(k): str(v) for k, v in channels.items()} if isinstance(channels, dict)
                      else {})
    return [safe_line(outcome.line())]


Sender = Callable[[Any, Notice, Redactor], None]
SENDERS: dict[str, Sender] = {"webhook": send_webhook, "email": send_email}


def deliver(config: NotifyConfig, notice: Notice) -> Outcome:
    """Send the notice on every configured channel (each on its own: one failing does not stop the
    other); nothing when the notice is empty."""
    if notice.empty:
        return Outcome("unchanged")
    redactor = Redactor()
    channels: dict[str, str] = {}
    for name, channel in (("webhook", config.webhook), ("email", config.email)):
        if channel is None:
            continue
        try:
            SENDERS[name](channel, notice, redactor)
            channels[name] = "sent"
        except Exception as error:  # any failure is the channel's, never the audit's
            channels[name] = "failed: " + safe_line(redactor.text(one_line(error)))
    failed = any(state != "sent" for state in channels.values())
    return Outcome("failed" if failed else "sent", len(notice.new), len(notice.resolved), channels)


def notify_run(config: NotifyConfig, run: StoredRun, drift: Drift, store: AuditStore) -> Outcome | None:
    """Notify of the run's changes (its drift) and record the outcome in the run. An incomplete run
    (interrupted) is not notified of: its drift covers only the targets it got to."""
    if run.info.status != "complete":
        return None
    outcome = deliver(config, notice_of(run, drift, config))
    store.set_notification(run.info.id, outcome.to_json())
    return outcome
