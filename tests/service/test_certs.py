"""The private CA and serving certificate: creation, SANs, chain, renewal and CA rotation."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import ExtendedKeyUsageOID

from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.service import certs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_ensure_creates_then_keeps_files(tmp_path):
    root = tmp_path / "certs"
    layout = certs.ensure(root)
    first = snapshot(root)
    assert set(first) == {"ca.crt", "ca.key", "ca-bundle.crt", "tls.crt", "tls.key"}  # no temporary files left
    assert certs.ensure(root) == layout
    assert snapshot(root) == first
    assert stat.S_IMODE(layout.tls_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.ca_key.stat().st_mode) == 0o600
    assert layout.bundle.read_bytes() == layout.ca_cert.read_bytes()


def test_ensure_replaces_only_what_is_missing(tmp_path):
    layout = certs.ensure(tmp_path)
    ca = layout.ca_cert.read_bytes()
    old_serial = load(layout.tls_cert).serial_number
    layout.tls_cert.unlink()
    certs.ensure(tmp_path)
    assert layout.ca_cert.read_bytes() == ca
    assert load(layout.tls_cert).serial_number != old_serial
    load(layout.tls_cert).verify_directly_issued_by(load(layout.ca_cert))


def test_sans_and_usages(tmp_path):
    layout = certs.ensure(tmp_path, service="hook", namespace="gpu", extra_dns=["hook.example.com"], ips=["::1"])
    cert = load(layout.tls_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = sans.get_values_for_type(x509.DNSName)
    assert sorted(dns) == sorted(["hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local", "hook.example.com"])
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("::1")]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_a_serving_certificate_names_only_the_service_unless_asked(tmp_path):
    sans = load(certs.ensure(tmp_path).tls_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(certs.service_names("hami-mt-webhook",
                                                                                         "hami-mt-webhook"))
    assert sans.get_values_for_type(x509.IPAddress) == []


def test_rotation_keeps_the_extra_names_unless_given_new_ones(tmp_path):
    certs.ensure(tmp_path, extra_dns=["localhost"], ips=["127.0.0.1"])
    certs.rotate(tmp_path, force=True)
    assert certs.current_extra_sans(tmp_path / "tls.crt", "hami-mt-webhook", "hami-mt-webhook") == \
        (["localhost"], ["127.0.0.1"])
    certs.rotate(tmp_path, force=True, extra_dns=[], ips=[])
    assert certs.current_extra_sans(tmp_path / "tls.crt", "hami-mt-webhook", "hami-mt-webhook") == ([], [])


def test_the_cli_adds_extra_names_on_request(tmp_path):
    from hami_mt_webhook.cli import main as cli

    assert cli.main(["certs", "--dir", str(tmp_path), "--san", "127.0.0.1", "--san", "hook.example.com"]) == 0
    assert certs.current_extra_sans(tmp_path / "tls.crt", "hami-mt-webhook", "hami-mt-webhook") == \
        (["hook.example.com"], ["127.0.0.1"])


def test_default_sans_are_the_service_names(certs_dir):
    sans = load(certs_dir.tls_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(certs.service_names("hami-mt-webhook", "hami-mt-webhook")) <= set(sans.get_values_for_type(x509.DNSName))
    assert "hami-mt-webhook.hami-mt-webhook.svc" in sans.get_values_for_type(x509.DNSName)


def test_chain_verifies(certs_dir):
    ca, leaf = load(certs_dir.ca_cert), load(certs_dir.tls_cert)
    leaf.verify_directly_issued_by(ca)
    ca.verify_directly_issued_by(ca)  # self-signed
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True and constraints.path_length == 0
    assert leaf.issuer == ca.subject
    spki = (Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    assert certs.load_pair(certs_dir.tls_cert, certs_dir.tls_key).key.public_key().public_bytes(*spki) == \
        leaf.public_key().public_bytes(*spki)


def test_client_certificate_is_for_client_auth_only():
    ca = certs.new_ca("client-ca")
    pair = certs.issue(ca, "kube-apiserver", orgs=["system:masters"], client=True, server=False)
    usages = pair.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    pair.cert.verify_directly_issued_by(ca.cert)


def test_due_after_two_thirds_of_the_lifetime(certs_dir):
    cert = load(certs_dir.tls_cert)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    assert certs.due(cert) is False
    assert certs.due(cert, now=start + dt.timedelta(days=1)) is False
    two_thirds = start + (end - start) * 2 / 3
    assert certs.due(cert, now=two_thirds - dt.timedelta(seconds=1)) is False
    assert certs.due(cert, now=two_thirds + dt.timedelta(seconds=1)) is True
    assert certs.due(cert, now=end + dt.timedelta(days=1)) is True


def test_rotate_does_nothing_when_not_due(certs_dir):
    before = snapshot(certs_dir.root)
    assert certs.rotate(certs_dir.root) == []
    assert snapshot(certs_dir.root) == before


def test_rotate_renews_what_is_due(tmp_path):
    layout = certs.ensure(tmp_path, days=0.001)  # 86 s; its start is backdated 5 minutes, so it is due now
    old = load(layout.tls_cert)
    assert certs.due(old)
    done = certs.rotate(tmp_path)
    assert len(done) == 1 and "new serving certificate" in done[0]
    new = load(layout.tls_cert)
    assert new.serial_number != old.serial_number and not certs.due(new)


def test_rotate_force_issues_a_new_serial_from_the_same_ca(certs_dir):
    ca_before = certs_dir.ca_cert.read_bytes()
    old = load(certs_dir.tls_cert).serial_number
    done = certs.rotate(certs_dir.root, force=True)
    assert len(done) == 1
    assert load(certs_dir.tls_cert).serial_number != old
    assert certs_dir.ca_cert.read_bytes() == ca_before
    load(certs_dir.tls_cert).verify_directly_issued_by(load(certs_dir.ca_cert))
    certs.load_pair(certs_dir.tls_cert, certs_dir.tls_key)  # key and certificate belong together


def test_replacing_the_ca_keeps_the_served_certificate_trusted_at_every_step(certs_dir):
    def trusted(leaf: x509.Certificate) -> bool:
        bundle = x509.load_pem_x509_certificates(certs_dir.bundle.read_bytes())
        return any(leaf.issuer == ca.subject and _issued(leaf, ca) for ca in bundle)

    old_ca, old_leaf = load(certs_dir.ca_cert), load(certs_dir.tls_cert)
    done = certs.rotate(certs_dir.root, new_authority=True)  # 1: trust both, still serve the old leaf
    assert any("new CA" in line for line in done)
    new_ca = load(certs_dir.ca_cert)
    assert new_ca.serial_number != old_ca.serial_number
    bundle = x509.load_pem_x509_certificates(certs_dir.bundle.read_bytes())
    assert {c.serial_number for c in bundle} == {old_ca.serial_number, new_ca.serial_number}
    assert load(certs_dir.tls_cert).serial_number == old_leaf.serial_number and trusted(old_leaf)

    certs.rotate(certs_dir.root, force=True)  # 2: serve from the new CA
    leaf = load(certs_dir.tls_cert)
    leaf.verify_directly_issued_by(new_ca)
    assert trusted(leaf)

    certs.rotate(certs_dir.root, drop_old=True)  # 3: trust the new CA only
    assert [c.serial_number for c in x509.load_pem_x509_certificates(certs_dir.bundle.read_bytes())] == \
        [new_ca.serial_number]
    assert trusted(leaf) and not trusted(old_leaf)
    assert certs.expiry(certs_dir.tls_cert) == leaf.not_valid_after_utc


def _issued(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def test_cli_certs_writes_and_prints_paths(tmp_path, capsys):
    root = tmp_path / "out"
    assert cli.main(["certs", "--dir", str(root), "--service", "hook", "--namespace", "gpu"]) == 0
    out = capsys.readouterr().out
    assert str(root / "ca.crt") in out and str(root / "tls.crt") in out and str(root / "tls.key") in out
    assert "valid until" in out
    sans = load(root / "tls.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "hook.gpu.svc" in sans.get_values_for_type(x509.DNSName)

    serial = load(root / "tls.crt").serial_number
    assert cli.main(["certs", "--dir", str(root)]) == 0  # kept
    assert load(root / "tls.crt").serial_number == serial
    capsys.readouterr()

    assert cli.main(["certs", "--dir", str(root), "--rotate"]) == 0
    assert "nothing due" in capsys.readouterr().out
    assert cli.main(["certs", "--dir", str(root), "--rotate", "--force"]) == 0
    assert "new serving certificate" in capsys.readouterr().out
    assert load(root / "tls.crt").serial_number != serial


def test_cli_certs_without_its_package_data_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """A broken install (the webhook configurations missing from the package) is said, never skipped."""
    from hami_mt_webhook.admission import configurations

    monkeypatch.setattr(configurations, "FILES", ("webhooks.yaml", "gone.yaml"))
    assert cli.main(["certs", "--dir", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err == ("hami-mt-webhook: the package data file gone.yaml is missing: "
                            "reinstall hami-mt-webhook\n")
    assert not (tmp_path / "out" / "webhook-configurations.yaml").exists()
