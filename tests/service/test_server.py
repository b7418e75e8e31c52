"""The real HTTPS webhook on loopback, spoken to the way kube-apiserver speaks to it."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from devtools.waiting import until_async
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.record import RECORD, record
from hami_mt_webhook.service import certs

# Much the list tests/admission/test_enforcement.py imports, deliberately: each module names the builders it uses.
from tests.builders import (
    CORE,
    MEMORY,
    ON_S5000,
    SCHEDULER,
    VGPU,
    WHOLE,
    container,
    decode_patch,
    make_pod,
    patched,
    review_body,
)

MUTATE = "/mutate-pods"
VALIDATE = "/validate-pods"


# --- clients -------------------------------------------------------------------------------------------------------

def client_context(ca: Path, *, cert: certs.KeyPair | None = None, tmp: Path | None = None) -> ssl.SSLContext:
    """What kube-apiserver does: verify the server against the caBundle, hostname included."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        assert tmp is not None
        certs.write_pair(cert, tmp / "client.crt", tmp / "client.key")
        ctx.load_cert_chain(str(tmp / "client.crt"), str(tmp / "client.key"))
    return ctx


async def post(session: aiohttp.ClientSession, url: str, body: Any, ctx: ssl.SSLContext,
               path: str = MUTATE) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url + path, data=data, ssl=ctx,
                            headers={"Content-Type": "application/json", "Accept": "application/json"}) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


