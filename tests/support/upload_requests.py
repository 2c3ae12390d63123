"""Uploads a recording to callstream's POST /api/transcribe with Python `requests`, as Python
clients do: either the usual `files=`/`data=` form (flags given as Python booleans, which
`requests` sends as "True"/"False"), or a multipart body streamed from a generator, which
`requests` sends chunked, without a Content-Length. Prints the status, the transfer encoding
used and the JSON answer.

usage: upload_requests.py URL API_KEY FILE (form|chunked)
"""

import json
import sys
import uuid

import requests

url, key, path, mode = sys.argv[1:5]
headers = {"X-API-Key": key}
if mode == "form":
    with open(path, "rb") as f:
        response = requests.post(
            url,
            headers=headers,
            files={"file": ("call.wav", f, "audio/wav")},
            data={"extract_bant": True, "extract_neat": False},
            timeout=600,
        )
else:
    boundary = uuid.uuid4().hex

    def field(name, value):
        return (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                f"{value}\r\n").encode()

    def body():
        yield field("extract_bant", "0")
        yield field("extract_neat", "TRUE")
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
               f'filename="call.wav"\r\nContent-Type: audio/wav\r\n\r\n').encode()
        with open(path, "rb") as f:
            while chunk := f.read(16384):
                yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    response = requests.post(url, headers=headers, data=body(), timeout=600)
print(json.dumps({
    "status": response.status_code,
    "transfer_encoding": response.request.headers.get("Transfer-Encoding"),
    "content_length": response.request.headers.get("Content-Length"),
    "body": response.json(),
}))
