"""Who a client acts as, as a review records it (docs/pipelines.md): the ARN STS gives a deployed stack's
caller, the OS user when STS cannot say or the stack is the embedded one."""

from __future__ import annotations

import os
import pwd
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from aijobs.client import caller_arn, os_user
from engine.wiring import Aws

ARN = "arn:aws:sts::123456789012:assumed-role/reviewers/ana"
# Where getpass looks for a login name, in its order, before the account of the process's uid.
LOGIN_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")


class Sts:
    def __init__(self, fault: Exception | None = None) -> None:
        self.fault = fault
        self.calls = 0

    def get_caller_identity(self) -> dict[str, Any]:
        self.calls += 1
        if self.fault is not None:
            raise self.fault
        return {"Arn": ARN, "Account": "123456789012", "UserId": "AROAEXAMPLE:ana"}


class FakeAws:
    def __init__(self, sts: Sts) -> None:
        self.sts = sts

    def client(self, service: str) -> Sts:
        assert service == "sts"
        return self.sts


def test_a_deployed_stacks_caller_is_the_arn_sts_names() -> None:
    assert caller_arn(cast(Aws, FakeAws(Sts()))) == ARN


@pytest.mark.parametrize(
    "fault",
    [
        EndpointConnectionError(endpoint_url="https://sts.eu-west-1.amazonaws.com"),
        ClientError({"Error": {"Code": "ExpiredToken", "Message": "expired"}}, "GetCallerIdentity"),
    ],
)
def test_a_caller_sts_cannot_name_is_the_os_user(monkeypatch: pytest.MonkeyPatch, fault: Exception) -> None:
    for name in LOGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USER", "ana")

    assert caller_arn(cast(Aws, FakeAws(Sts(fault)))) == "ana"


def test_the_os_user_is_the_login_name_the_environment_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LOGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USER", "ana")

    assert os_user() == "ana"


def test_without_a_login_name_the_os_user_is_the_account_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a shell that names no user (a container, cron, CI: USER unset)
    for name in LOGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    # When a review asks who decides, Then it is this process's account, as the docs promise
    assert os_user() == pwd.getpwuid(os.getuid()).pw_name


def test_the_os_user_is_none_for_a_uid_with_no_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LOGIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def no_account(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_account)

    assert os_user() is None
