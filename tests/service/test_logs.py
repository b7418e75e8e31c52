"""Log lines: one per denial and per mutation, none for allowed no-ops; JSON that never breaks."""

from __future__ import annotations

import io
import json
import logging
import re
import ssl
from pathlib import Path

import aiohttp

from hami_mt_webhook.rules.decision import Change, Decision
from hami_mt_webhook.service.logs import JsonLines
from hami_mt_webhook.service.serving.endpoint import log_decision
from tests.builders import MEMORY, VGPU, WHOLE, container, make_pod, review_body

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


async def post(url: str, ca_path, body: dict) -> dict:
    ctx = ssl.create_default_context(cafile=str(ca_path))
    async with aiohttp.ClientSession() as session, session.post(f"{url}/mutate-pods", json=body, ssl=ctx) as r:
        return await r.json()


async def test_one_line_per_denial_and_mutation_and_none_for_no_ops(webhook_server, caplog):
    url, ca_path, _ = webhook_server
    with caplog.at_level(logging.INFO, logger="hami_mt_webhook"):
        await post(url, ca_path, review_body(make_pod(container(limits={"cpu": "1"}))))  # no-op
        await post(url, ca_path, review_body(make_pod(container(limits={WHOLE: 1}))))  # no-op
        await post(url, ca_path, review_body(make_pod(container(limits={VGPU: 1, MEMORY: 20}), name="snapped")))
        await post(url, ca_path, review_body(make_pod(container("bad", limits={WHOLE: 1, VGPU: 1}), name="mixed")))
    lines = [r for r in caplog.records if r.name == "hami_mt_webhook"]
    assert [r.getMessage().split(":")[0] for r in lines] == ["mutated", "denied"]
    mutated, denied = lines
    assert mutated.object == "snapped" and mutated.kind == "Pod" and "snap" in mutated.getMessage() and mutated.warnings
    assert denied.object == "mixed" and denied.reason == "mixing" and 'container "bad"' in denied.getMessage()


def test_json_lines_keep_known_fields_and_survive_odd_records():
    formatter = JsonLines()
    record = logging.LogRecord("hami_mt_webhook", logging.INFO, __file__, 1, "denied: %s", ("x",), None)
    record.__dict__.update(object="p", reason="mixing", settings=object())  # foreign extras are left out
    out = json.loads(formatter.format(record))
    assert out["message"] == "denied: x" and out["object"] == "p" and out["reason"] == "mixing"
    assert "settings" not in out
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record = logging.LogRecord("kopf", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(formatter.format(record))["exception"]


def test_lines_are_flushed_on_a_timer_and_errors_at_once():
    import io
    import time

    from hami_mt_webhook.service.logs import BatchedStreamHandler

    class Counting(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            type(self).flushes += 1
            super().flush()

    stream = Counting()
    handler = BatchedStreamHandler(stream, interval=0.05)
    handler.setFormatter(JsonLines())
    log = logging.getLogger("test.batched")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(100):
            log.warning("line %d", i)
        assert Counting.flushes < 5  # not one flush per line
        time.sleep(0.2)
        assert Counting.flushes >= 1 and stream.getvalue().count("\n") == 100
        before = Counting.flushes
        log.error("now")
        assert Counting.flushes == before + 1
    finally:
        log.removeHandler(handler)
        handler.close()


def _documented_fields() -> set[str]:
    """The fields in the table of operating.md's Logs section (first column, backticked)."""
    section = OPERATING.read_text().split("\n## Logs", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row)}


def test_operating_md_names_the_fields_the_log_lines_have():
    request = review_body(make_pod(container(limits={VGPU: 1}), name="p", namespace="ns"))["request"]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    logger = logging.getLogger("hami_mt_webhook")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        log_decision("mutate-pods", request, Decision.deny("no", "mixing"))
        patched = Decision(changes=[Change("add", ("spec", "schedulerName"), "hami-scheduler")], warnings=["w"],
                           mutations=["snap"])
        log_decision("mutate-pods", request, patched)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    denied, mutated = (json.loads(line) for line in stream.getvalue().splitlines())
    assert denied["object"] == "p" and denied["namespace"] == "ns" and denied["kind"] == "Pod"
    assert _documented_fields() == set(denied) | set(mutated)
