"""The cloud layer's own error type, so ``cloud/`` stands alone (no import of ``orchestrator``).

Why one type: every failure a user can fix - a refused API call, a missing credential, a malformed
price page or file, an unknown GPU or instance name - reaches the user as one line naming the
cloud, the call and the reason. The orchestrator CLI (and ``python -m cloud.cli``) turn it into
``error: ...`` on stderr and exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class CloudError(ValueError):
    """A failure a user can fix: ``"<cloud>: <call> failed: <reason>"``.

    ``cloud`` and ``call`` may be empty for input that belongs to no single API call (a price file,
    a name typed on the command line); the message is then just the reason. Never put a secret in
    ``reason``: name the credential (``AWS_ACCESS_KEY_ID``), never its value.
    """

    def __init__(self, cloud: str, call: str, reason: str) -> None:
        reason = " ".join(str(reason).split())  # one line, always
        if cloud and call:
            text = f"{cloud}: {call} failed: {reason}"
        elif cloud or call:
            text = f"{cloud or call}: {reason}"
        else:
            text = reason
        super().__init__(text)
        self.cloud, self.call, self.reason = cloud, call, reason


class CloudInputError(CloudError):
    """Bad input to the cloud layer that is not an API answer (a file, a flag, a name)."""

    def __init__(self, message: str) -> None:
        super().__init__("", "", message)


__all__ = ["CloudError", "CloudInputError"]
