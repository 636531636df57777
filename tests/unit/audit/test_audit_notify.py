"""The audit's notifications (fleetfix.audit.notify): configuration, what is sent when, sanitising, and
delivery to real loopback receivers (an HTTP server, aiosmtpd with STARTTLS and AUTH), failures included."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from audit_testkit import FakeWorld, edited, finding, interrupt_dpkg, make_target

from fleetfix.audit import AuditRun, AuditStore, load_audit, run_audit
from fleetfix.audit.drift import compute_drift
from fleetfix.audit.model import RunInfo, StoredRun, TargetResult
from fleetfix.audit.notify import (
    MAX_LISTED,
    Notice,
    NotifyConfig,
    deliver,
    mail_message,
    notice_of,
    notify_run,
)
from fleetfix.audit.policy import load_policy, policy_digest
from fleetfix.audit.report import text_report
from fleetfix.errors import ConfigError
from tests.lab.notifyservers import (
    SMTP_PASSWORD,
    SMTP_USER,
    MailServer,
    WebhookReceiver,
    closed_port,
    silent_listener,
)
from tests.lab.tlsca import TestCA

HOOK_ENV, SMTP_ENV = "FLEETFIX_TEST_WEBHOOK_URL", "FLEETFIX_TEST_SMTP_PASSWORD"


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def _config(*, port: int | None = None, ca_file: Path | None = None, hook: bool = True,
            timeout: float = 5, min_severity: str = "warning") -> NotifyConfig:
    data: dict[str, object] = {"min_severity": min_severity,
                               "dashboard_url": "https://ops.example/fleetfix/{run}.html"}
    if hook:
        data["webhook"] = {"url": f"@env:{HOOK_ENV}", "timeout": timeout}
    if port is not None:
        data["email"] = {"host": "127.0.0.1", "port": port, "username": SMTP_USER,
                         "password": f"@env:{SMTP_ENV}", "from": "fleetfix@example.org",
                         "to": ["ops@example.org", "gpu@example.org"], "timeout": timeout,
                         "ca_file": None if ca_file is None else str(ca_file)}
    return NotifyConfig.model_validate(data)


def _notice_of(run: AuditRun, config: NotifyConfig) -> Notice:
    return notice_of(run.run, run.drift, config)


def _audit_run(*results: TargetResult, baseline: StoredRun | None = None) -> AuditRun:
    stored = StoredRun(RunInfo(id=7, started=0.0, finished=1.0, status="complete"), results)
    return AuditRun(stored, compute_drift(baseline, stored))


# ---------------------------------------------------------------- configuration


def test_notify_section_loads_and_is_no_part_of_the_recorded_policy(tmp_path: Path) -> None:
    plain = load_policy(_policy(tmp_path, "severity: {APT_OLD_NVIDIA_KEY: ignore}\n"))
    path = _policy(tmp_path, "severity: {APT_OLD_NVIDIA_KEY: ignore}\nnotify:\n"
                             "  webhook: {url: '@env:HOOK'}\n"
                             "  email: {host: smtp.example.org, username: u, password: '@file:/etc/pw',\n"
                             "          from: f@example.org, to: [a@example.org]}\n")
    policy = load_policy(path)
    assert policy.notify is not None and policy.notify.email is not None
    assert policy.notify.email.port == 587 and policy.notify.email.encrypted
    assert not policy.notify.email.implicit_tls
    # Where the news goes is not how targets are judged: no policy change in the drift.
    assert policy_digest(policy) == policy_digest(plain)


@pytest.mark.parametrize(("text", "expected"), [
    ("notify:\n  webhook:\n    url: https://hooks.slack.com/services/T0/B0/XYZ\n",
     "policy.yaml:3: notify.webhook.url: Value error, give it as a reference"),
    ("notify:\n  email:\n    host: h\n    username: u\n    password: hunter22\n    from: f@e.org\n"
     "    to: [a@e.org]\n", "policy.yaml:5: notify.email.password: Value error, give it as a reference"),
    ("notify:\n  webhook:\n    ulr: '@env:X'\n", "policy.yaml:3: notify.webhook.ulr: unknown field "
                                                  "(did you mean 'url'?)"),
    ("notify:\n  min_severity: warning\n", "policy.yaml:1: notify: Value error, notify needs a webhook"),
    ("notify:\n  email: {host: h, from: f@e.org, to: ['a@e.org, b@e.org']}\n",
     "policy.yaml:2: notify.email.to.0: Value error, 'a@e.org, b@e.org' is not a plain e-mail address"),
    ("notify:\n  email: {host: h, port: 25, starttls: false, username: u, password: '@env:P',\n"
     "          from: f@e.org, to: [a@e.org]}\n",
     "policy.yaml:2: notify.email: Value error, starttls: false would send the password unencrypted"),
])
def test_bad_notify_config_is_one_line_naming_file_line_field(tmp_path: Path, text: str,
                                                              expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_policy(_policy(tmp_path, text))
    message = str(raised.value)
    assert "\n" not in message and expected in message, message
    assert "hunter22" not in message and "XYZ" not in message


# ---------------------------------------------------------------- what is sent when


def test_only_changes_are_sent_new_resolved_and_the_first_run_once(tmp_path: Path) -> None:
    world = FakeWorld({200: "healthy", 201: "problem_case"})
    targets = [make_target("pve1", 200), make_target("pve1", 201)]
    config = _config(min_severity="error")
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        first = _notice_of(run_audit(fleet, targets, policy=load_policy(None), store=store), config)
        # A fresh history: the problems there are are new, once.
        assert first.first_run and first.new and {c.target for c in first.new} == {"pve1/201"}
        assert all(c.severity == "error" for c in first.new) and not first.resolved
        assert _notice_of(run_audit(fleet, targets, policy=load_policy(None), store=store), config).empty
        world.cts[200] = edited("healthy", interrupt_dpkg)
        broken = _notice_of(run_audit(fleet, targets, policy=load_policy(None), store=store), config)
        assert [(c.target, c.code) for c in broken.new] == [("pve1/200", "DPKG_INTERRUPTED")]
        assert broken.subject() == "fleetfix audit: 1 new problem" and broken.baseline == 2
        world.cts[200] = "healthy"
        world.cts[201] = "stopped"
        fixed = _notice_of(run_audit(fleet, targets, policy=load_policy(None), store=store), config)
    assert [(c.target, c.code) for c in fixed.resolved] == [("pve1/200", "DPKG_INTERRUPTED")]
    assert [(c.target, c.code) for c in fixed.new] == [("pve1/201", "UNREACHABLE")]
    assert fixed.subject() == "fleetfix audit: 1 new problem, 1 resolved"


def test_min_severity_and_severity_crossing_it() -> None:
    before = StoredRun(RunInfo(id=6, started=0.0, finished=1.0, status="complete"), (
        TargetResult("a", "pve1", 1, "ok", findings=(finding("DPKG_INTERRUPTED", "warning"),)),))
    now = _audit_run(TargetResult("a", "pve1", 1, "ok", findings=(
        finding("DPKG_INTERRUPTED", "error"), finding("APT_OLD_NVIDIA_KEY", "info"))), baseline=before)
    errors = _notice_of(now, _config(min_severity="error"))
    assert [(c.code, c.severity, c.was) for c in errors.new] == [("DPKG_INTERRUPTED", "error", "warning")]
    assert _notice_of(now, _config(min_severity="warning")).empty  # a warning already, still a problem
    assert [c.code for c in _notice_of(now, _config(min_severity="info")).new] == ["APT_OLD_NVIDIA_KEY"]


def test_payload_is_slack_text_plus_fields_and_guest_strings_are_sanitised() -> None:
    hostile = finding("DPKG_INTERRUPTED")
    hostile = hostile.model_copy(update={
        "summary": "dpkg broke <!channel> & `x`\r\nBcc: evil@attacker.example\x1b]52;c;ZXZpbA==\x07"})
    notice = _notice_of(_audit_run(TargetResult("pve1/201", "pve1", 201, "ok", findings=(hostile,))),
                       _config())
    payload = json.loads(json.dumps(notice.payload()))
    assert payload["run"] == 7 and payload["first_run"] is True and payload["counts"] == {"new": 1,
                                                                                           "resolved": 0}
    assert payload["dashboard_url"] == "https://ops.example/fleetfix/7.html"
    [target] = payload["targets"]
    [entry] = target["new"]
    assert target["target"] == "pve1/201" and entry["code"] == "DPKG_INTERRUPTED"
    assert entry["severity"] == "error"
    # One line, every control character visible as an escape, never acted on.
    assert entry["message"] == ("dpkg broke <!channel> & `x`\\r\\nBcc: evil@attacker.example"
                                "\\x1b]52;c;ZXZpbA==\\x07")
    text = payload["text"]
    assert text.startswith("fleetfix audit: 1 new problem (run 7, first run of this history)\n")
    # Slack's control characters escaped (no mention, no link), the message in a code span.
    assert "&lt;!channel&gt; &amp; 'x'" in text and "<!channel>" not in text
    assert all(ord(char) >= 0x20 for line in text.splitlines() for char in line)


def test_mail_headers_carry_nothing_a_target_wrote() -> None:
    hostile = finding("DPKG_INTERRUPTED").model_copy(update={
        "summary": "x\r\nBcc: evil@attacker.example\r\nSubject: pwned"})
    notice = _notice_of(_audit_run(TargetResult("pve1/201", "pve1", 201, "ok", findings=(hostile,))),
                       _config(port=25))
    config = _config(port=25).email
    assert config is not None
    message = mail_message(config, notice)
    assert sorted(message.keys()) == ["Content-Transfer-Encoding", "Content-Type", "Date", "From",
                                      "MIME-Version", "Message-ID", "Subject", "To"]
    assert message["Subject"] == "fleetfix audit: 1 new problem"
    body = message.get_content()
    assert "x\\r\\nBcc: evil@attacker.example\\r\\nSubject: pwned" in body
    assert "\nBcc:" not in body and "\nSubject:" not in body


def test_a_large_change_lists_the_first_and_counts_all() -> None:
    results = tuple(TargetResult(f"t{i:04d}", "pve1", i, "ok", findings=(finding("DPKG_INTERRUPTED"),))
                    for i in range(MAX_LISTED + 5))
    notice = _notice_of(_audit_run(*results), _config())
    payload = notice.payload()
    assert payload["counts"]["new"] == MAX_LISTED + 5 and payload["truncated"] is True
    assert len(payload["targets"]) == MAX_LISTED and "... and 5 more" in payload["text"]


# ---------------------------------------------------------------- delivery to real receivers


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv(SMTP_ENV, SMTP_PASSWORD)
    return monkeypatch


def test_one_webhook_and_one_mail_per_change_none_without(
    tmp_path: Path, test_ca: TestCA, secrets_env: pytest.MonkeyPatch,
) -> None:
    world = FakeWorld({200: "healthy"})
    targets = [make_target("pve1", 200)]
    with WebhookReceiver() as hook, MailServer(test_ca) as mail, AuditStore(tmp_path / "a.db") as store, \
            world.fleet() as fleet:
        secrets_env.setenv(HOOK_ENV, hook.url)
        config = _config(port=mail.port, ca_file=test_ca.ca_file)

        def audit() -> AuditRun:
            run = run_audit(fleet, targets, policy=load_policy(None), store=store)
            notify_run(config, run.run, run.drift, store)
            return load_audit(store, run.info.id)

        audit()  # a healthy first run: nothing to say
        assert hook.posts == [] and mail.messages == []
        world.cts[200] = edited("healthy", interrupt_dpkg)
        broken = audit()
        assert len(hook.posts) == 1 and len(mail.messages) == 1
        assert hook.content_types == ["application/json"]
        assert hook.posts[0]["targets"][0]["new"][0]["code"] == "DPKG_INTERRUPTED"
        assert mail.messages[0]["Subject"] == "fleetfix audit: 1 new problem"
        assert mail.recipients == [["ops@example.org", "gpu@example.org"]]
        assert "DPKG_INTERRUPTED" in mail.messages[0].get_content()
        assert broken.info.args["notification"]["channels"] == {"webhook": "sent", "email": "sent"}
        audit()  # no change: nothing
        assert len(hook.posts) == 1 and len(mail.messages) == 1
        world.cts[200] = "healthy"
        audit()
        assert len(hook.posts) == 2 and len(mail.messages) == 2
        assert hook.posts[1]["counts"] == {"new": 0, "resolved": 1}
        assert mail.messages[1]["Subject"] == "fleetfix audit: 0 new problems, 1 resolved"
        # Recorded in the run, shown again by `audit show`.
        shown = text_report(load_audit(store, broken.info.id))
        unchanged = text_report(load_audit(store, broken.info.id + 1))
    assert "notification (1 new, 0 resolved): webhook sent, email sent" in shown
    assert "notification: nothing changed, nothing sent" in unchanged


def _notice() -> Notice:
    return _notice_of(_audit_run(TargetResult("pve1/201", "pve1", 201, "ok",
                                             findings=(finding("DPKG_INTERRUPTED"),))), _config())


def test_failures_are_one_line_each_and_never_show_a_secret(
    test_ca: TestCA, secrets_env: pytest.MonkeyPatch,
) -> None:
    secrets_env.setenv(HOOK_ENV, f"http://127.0.0.1:{closed_port()}/hooks/T0K3N-in-the-path")
    secrets_env.setenv(SMTP_ENV, "wrong-password")
    with MailServer(test_ca) as mail:
        outcome = deliver(_config(port=mail.port, ca_file=test_ca.ca_file), _notice())
    assert outcome.status == "failed" and mail.messages == []
    webhook, email = outcome.channels["webhook"], outcome.channels["email"]
    assert webhook.startswith("failed: 127.0.0.1: ") and "refused" in webhook.lower()
    assert email.startswith(f"failed: 127.0.0.1:{mail.port}: authentication failed (535")
    recorded = json.dumps(outcome.to_json()) + outcome.line()
    assert "T0K3N" not in recorded and "wrong-password" not in recorded and "\n" not in outcome.line()


def test_http_500_and_an_untrusted_certificate_fail(test_ca: TestCA, secrets_env: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(status=500) as hook, MailServer(test_ca) as mail:
        secrets_env.setenv(HOOK_ENV, hook.url)
        outcome = deliver(_config(port=mail.port, ca_file=None), _notice())  # the system's CAs only
        assert len(hook.posts) == 1 and mail.messages == []
    assert outcome.channels["webhook"] == "failed: 127.0.0.1: HTTP 500 Internal Server Error"
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.channels["email"]


def test_a_receiver_that_never_answers_costs_only_its_timeout(secrets_env: pytest.MonkeyPatch) -> None:
    with silent_listener() as port:
        secrets_env.setenv(HOOK_ENV, f"http://127.0.0.1:{port}/hook")
        started = time.monotonic()
        outcome = deliver(_config(port=port, timeout=0.5), _notice())
        took = time.monotonic() - started
    assert took < 4, took
    assert outcome.channels["webhook"].startswith("failed: 127.0.0.1: ")
    assert "timed out" in outcome.channels["webhook"] or "no answer" in outcome.channels["webhook"]
    assert outcome.channels["email"].startswith(f"failed: 127.0.0.1:{port}: ")


def test_plain_http_is_refused_for_a_webhook_off_loopback(secrets_env: pytest.MonkeyPatch) -> None:
    # Refused before any connection: the URL (and its token) would cross the network in clear.
    secrets_env.setenv(HOOK_ENV, "http://hooks.example.invalid/services/T0K3N")
    outcome = deliver(_config(), _notice())
    assert outcome.channels == {"webhook": f"failed: url @env:{HOOK_ENV}: https only (plain http only to a "
                                           "loopback receiver): the URL carries the webhook's token"}


def test_an_unset_reference_is_a_failed_channel_not_a_failed_audit(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOOK_ENV, raising=False)
    world = FakeWorld({200: edited("healthy", interrupt_dpkg)})
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run = run_audit(fleet, [make_target("pve1", 200)], policy=load_policy(None), store=store)
        outcome = notify_run(_config(), run.run, run.drift, store)
        assert outcome is not None and run.exit_code == 3 and run.info.status == "complete"
        assert outcome.channels == {"webhook": f"failed: webhook url @env:{HOOK_ENV}: ${HOOK_ENV} is not set"}
        assert store.info(run.info.id).args["notification"]["status"] == "failed"


def test_a_scheduled_audit_carries_references_never_the_secrets(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetfix.audit.schedule import ScheduleRequest, ScheduleSpec, units
    from fleetfix.cli.schedule import pin_audit_args

    secret_url = "https://hooks.slack.com/services/T0/B0/S3CR3T"
    monkeypatch.setenv(HOOK_ENV, secret_url)
    env_file = tmp_path / "fleetfix.env"
    env_file.write_text(f"{HOOK_ENV}={secret_url}\n")
    env_file.chmod(0o600)
    (tmp_path / "inventory.yaml").write_text("nodes: [{name: pve1, address: 127.0.0.1}]\n")
    policy = _policy(tmp_path, f"notify:\n  webhook: {{url: '@env:{HOOK_ENV}'}}\n")
    inventory = ["--inventory", str(tmp_path / "inventory.yaml")]
    args = pin_audit_args([*inventory, "--policy", str(policy)], tmp_path)
    spec = ScheduleSpec.build(ScheduleRequest(name="fleetfix-audit", audit_args=args, env_file=str(env_file)))
    service = units(spec)["fleetfix-audit.service"]
    assert f"--policy {policy}" in service and f"EnvironmentFile={env_file}" in service
    assert "S3CR3T" not in service
    # A policy whose notify: section would be refused tonight is refused at install.
    _policy(tmp_path, f"notify:\n  webhook: {{url: '{secret_url}'}}\n")
    with pytest.raises(ConfigError, match=r"policy.yaml:2: notify.webhook.url: .*reference") as raised:
        pin_audit_args([*inventory, "--policy", str(policy)], tmp_path)
    assert "S3CR3T" not in str(raised.value)
