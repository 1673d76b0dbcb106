"""Lambda entry point of the custom resource SettingsCheck: the functions' settings, checked at deployment."""

from typing import Any

from engine.settings_check import handle


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return handle(event)
