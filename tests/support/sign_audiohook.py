"""Signs an AudioHook WebSocket upgrade request with the PyPI `http-message-signatures`
package: an implementation of RFC 9421 independent of the service's own. Prints the headers
to send, as a JSON object.

usage: sign_audiohook.py URL CLIENT_ID CLIENT_SECRET_BASE64 [CREATED_UNIX_SECONDS]
"""

import base64
import datetime
import json
import secrets
import sys
import uuid

from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms


class Request:
    def __init__(self, url, headers):
        self.method = "GET"
        self.url = url
        self.headers = headers


class Secret(HTTPSignatureKeyResolver):
    def __init__(self, key):
        self.key = key

    def resolve_private_key(self, key_id):
        return self.key

    def resolve_public_key(self, key_id):
        return self.key


def main():
    url, client_id, secret = sys.argv[1:4]
    created = int(sys.argv[4]) if len(sys.argv) > 4 else int(datetime.datetime.now().timestamp())
    # The library resolves components from an http(s) URL; the WebSocket URL has the same
    # authority and target.
    http_url = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    headers = {
        "Audiohook-Organization-Id": str(uuid.uuid4()),
        "Audiohook-Correlation-Id": str(uuid.uuid4()),
        "Audiohook-Session-Id": str(uuid.uuid4()),
        "X-API-KEY": client_id,
    }
    request = Request(http_url, headers)
    signer = HTTPMessageSigner(
        signature_algorithm=algorithms.HMAC_SHA256,
        key_resolver=Secret(base64.b64decode(secret)),
    )
    when = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    signer.sign(
        request,
        key_id=client_id,
        label="sig1",
        nonce=base64.b64encode(secrets.token_bytes(18)).decode(),
        created=when,
        expires=when + datetime.timedelta(seconds=30),
        covered_component_ids=(
            "@request-target",
            "@authority",
            "audiohook-organization-id",
            "audiohook-session-id",
            "audiohook-correlation-id",
            "x-api-key",
        ),
    )
    print(json.dumps(dict(request.headers)))


if __name__ == "__main__":
    main()
