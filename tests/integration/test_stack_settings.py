"""The embedded stack creates the template's table and bucket settings (as far as moto keeps them)."""

from __future__ import annotations

from typing import Any

import boto3

from aijobs.stack import StackResources


def test_the_table_has_ttl_point_in_time_recovery_and_encryption(stack: StackResources, dynamodb: Any) -> None:
    ttl = dynamodb.describe_time_to_live(TableName=stack.table_name)["TimeToLiveDescription"]
    backups = dynamodb.describe_continuous_backups(TableName=stack.table_name)["ContinuousBackupsDescription"]
    table = dynamodb.describe_table(TableName=stack.table_name)["Table"]

    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
    assert (table["SSEDescription"]["Status"], table["SSEDescription"]["SSEType"]) == ("ENABLED", "KMS")
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_the_payload_bucket_is_private_encrypted_and_expires_with_the_retention(stack: StackResources) -> None:
    s3 = boto3.client("s3")

    block = s3.get_public_access_block(Bucket=stack.payload_bucket)["PublicAccessBlockConfiguration"]
    (rule,) = s3.get_bucket_encryption(Bucket=stack.payload_bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    (expiry,) = s3.get_bucket_lifecycle_configuration(Bucket=stack.payload_bucket)["Rules"]

    assert block == dict.fromkeys(block, True)
    assert len(block) == 4
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert (expiry["Status"], expiry["Expiration"]["Days"]) == ("Enabled", 90)
