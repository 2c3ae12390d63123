"""Streams a chat completion from callstream with the official OpenAI Python SDK, the way an
application using `stream=True` would, and prints what it received as one JSON object:
the text pieces, the finish reason, the usage of the last chunk and the roles announced.

usage: openai_stream.py BASE_URL API_KEY PROMPT RETURN_MARKDOWN(true|false) MAX_TOKENS
"""

import json
import sys

from openai import OpenAI

base_url, key, prompt, markdown, max_tokens = sys.argv[1:6]
# The key goes where the SDK puts it (Authorization: Bearer); callstream accepts it there.
client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
stream = client.chat.completions.create(
    model="callstream",
    messages=[{"role": "user", "content": prompt}],
    max_tokens=int(max_tokens),
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
    extra_body={"return_markdown": markdown == "true"},
)
pieces, finish, usage, roles, ids = [], None, None, [], set()
for chunk in stream:
    ids.add(chunk.id)
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
print(json.dumps({"pieces": pieces, "finish_reason": finish, "usage": usage, "roles": roles,
                  "ids": len(ids)}))
