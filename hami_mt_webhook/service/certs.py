"""A private CA and the certificates the webhook and the local control plane serve with.

Files are written atomically (a temporary file, then rename) so a server reloading them never reads
half a key pair.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["NAMESPACE", "SERVICE", "SERVING_DAYS", "KeyPair", "Layout", "new_ca", "issue", "split_sans",
           "write_atomic", "write_pair", "ensure", "rotate", "expiry"]

CA_DAYS = 3650
SERVING_DAYS = 365
#: The Service whose DNS names the serving certificate carries, and its namespace, unless told otherwise.
SERVICE = NAMESPACE = "hami-mt-webhook"
#: A serving certificate is renewed once this share of its lifetime has passed.
RENEW_AT = 2 / 3


@dataclass
class KeyPair:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(cn: str, orgs: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def new_ca(cn: str = "hami-mt-webhook-ca", days: int = CA_DAYS) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(key, cert)


def issue(ca: KeyPair, cn: str, *, dns: Iterable[str] = (), ips: Iterable[str] = (),
          orgs: Iterable[str] = (), server: bool = True, client: bool = False,
          days: float = SERVING_DAYS) -> KeyPair:
    """A leaf certificate signed by `ca`, for serving (SANs) and/or client authentication (CN, O)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
             ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, orgs)).issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False),
                       critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(key, builder.sign(ca.key, hashes.SHA256()))


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names kube-apiserver may use to reach a Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]



def split_sans(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """Extra subject alternative names as (DNS names, IP addresses)."""
    dns, ips = [], []
    for name in names:
        try:
            ips.append(str(ipaddress.ip_address(name)))
        except ValueError:
            dns.append(name)
    return dns, ips


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` in one rename, so readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_pair(pair: KeyPair, cert_path: Path, key_path: Path) -> None:
    """Write the key first: a reader that sees the new certificate also finds its key."""
    write_atomic(key_path, pair.key_pem(), 0o600)
    write_atomic(cert_path, pair.cert_pem())


def load_pair(cert_path: Path, key_path: Path) -> KeyPair:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: only EC keys are supported")
    return KeyPair(key, cert)


@dataclass(frozen=True)
class Layout:
    """The file names in a certificate directory."""

    root: Path

    @property
    def ca_cert(self) -> Path: return self.root / "ca.crt"
    @property
    def ca_key(self) -> Path: return self.root / "ca.key"
    @property
    def bundle(self) -> Path: return self.root / "ca-bundle.crt"
    @property
    def tls_cert(self) -> Path: return self.root / "tls.crt"
    @property
    def tls_key(self) -> Path: return self.root / "tls.key"


def ensure(root: Path, service: str = SERVICE, namespace: str = NAMESPACE,
           extra_dns: Iterable[str] = (), days: float = SERVING_DAYS, ips: Iterable[str] = ()) -> Layout:
    """Create the CA and serving certificate if missing; keep what is there.

    The serving certificate names the Service only, unless `extra_dns` and `ips` ask for more
    (a certificate valid for 127.0.0.1 would let anything on a node's loopback impersonate the webhook).
    """
    layout = Layout(Path(root))
    if layout.ca_cert.exists() and layout.ca_key.exists():
        ca = load_pair(layout.ca_cert, layout.ca_key)
    else:
        ca = new_ca()
        write_pair(ca, layout.ca_cert, layout.ca_key)
    if not layout.bundle.exists():
        write_atomic(layout.bundle, ca.cert_pem())
    if not (layout.tls_cert.exists() and layout.tls_key.exists()):
        _serve(layout, ca, service, namespace, extra_dns, days, ips)
    return layout


def _serve(layout: Layout, ca: KeyPair, service: str, namespace: str,
           extra_dns: Iterable[str], days: float, ips: Iterable[str]) -> KeyPair:
    names = service_names(service, namespace)
    pair = issue(ca, f"{service}.{namespace}.svc", dns=[*names, *(d for d in extra_dns if d not in names)],
                 ips=list(ips), days=days)
    write_pair(pair, layout.tls_cert, layout.tls_key)
    return pair


def due(cert: x509.Certificate, now: dt.datetime | None = None) -> bool:
    """True once `RENEW_AT` of the certificate's lifetime has passed."""
    now = now or _now()
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * RENEW_AT


def rotate(root: Path, *, service: str = SERVICE, namespace: str = NAMESPACE,
           extra_dns: Iterable[str] | None = None, days: float = SERVING_DAYS, force: bool = False,
           new_authority: bool = False, drop_old: bool = False,
           ips: Iterable[str] | None = None) -> list[str]:
    """Renew what is due; return what was done, one line each.

    Replacing the CA takes three steps, so the API server always trusts the certificate served:
    1. `new_authority`: a new CA signs from now on; the bundle holds the new and the old CA, and the
       serving certificate (from the old CA) stays. Put the bundle into the webhook configurations.
    2. `force`: a serving certificate from the new CA; the servers reload it in place.
    3. `drop_old`: the bundle holds the new CA only. Put it into the webhook configurations.

    A renewed serving certificate keeps the current one's extra names unless `extra_dns`/`ips` are given.
    """
    layout = ensure(root, service, namespace, extra_dns or (), days, ips or ())
    if extra_dns is None or ips is None:
        kept_dns, kept_ips = current_extra_sans(layout.tls_cert, service, namespace)
        extra_dns = kept_dns if extra_dns is None else extra_dns
        ips = kept_ips if ips is None else ips
    done: list[str] = []
    ca = load_pair(layout.ca_cert, layout.ca_key)
    if new_authority:
        old_pem = ca.cert_pem()
        ca = new_ca()
        write_pair(ca, layout.ca_cert, layout.ca_key)
        write_atomic(layout.bundle, ca.cert_pem() + old_pem)
        done.append(f"new CA; {layout.bundle.name} holds the new and the old CA: apply it to the webhook "
                    "configurations, then run `certs --rotate --force` to serve a certificate from the "
                    "new CA")
    elif force or due(x509.load_pem_x509_certificate(layout.tls_cert.read_bytes())):
        pair = _serve(layout, ca, service, namespace, extra_dns, days, ips)
        until = pair.cert.not_valid_after_utc
        done.append(f"new serving certificate, valid until {until:%Y-%m-%d %H:%M} UTC")
    if drop_old:
        write_atomic(layout.bundle, ca.cert_pem())
        done.append(f"{layout.bundle.name} holds the current CA only: apply it to the webhook configurations")
    return done


def current_extra_sans(cert_path: Path, service: str, namespace: str) -> tuple[list[str], list[str]]:
    """The DNS names beyond the Service's, and the IP addresses, of a serving certificate."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    names = set(service_names(service, namespace))
    return ([d for d in sans.get_values_for_type(x509.DNSName) if d not in names],
            [str(i) for i in sans.get_values_for_type(x509.IPAddress)])


def expiry(cert_path: Path) -> dt.datetime:
    """When the certificate in `cert_path` stops being valid."""
    return x509.load_pem_x509_certificate(Path(cert_path).read_bytes()).not_valid_after_utc
