from datetime import datetime, timezone

import boto3
import pytest
from botocore.exceptions import ClientError, NoCredentialsError
from botocore.stub import Stubber

from cloud.aws import AwsPriceSource, classify
from cloud.records import PriceRecord
from cloud.sources import CloudError, retry_call
from cloud.store import PriceStore

START = datetime(2020, 3, 1, tzinfo=timezone.utc)
END = datetime(2020, 3, 2, tzinfo=timezone.utc)
TYPES_RESPONSE = {"InstanceTypes": [{
    "InstanceType": "p3.8xlarge",
    "GpuInfo": {"Gpus": [{"Name": "V100", "Manufacturer": "NVIDIA", "Count": 4, "MemoryInfo": {"SizeInMiB": 16384}}],
                "TotalGpuMemoryInMiB": 65536},
}]}


def spot_item(zone: str, price: str, hour: int) -> dict:
    return {"AvailabilityZone": zone, "InstanceType": "p3.8xlarge", "ProductDescription": "Linux/UNIX",
            "SpotPrice": price, "Timestamp": datetime(2020, 3, 1, hour, tzinfo=timezone.utc)}


@pytest.fixture
def ec2():
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def history_params(token: str | None = None) -> dict:
    params = {"InstanceTypes": ["p3.8xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": START, "EndTime": END}
    if token:
        params["NextToken"] = token
    return params


def test_fetch_follows_pages_and_uses_instance_type_gpu_info(ec2):
    client, stub = ec2
    stub.add_response("describe_instance_types", TYPES_RESPONSE,
                      {"Filters": [{"Name": "instance-type", "Values": ["p3.8xlarge"]}]})
    stub.add_response("describe_spot_price_history",
                      {"SpotPriceHistory": [spot_item("us-east-1a", "3.90", 1)], "NextToken": "page2"}, history_params())
    stub.add_response("describe_spot_price_history",
                      {"SpotPriceHistory": [spot_item("us-east-1b", "3.70", 2)], "NextToken": ""}, history_params("page2"))
    source = AwsPriceSource(client_factory=lambda region: client, on_demand=lambda: [])
    records = list(source.fetch(["us-east-1"], ["p3.8xlarge"], START, END))
    assert [(r.zone, r.usd_per_hour) for r in records] == [("us-east-1a", 3.90), ("us-east-1b", 3.70)]
    assert all(r.gpu_type == "V100" and r.gpu_count == 4 and r.spot and r.region == "us-east-1" for r in records)


def test_throttling_is_retried_then_succeeds(ec2):
    client, stub = ec2
    stub.add_response("describe_instance_types", TYPES_RESPONSE)
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "Request limit exceeded.", 503)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [spot_item("us-east-1a", "4.0", 3)]})
    sleeps: list[float] = []
    source = AwsPriceSource(client_factory=lambda region: client, sleep=sleeps.append, on_demand=lambda: [])
    records = list(source.fetch(["us-east-1"], ["p3.8xlarge"], START, END))
    assert len(records) == 1 and len(sleeps) == 1 and sleeps[0] > 0


def test_permanent_error_names_cloud_call_and_reason(ec2):
    client, stub = ec2
    stub.add_client_error("describe_instance_types", "UnauthorizedOperation", "You are not authorized.", 403)
    source = AwsPriceSource(client_factory=lambda region: client, sleep=lambda s: None)
    with pytest.raises(CloudError, match=r"aws: describe_instance_types failed: UnauthorizedOperation"):
        list(source.fetch(["us-east-1"], ["p3.8xlarge"], START, END))


def test_missing_credentials_become_one_line_error():
    def boom() -> None:
        raise NoCredentialsError()

    with pytest.raises(CloudError) as info:
        retry_call(boom, cloud="aws", call="describe_spot_price_history", classify=classify)
    assert "no AWS credentials" in str(info.value) and "\n" not in str(info.value)


def test_retry_gives_up_after_attempts():
    calls = []

    def flaky() -> None:
        calls.append(1)
        raise ClientError({"Error": {"Code": "Throttling", "Message": "slow down"}}, "DescribeSpotPriceHistory")

    with pytest.raises(CloudError, match="after 3 attempts"):
        retry_call(flaky, cloud="aws", call="x", classify=classify, attempts=3, sleep=lambda s: None)
    assert len(calls) == 3


def test_on_demand_rows_come_from_bundled_snapshot_and_refresh_is_incremental(ec2):
    client, stub = ec2
    stub.add_response("describe_instance_types", TYPES_RESPONSE)
    old = PriceRecord(datetime(2020, 2, 29, tzinfo=timezone.utc), "aws", "us-east-1", "us-east-1a", "p3.8xlarge",
                      "V100", 4, True, 4.2, "test")
    # incremental: the window starts at the newest price already held
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [spot_item("us-east-1a", "3.9", 5)]},
                      {**history_params(), "StartTime": old.timestamp})
    source = AwsPriceSource(client_factory=lambda region: client)
    store = PriceStore.from_records([old]).refresh(source, ["us-east-1"], ["p3.8xlarge"], now=END)
    frame = store.frame
    assert set(frame.usd_per_hour[frame.spot]) == {4.2, 3.9}
    on_demand = frame[~frame.spot]
    assert list(on_demand.instance_type) == ["p3.8xlarge"] and on_demand.usd_per_hour.iloc[0] > 3.9
