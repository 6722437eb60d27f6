"""Rows in -> offers out for each price source over the realistic fixtures of tests/cloud.

Used by ``benchmarks/cloud.py --fixtures``. Each case runs the real SDK client the product uses
(boto3 under botocore's Stubber, or any client against a loopback HTTP server) over the fixtures
the tests use, so this table and the tests can never disagree about what a case contains.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from tests.cloud import fixtures_aws as fa
from tests.cloud import fixtures_azure as fz
from tests.cloud import fixtures_gcp as fg
from tests.cloud.conftest import Loopback

Row = dict[str, Any]


@contextmanager
def servers() -> Iterator[Callable[[Any], Loopback]]:
    made: list[Loopback] = []

    def make(route: Any) -> Loopback:
        made.append(Loopback(route))
        return made[-1]

    try:
        yield make
    finally:
        for server in made:
            server.close()


def run(cloud: str, case: str, rows_in: int, fn: Callable[[], tuple[list[Any], list[str]]]) -> Row:
    from cloud.errors import CloudError

    try:
        records, skipped = fn()
    except CloudError as exc:
        return {"cloud": cloud, "case": case, "rows_in": rows_in, "offers_out": 0, "note": f"error: {exc}"}
    note = "; ".join(skipped) if skipped else "-"
    return {"cloud": cloud, "case": case, "rows_in": rows_in, "offers_out": len(records), "note": note}


def aws_rows() -> list[Row]:
    from tests.cloud.test_aws import Clients, script_region

    from cloud.aws import AwsPriceSource

    def full() -> tuple[list[Any], list[str]]:
        clients = Clients()
        clients.stub("ec2", "us-east-1").add_response("describe_regions", fa.REGIONS)
        clients.stub("ec2", "ap-south-2").add_client_error("describe_instance_types", **fa.auth_failure("ap-south-2"))
        script_region(clients, "eu-west-1")
        script_region(clients, "us-east-1")
        source = AwsPriceSource(client_factory=clients)
        return list(source.fetch(instance_types=fa.TYPES, end=fa.NOW)), source.skipped

    def bad_pricing(entry: str) -> Callable[[], tuple[list[Any], list[str]]]:
        def go() -> tuple[list[Any], list[str]]:
            clients = Clients()
            ec2 = clients.stub("ec2", "us-east-1")
            ec2.add_response("describe_instance_types", fa.instance_types())
            ec2.add_response("describe_spot_price_history", {"SpotPriceHistory": fa.spot_items("us-east-1")})
            clients.stub("pricing", "us-east-1").add_response("get_products", {"PriceList": [entry]})
            return list(AwsPriceSource(client_factory=clients).fetch(["us-east-1"], fa.TYPES, end=fa.NOW)), []
        return go

    def expired() -> tuple[list[Any], list[str]]:
        clients = Clients()
        clients.stub("ec2", "us-east-1").add_client_error(
            "describe_instance_types", "ExpiredToken", "The security token AKIATESTONLY included in the request is expired", 400)
        return list(AwsPriceSource(client_factory=clients).fetch(["us-east-1"], fa.TYPES, end=fa.NOW)), []

    per_region = len(fa.spot_items("us-east-1")) + len(fa.TYPES)
    return [
        run("aws", "3 regions from describe_regions, 1 opt-in (AuthFailure); H100/H200/L4/V100", 2 * per_region, full),
        run("aws", "PriceList entry truncated (malformed page)", len(fa.spot_items("us-east-1")) + 1,
            bad_pricing('{"product": {"attributes"')),
        run("aws", "on-demand price 'n/a' (not a number)", len(fa.spot_items("us-east-1")) + 1,
            bad_pricing(fa.price_item("p5.48xlarge", "us-east-1", "n/a"))),
        run("aws", "expired credentials (key id in the message)", 0, expired),
        aws_retry_row(),
    ]


def aws_retry_row() -> Row:
    import boto3
    from urllib.parse import parse_qs

    from cloud.aws import AwsPriceSource
    from cloud.sources import botocore_config

    asked: list[str] = []

    def route(method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        token = parse_qs(headers.get(":body", "")).get("NextToken", [""])[0]
        asked.append(token or "first")
        if not token:
            return 200, fa.spot_xml([("us-east-1a", "p3.8xlarge", "3.90", "2026-11-01T11:00:00.000Z")], "page2")
        if asked.count("page2") == 1:
            return 503, fa.ec2_error_xml("RequestLimitExceeded", "Request limit exceeded.")
        return 200, fa.spot_xml([("us-east-1b", "p3.8xlarge", "3.70", "2026-11-01T11:30:00.000Z")])

    with servers() as make:
        server = make(route)
        client = boto3.client("ec2", region_name="us-east-1", endpoint_url=server.url,  # type: ignore[call-overload]
                              config=botocore_config(), aws_access_key_id="x", aws_secret_access_key="y")
        source = AwsPriceSource(client_factory=lambda service, region: client)
        items = source.spot("us-east-1", ["p3.8xlarge"], datetime(2026, 11, 1, tzinfo=timezone.utc), fa.NOW)
    return {"cloud": "aws", "case": "page 2 throttled once (503 RequestLimitExceeded), loopback EC2", "rows_in": 2,
            "offers_out": len(items), "note": f"requests: {' -> '.join(asked)} (botocore retried page 2 only)"}


def gcp_rows() -> list[Row]:
    from tests.cloud.test_gcp import route_with, source_for

    skus = sum(len(p["skus"]) for p in fg.SKU_PAGES)
    rows = []
    for case, pages, fail in (
        ("A3/A3 Ultra/G2/N1 hosts, K80 deprecated, vws, unknown accelerator; 3 SKU pages", fg.SKU_PAGES, None),
        ("SKU page 2 answers 503 once", fg.SKU_PAGES, "p2"),
        ("SKU page is not JSON (malformed page)", ["{ not json"] * 3, None),
        ("unit price units 'two' (not a number)", [{"skus": [{**fg.GPU_SKUS[0], "pricingInfo": [{"pricingExpression": {
            "tieredRates": [{"unitPrice": {"units": "two", "nanos": 0}}]}}]}]}] * 3, None),
    ):
        asked: list[str] = []
        with servers() as make:
            server = make(route_with(pages, asked, fail_once=fail))
            source = source_for(server.url)
            row = run("gcp", case, skus if pages is fg.SKU_PAGES else 1, lambda: (list(source.fetch()), source.skipped))
        if fail:
            row["note"] = f"SKU requests: {' -> '.join(asked)} (google-api-core retried page 2 only)"
        rows.append(row)
    with servers() as make:
        server = make(lambda m, p, h: (403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}))
        source = source_for(server.url)
        rows.append(run("gcp", "HTTP 403 (no billing.viewer role)", 0, lambda: (list(source.fetch()), [])))
    return rows


def azure_rows() -> list[Row]:
    from tests.cloud.test_azure import serve, source

    meters = len(fz.PAGE1) + len(fz.PAGE2)
    rows = []
    for case, page2, fail in (
        ("resource_skus + 2 retail pages: Win, Cloud Services, Low Priority, zero, restricted, unknown family",
         None, False),
        ("retail page 2 answers 503 once", None, True),
        ("retailPrice 'n/a' (not a number)", {"Items": [fz.meter("Standard_NC6s_v3", "NC6s v3", "n/a", "x")]}, False),
        ("retail page is HTML (malformed page)", "<html>gateway</html>", False),
    ):
        with servers() as make:
            server, asked = serve(make, second_page=page2, fail_second_once=fail)
            src = source(server)
            row = run("azure", case, meters if page2 is None else len(fz.PAGE1) + 1,
                      lambda: (list(src.fetch(["eastus"])), src.skipped))
        if fail:
            row["note"] = f"retail requests: {' -> '.join(asked)} (azure-core retried page 2 only)"
        rows.append(row)
    with servers() as make:
        server = make(lambda m, p, h: (401, {"error": {"code": "ExpiredAuthenticationToken", "message": "expired"}}))
        src = source(server)
        rows.append(run("azure", "HTTP 401 on resource_skus (expired token)", 0, lambda: (list(src.fetch(["eastus"])), [])))
    return rows


def watcher_rows() -> list[Row]:
    """Each watcher under a dead HTTP(S)_PROXY: the notice still arrives (the proxy is bypassed)."""
    from cloud.preemption import watcher_for

    routes: dict[str, Callable[[str, str, dict[str, str]], tuple[Any, ...]]] = {
        # a rebalance recommendation (an early warning, no deadline) and the interruption notice
        "aws": lambda m, p, h: (200, "T") if m == "PUT" else (
            (200, {"noticeTime": "2026-11-01T07:59:30Z"}) if p.endswith("/rebalance")
            else (200, {"action": "terminate", "time": "2026-11-01T08:02:00Z"})),
        "gcp": lambda m, p, h: (200, "TRUE", {"ETag": "e1"}),
        "azure": lambda m, p, h: (200, {"Events": [{"EventType": "Preempt", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}),
    }
    saved = {k: os.environ.get(k) for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")}
    rows = []
    try:
        for key in saved:
            if "no_proxy" in key.lower():
                os.environ.pop(key, None)
            else:
                os.environ[key] = "http://127.0.0.1:9"
        for cloud, route in routes.items():
            with servers() as make:
                server = make(route)
                got = threading.Event()
                watcher = watcher_for(cloud, lambda d: got.set(), base_url=server.url, poll_interval_s=0.02).start()
                fired = got.wait(5)
                watcher.stop()
            early = "".join(f"; early warning '{kind}'" for kind, _ in watcher.warnings)
            rows.append({"cloud": cloud, "case": "preemption watcher, dead HTTP(S)_PROXY in the environment",
                         "rows_in": len(server.requests), "offers_out": 0,
                         "note": (f"notice '{watcher.notice}' delivered" if fired else "NO NOTICE") + early})
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return rows


def fixture_rows() -> list[Row]:
    logging.getLogger("cloud").setLevel(logging.ERROR)
    return [*aws_rows(), *gcp_rows(), *azure_rows(), *watcher_rows()]