class Raw:
    """One TLS connection with HTTP/1.1 keep-alive, to see which certificate it was opened with."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext) -> Raw:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"), 5)
        return cls(reader, writer)

    @property
    def tls(self) -> ssl.SSLObject:
        return self.writer.get_extra_info("ssl_object")

    @property
    def serial(self) -> int:
        der = self.tls.getpeercert(binary_form=True)
        assert der, "the server sent no certificate"
        return x509.load_der_x509_certificate(der).serial_number

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), 5)
        headers = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)).decode().lower()
        length = int(next(h.split(":", 1)[1] for h in headers.split("\r\n") if h.startswith("content-length:")))
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def exclusive_s5000() -> dict[str, Any]:
    return make_pod(container("train", limits={VGPU: 1}), name="exclusive", nodeSelector=dict(ON_S5000))


def good_review() -> dict[str, Any]:
    return review_body(make_pod(container("task", limits={VGPU: 1, MEMORY: 32, CORE: 8})), uid="good-uid")


async def assert_still_serving(session, url, ctx) -> None:
    status, body = await post(session, url, good_review(), ctx)
    assert status == 200
    assert body["response"]["uid"] == "good-uid" and body["response"]["allowed"] is True


# --- reviews -------------------------------------------------------------------------------------------------------

async def test_exclusive_pod_is_filled_with_the_pinned_card(webhook_server, session):
    url, ca, _ = webhook_server
    pod = exclusive_s5000()
    review = review_body(pod, uid="7d4c8f3e-1")
    async with session.post(url + MUTATE, json=review, ssl=client_context(ca)) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "7d4c8f3e-1"
    assert response["allowed"] is True
    assert "status" not in response
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    assert all(op["op"] in ("add", "replace") for op in ops)
    assert all("mthreads.com/" not in op["path"] for op in ops), "'/' in resource names must be escaped as ~1"
    assert any(op["path"].endswith("mthreads.com~1sgpu-memory") for op in ops)

    expected = copy.deepcopy(pod)
    expected["spec"]["schedulerName"] = SCHEDULER
    for part in ("limits", "requests"):
        expected["spec"]["containers"][0]["resources"][part] = {VGPU: "1", MEMORY: "160", CORE: "16"}
    expected["metadata"].setdefault("annotations", {})[RECORD] = record(expected, Config())
    assert jsonpatch.apply_patch(pod, ops) == expected
    assert any("160" in w and "train" in w for w in response["warnings"])


async def test_scheduler_rewrite_alone_has_no_warning(webhook_server, session):
    url, ca, _ = webhook_server
    pod = make_pod(container("task", limits={VGPU: 1, MEMORY: 32, CORE: 8}))
    _, body = await post(session, url, review_body(pod), client_context(ca))
    response = body["response"]
    assert response["allowed"] is True
    ops = decode_patch(response)
    assert ops[0] == {"op": "replace", "path": "/spec/schedulerName", "value": SCHEDULER}
    assert [op["path"] for op in ops[1:]] == ["/metadata/annotations"]  # the record (SPEC 5), no resources
    assert "warnings" not in response


async def test_limits_only_pod_gets_requests_too(webhook_server, session):
    """The upstream bug: a patch of limits alone leaves requests the API server rejects."""
    url, ca, _ = webhook_server
    pod = make_pod(container("train", limits={VGPU: "2"}), nodeSelector=dict(ON_S5000), defaults=False)
    _, body = await post(session, url, review_body(pod), client_context(ca))
    response = body["response"]
    assert response["allowed"] is True
    out = patched(pod, response)
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"] == {VGPU: "2", MEMORY: "320", CORE: "32"}
    assert out["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    assert out["spec"]["schedulerName"] == SCHEDULER


async def test_pod_without_slices_passes_untouched(webhook_server, session):
    url, ca, _ = webhook_server
    pod = make_pod(container("infer", limits={WHOLE: 1, "cpu": "2"}))
    _, body = await post(session, url, review_body(pod, uid="plain"), client_context(ca))
    assert body["response"] == {"uid": "plain", "allowed": True}


async def test_dry_run_gets_the_same_answer(webhook_server, session):
    url, ca, state = webhook_server
    ctx = client_context(ca)
    pod = make_pod(container("task", limits={VGPU: 1, MEMORY: 20}))
    _, wet = await post(session, url, review_body(pod, uid="same"), ctx)
    _, dry = await post(session, url, review_body(pod, uid="same", dry_run=True), ctx)
    assert dry == wet
    assert wet["response"]["allowed"] is True and wet["response"]["warnings"]
    assert state.view.ready and len(state.view) == 2  # nothing was changed by either


async def test_v1beta1_review_is_answered_in_kind(webhook_server, session):
    url, ca, _ = webhook_server
    review = review_body(make_pod(), api_version="admission.k8s.io/v1beta1", uid="beta")
    _, body = await post(session, url, review, client_context(ca))
    assert body["apiVersion"] == "admission.k8s.io/v1beta1"
    assert body["response"]["uid"] == "beta"


async def test_validating_webhook_allows_the_mutated_pod_and_never_patches(webhook_server, session):
    url, ca, _ = webhook_server
    ctx = client_context(ca)
    pod = exclusive_s5000()
    _, mutated = await post(session, url, review_body(pod), ctx)
    final = patched(pod, mutated["response"])
    _, body = await post(session, url, review_body(final, uid="v1"), ctx, VALIDATE)
    assert body["response"] == {"uid": "v1", "allowed": True}

    # Another mutating webhook lowered a request after ours: the validating webhook denies it.
    changed = copy.deepcopy(final)
    changed["spec"]["containers"][0]["resources"]["requests"][MEMORY] = "20"
    _, body = await post(session, url, review_body(changed, uid="v2"), ctx, VALIDATE)
    response = body["response"]
    assert response["uid"] == "v2" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert '"train"' in response["status"]["message"]
    assert "patch" not in response and "patchType" not in response


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
async def test_other_operations_pass_untouched(webhook_server, session, operation):
    url, ca, _ = webhook_server
    pod = make_pod(container("task", limits={VGPU: 1, MEMORY: "abc"}))  # would be denied on CREATE
    review = review_body(pod, operation=operation, uid=f"op-{operation}", old=pod)
    for path in (MUTATE, VALIDATE):
        status, body = await post(session, url, review, client_context(ca), path)
        assert status == 200
        assert body["response"] == {"uid": f"op-{operation}", "allowed": True}


@pytest.mark.parametrize("method,path", [("POST", "/nope"), ("POST", "/"), ("GET", "/"), ("GET", MUTATE),
                                         ("POST", "/mutate-pods/extra"), ("PUT", MUTATE)])
async def test_unknown_paths_and_methods_never_allow(webhook_server, session, method, path):
    url, ca, _ = webhook_server
    data = json.dumps(good_review()).encode()
    async with session.request(method, url + path, data=data, ssl=client_context(ca)) as resp:
        text = await resp.text()
        assert resp.status in (404, 405), (resp.status, text)
    assert '"allowed":true' not in text.replace(" ", "")
    await assert_still_serving(session, url, client_context(ca))


# --- bad input -----------------------------------------------------------------------------------------------------

def _without(key: str) -> bytes:
    review = good_review()
    del review["request"][key]
    return json.dumps(review).encode()


BAD_BODIES = {
    "not json": (b"this is not json", 400),
    "empty body": (b"", 400),
    "json array": (b"[1, 2, 3]", 400),
    "json string": (b'"AdmissionReview"', 400),
    "no request": (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), 400),
    "request is a list": (json.dumps({"kind": "AdmissionReview", "request": []}).encode(), 400),
    "no uid": (_without("uid"), 400),
    "uid is a number": (json.dumps({"kind": "AdmissionReview", "request": {"uid": 5}}).encode(), 400),
    "invalid utf-8": (b'{"request": {"uid": "\xff\xfe"}}', 400),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
async def test_malformed_reviews_get_http_400_and_the_server_keeps_serving(webhook_server, session, name):
    url, ca, _ = webhook_server
    ctx = client_context(ca)
    body, status = BAD_BODIES[name]
    got, answer = await post(session, url, body, ctx)
    assert got == status
    assert isinstance(answer, dict) and answer["error"]
    assert "Traceback" not in json.dumps(answer)
    await assert_still_serving(session, url, ctx)


@pytest.mark.parametrize("name,obj,words", [
    ("no object", None, ["no object"]),
    ("no containers", make_pod(containers=[]), ["no containers"]),
    ("object is a list", [], ["not a Pod"]),
    ("no spec", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}, ["no spec"]),
    ("container is a string", make_pod(containers=["main"]), ["containers[0]"]),
    ("limits is a list", make_pod(containers=[{"name": "m", "resources": {"limits": [VGPU]}}]), ['"m"', "limits"]),
])
async def test_unreadable_pods_are_denied_with_code_400(webhook_server, session, name, obj, words):
    url, ca, _ = webhook_server
    ctx = client_context(ca)
    review = review_body(make_pod(), uid="bad-pod")
    review["request"]["object"] = obj
    status, body = await post(session, url, review, ctx)
    assert status == 200
    response = body["response"]
    assert response["uid"] == "bad-pod" and response["allowed"] is False
    assert response["status"]["code"] == 400
    for word in words:
        assert word in response["status"]["message"]
    await assert_still_serving(session, url, ctx)


@pytest.mark.parametrize("resource,value,valid", [
    (MEMORY, "abc", "whole number of 512 MiB units"),
    (CORE, "1.5", "1 to 16"),
    (MEMORY, "1.5", "whole number of 512 MiB units"),
    (VGPU, "-1", "1 or more"),
    (VGPU, "0", "1 or more"),
    (CORE, "500m", "1 to 16"),
    (MEMORY, "1Gi", "write 2 for 1 GiB"),
])
async def test_bad_quantities_are_denied_naming_container_resource_value_and_what_is_valid(
        webhook_server, session, resource, value, valid):
    url, ca, _ = webhook_server
    ctx = client_context(ca)
    limits = {VGPU: 1, MEMORY: 32, CORE: 8}
    limits[resource] = value
    pod = make_pod(container("sidecar-ok"), container("worker", limits=limits))
    status, body = await post(session, url, review_body(pod, uid="q"), ctx)
    assert status == 200
    response = body["response"]
    assert response["uid"] == "q" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    message = response["status"]["message"]
    for word in ('"worker"', resource, value, valid):
        assert word in message, (word, message)
    assert "patch" not in response
    await assert_still_serving(session, url, ctx)


async def test_a_10_mb_body_gets_413(webhook_server, session):
    url, ca, state = webhook_server
    ctx = client_context(ca)
    review = good_review()
    review["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * (10 * 1024 * 1024)}
    status, _ = await post(session, url, review, ctx)
    assert status == 413
    await assert_still_serving(session, url, ctx)
    assert (_sample(state, "hami_mt_webhook_bad_requests_total", webhook="mutate-pods") or 0) >= 1


# --- TLS -----------------------------------------------------------------------------------------------------------

async def test_tls13_by_default_http11_only(webhook_server):
    _, ca, _ = webhook_server
    ctx = client_context(ca)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    conn = await Raw.open(webhook_server.port, ctx)
    try:
        assert conn.tls.version() == "TLSv1.3"
        assert conn.tls.selected_alpn_protocol() == "http/1.1"
        status, _ = await conn.post(MUTATE, json.dumps(good_review()).encode())
        assert status == 200
    finally:
        await conn.close()

    h2_only = client_context(ca)
    h2_only.set_alpn_protocols(["h2"])
    try:
        conn = await Raw.open(webhook_server.port, h2_only)
    except (ssl.SSLError, ConnectionError):
        return  # refusing the handshake is as good as not offering h2
    try:
        assert conn.tls.selected_alpn_protocol() != "h2"
    finally:
        await conn.close()


async def test_tls12_is_accepted_with_a_forward_secret_aead_cipher(webhook_server):
    _, ca, _ = webhook_server
    ctx = client_context(ca)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    conn = await Raw.open(webhook_server.port, ctx)
    try:
        assert conn.tls.version() == "TLSv1.2"
        cipher = (conn.tls.cipher() or ("none",))[0]
        assert cipher.startswith("ECDHE-") and ("GCM" in cipher or "CHACHA20" in cipher)
        status, _ = await conn.post(MUTATE, json.dumps(good_review()).encode())
        assert status == 200
    finally:
        await conn.close()


async def test_tls11_is_refused(webhook_server):
    _, ca, _ = webhook_server
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(ca))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("ALL:@SECLEVEL=0")  # let this client offer TLS 1.1, so the server is what refuses it
    with pytest.raises((ssl.SSLError, ConnectionError)) as info:
        conn = await Raw.open(webhook_server.port, ctx)
        await conn.close()
    assert "NO_PROTOCOLS_AVAILABLE" not in str(info.value), "the client never offered TLS 1.1"


async def test_untrusting_client_refuses_the_server(webhook_server, tmp_path):
    """A caBundle from another CA: the API server must not talk to us (the chain is what makes this safe)."""
    _, _, _ = webhook_server
    other = tmp_path / "other-ca.crt"
    other.write_bytes(certs.new_ca().cert_pem())
    with pytest.raises(ssl.SSLCertVerificationError):
        await Raw.open(webhook_server.port, client_context(other))


async def test_client_certificate_required_when_client_ca_is_set(serve_webhook, session, tmp_path):
    api_ca = certs.new_ca("kube-apiserver-client-ca")
    (tmp_path / "client-ca.crt").write_bytes(api_ca.cert_pem())
    async with serve_webhook(client_ca=str(tmp_path / "client-ca.crt")) as running:
        url, ca, _ = running
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await post(session, url, good_review(), client_context(ca))

        stranger = certs.issue(certs.new_ca("stranger"), "kube-apiserver", client=True, server=False)
        stranger_dir = tmp_path / "stranger"
        stranger_dir.mkdir()
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await post(session, url, good_review(), client_context(ca, cert=stranger, tmp=stranger_dir))

        apiserver = certs.issue(api_ca, "kube-apiserver", client=True, server=False)
        status, body = await post(session, url, good_review(), client_context(ca, cert=apiserver, tmp=tmp_path))
        assert status == 200 and body["response"]["uid"] == "good-uid"


# --- certificate rotation ------------------------------------------------------------------------------------------

async def test_rotation_serves_the_new_certificate_and_keeps_open_connections(webhook_server):
    _, ca, state = webhook_server
    layout, srv, port = webhook_server.layout, webhook_server.server, webhook_server.port
    ctx = client_context(ca)
    good = json.dumps(good_review()).encode()
    old_serial = serial_of(layout.tls_cert)

    before = await Raw.open(port, ctx)
    try:
        assert before.serial == old_serial
        assert (await before.post(MUTATE, good))[0] == 200

        assert srv.certificates.reload() is False  # nothing changed yet
        assert certs.rotate(layout.root, force=True)
        new_serial = serial_of(layout.tls_cert)
        assert new_serial != old_serial
        assert srv.certificates.reload() is True

        after = await Raw.open(port, ctx)
        try:
            assert after.serial == new_serial
            assert (await after.post(MUTATE, good))[0] == 200
        finally:
            await after.close()

        # The keep-alive connection opened before the rotation still answers, on its old session.
        status, body = await before.post(MUTATE, good)
        assert status == 200 and json.loads(body)["response"]["uid"] == "good-uid"
        assert before.serial == old_serial
    finally:
        await before.close()
    assert _sample(state, "hami_mt_webhook_certificate_reloads_total", result="loaded") == 1
    expiry = certs.expiry(layout.tls_cert).timestamp()
    assert _sample(state, "hami_mt_webhook_certificate_expiry_timestamp_seconds") == pytest.approx(expiry)


async def test_rotation_is_picked_up_by_the_reload_interval(serve_webhook):
    async with serve_webhook(reload_interval=0.2) as running:
        ctx = client_context(running.ca_path)
        certs.rotate(running.layout.root, force=True)
        new_serial = serial_of(running.layout.tls_cert)
        async def serving_the_new() -> bool:
            conn = await Raw.open(running.port, ctx)
            await conn.close()
            return bool(conn.serial == new_serial)
        await until_async("the rotated certificate served", serving_the_new, 5.0, 0.1)


async def test_broken_certificate_files_are_not_loaded(webhook_server):
    _, ca, state = webhook_server
    layout, srv, port = webhook_server.layout, webhook_server.server, webhook_server.port
    ctx = client_context(ca)
    old_serial = serial_of(layout.tls_cert)
    good_cert = layout.tls_cert.read_bytes()
    good_key = layout.tls_key.read_bytes()

    async def served_serial() -> int:
        conn = await Raw.open(port, ctx)
        try:
            assert (await conn.post(MUTATE, json.dumps(good_review()).encode()))[0] == 200
            return conn.serial
        finally:
            await conn.close()

    fresh = certs.issue(certs.load_pair(layout.ca_cert, layout.ca_key), "hami-mt-webhook.hami-mt-webhook.svc",
                        ips=["127.0.0.1"])
    broken = {
        "half-written certificate": (fresh.cert_pem()[: len(fresh.cert_pem()) // 2], good_key),
        "garbage certificate": (b"\x00garbage\xff" * 20, good_key),
        "empty certificate": (b"", good_key),
        "new key, old certificate": (good_cert, fresh.key_pem()),
        "new certificate, old key": (fresh.cert_pem(), good_key),
    }
    for n, (cert_bytes, key_bytes) in enumerate(broken.values(), start=1):
        layout.tls_cert.write_bytes(cert_bytes)  # a plain write: what a careless renewer does
        layout.tls_key.write_bytes(key_bytes)
        assert srv.certificates.reload() is False
        assert await served_serial() == old_serial
        assert _sample(state, "hami_mt_webhook_certificate_reloads_total", result="failed") == n

    layout.tls_cert.unlink()
    assert srv.certificates.reload() is False
    assert await served_serial() == old_serial

    certs.write_pair(fresh, layout.tls_cert, layout.tls_key)
    assert srv.certificates.reload() is True
    assert await served_serial() == fresh.cert.serial_number


# --- metrics -------------------------------------------------------------------------------------------------------

def _sample(state, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(state.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


async def test_metrics_count_reviews_denials_and_certificate_expiry(webhook_server, session):
    url, ca, state = webhook_server
    ctx = client_context(ca)
    await post(session, url, review_body(exclusive_s5000()), ctx)                          # patched
    await post(session, url, review_body(exclusive_s5000(), dry_run=True), ctx)            # patched, dry run
    await post(session, url, review_body(make_pod(container("x", limits={"cpu": 1}))), ctx)  # allowed
    bad = make_pod(container("w", limits={VGPU: 1, MEMORY: "abc"}))
    await post(session, url, review_body(bad), ctx)                                        # denied: quantity
    await post(session, url, review_body(make_pod(), operation="DELETE"), ctx)             # allowed, DELETE
    unfilled = make_pod(container("t", limits={VGPU: 1}), schedulerName=SCHEDULER)
    await post(session, url, review_body(unfilled), ctx, VALIDATE)                         # denied on validate
    await post(session, url, b"nope", ctx)                                                 # bad request
    for n in range(3):
        await post(session, url, b"{}", ctx, f"/random-{n}")                               # unknown paths

    def reviews(**labels: str) -> float | None:
        return _sample(state, "hami_mt_webhook_reviews_total", **labels)

    assert reviews(webhook="mutate-pods", operation="CREATE", dry_run="false", result="patched") == 1
    assert reviews(webhook="mutate-pods", operation="CREATE", dry_run="true", result="patched") == 1
    assert reviews(webhook="mutate-pods", operation="CREATE", dry_run="false", result="allowed") == 1
    assert reviews(webhook="mutate-pods", operation="CREATE", dry_run="false", result="denied") == 1
    assert reviews(webhook="mutate-pods", operation="DELETE", dry_run="false", result="allowed") == 1
    assert reviews(webhook="validate-pods", operation="CREATE", dry_run="false", result="denied") == 1
    assert _sample(state, "hami_mt_webhook_denials_total", webhook="mutate-pods", reason="quantity") == 1
    assert _sample(state, "hami_mt_webhook_denials_total", webhook="validate-pods",
                   reason="changed-after-mutation") == 1
    assert _sample(state, "hami_mt_webhook_mutations_total", kind="exclusive") == 2
    assert _sample(state, "hami_mt_webhook_bad_requests_total", webhook="mutate-pods") == 1
    assert _sample(state, "hami_mt_webhook_review_duration_seconds_count", webhook="mutate-pods") == 5
    expiry = certs.expiry(webhook_server.layout.tls_cert).timestamp()
    assert _sample(state, "hami_mt_webhook_certificate_expiry_timestamp_seconds") == pytest.approx(expiry)
    # Paths nobody configured must not mint a label value each (unbounded cardinality).
    text = state.metrics.render().decode()
    assert "random-" not in text
    assert _sample(state, "hami_mt_webhook_bad_requests_total", webhook="unknown") == 3


async def test_warn_paths_answer_a_denial_as_a_warning(webhook_server, session):
    """SPEC 4.10: /warn/<webhook> is where namespaces labelled hami.io/enforcement: warn are sent."""
    url, ca, _ = webhook_server
    review = review_body(make_pod(container("task", limits={VGPU: 1, CORE: 4})), uid="warn-uid")
    _, denied = await post(session, url, review, client_context(ca))
    assert denied["response"]["allowed"] is False
    status, warned = await post(session, url, review, client_context(ca), "/warn" + MUTATE)
    assert status == 200
    response = warned["response"]
    assert response["allowed"] is True and "would deny: " + denied["response"]["status"]["message"] in \
        response["warnings"]
    assert decode_patch(response) == [{"op": "replace", "path": "/spec/schedulerName", "value": SCHEDULER}]
    for path in ("/warn/nope", "/warn/warn" + MUTATE, "/warn"):
        status, _ = await post(session, url, review, client_context(ca), path)
        assert status in (404, 405), path
