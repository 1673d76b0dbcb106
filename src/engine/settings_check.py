"""The settings check at deployment: what the functions would refuse at start fails `sam deploy` instead.

The template's custom resource `SettingsCheck` sends this function the environment every function
gets (template.yaml keeps the two equal, and a test holds them so). `check_environment` reads it
with the engine's own `load_settings` and builds each function's parts from it, as each function
does on its first invocation (no AWS request is made): the deploy-time check and the run-time parse
are the same code, so they cannot disagree. A problem fails the deployment with the one line that
names the variable; what passes yields a fingerprint of the settings, which every function's
published version carries in its description, so that a deployment that changes only settings
still publishes new versions behind the alias `live`.

`handle` answers CloudFormation's request: a PUT of SUCCESS or FAILED to its pre-signed URL. It
always answers (CloudFormation would otherwise wait for the request to time out), and a Delete
always succeeds: there is nothing to remove.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from engine.config import load_settings
from engine.core.errors import ConfigurationError
from engine.observability import log_unexpected, logger
from engine.text import one_line
from engine.wiring import build_every_function

# The physical id of the check: one per stack, never replaced.
PHYSICAL_ID = "aijobs-settings-check"
# Seconds to deliver the answer: CloudFormation's pre-signed URL is an S3 object.
RESPONSE_TIMEOUT_SECONDS = 30


Respond = Callable[[str, dict[str, Any]], None]


def check_environment(environment: Mapping[str, str]) -> str:
    """The environment's fingerprint when every function accepts it; ConfigurationError otherwise."""
    build_every_function(load_settings(environment))
    canonical = json.dumps(dict(environment), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def handle(event: Mapping[str, Any], respond: Respond | None = None) -> dict[str, Any]:
    """Answer one CloudFormation request (Create, Update or Delete); returns the answer sent."""
    answer: dict[str, Any] = {
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "PhysicalResourceId": event.get("PhysicalResourceId") or PHYSICAL_ID,
    }
    if event["RequestType"] == "Delete":
        answer |= {"Status": "SUCCESS"}
    else:
        answer |= _checked(event.get("ResourceProperties", {}).get("Environment"))
    (respond or put_response)(event["ResponseURL"], answer)
    return answer


def _checked(environment: object) -> dict[str, Any]:
    try:
        if not isinstance(environment, dict):
            raise ConfigurationError("SettingsCheck: its Environment property is missing")
        fingerprint = check_environment({str(name): str(value) for name, value in environment.items()})
    except ConfigurationError as exc:
        logger.warning("settings refused", extra={"reason": str(exc)})
        return {"Status": "FAILED", "Reason": one_line(str(exc))}
    except Exception as exc:
        log_unexpected("the settings check failed", exc)
        return {"Status": "FAILED", "Reason": f"the settings check failed unexpectedly ({type(exc).__name__})"}
    return {"Status": "SUCCESS", "Data": {"Fingerprint": fingerprint}}


def put_response(url: str, answer: dict[str, Any]) -> None:
    """PUT the answer to CloudFormation's pre-signed URL (signed for no content type)."""
    body = json.dumps(answer).encode()
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": ""})
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_SECONDS) as response:
        response.read()
