"""An OpenAI-compatible server on loopback, for running `callstream bench analysis` through the
upstream path (`[llm] provider = "upstream"`) against the same model: llama-cpp-python's server.

    python3 -m venv /tmp/llamasrv
    /tmp/llamasrv/bin/pip install 'llama-cpp-python[server]'     # builds llama.cpp (~10 min)
    /tmp/llamasrv/bin/python scripts/bench/openai_server.py MODEL.gguf 8099 &
    CALLSTREAM_LLM__PROVIDER=upstream \
    CALLSTREAM_LLM__UPSTREAM__BASE_URL=http://127.0.0.1:8099/v1 \
    CALLSTREAM_LLM__UPSTREAM__MODEL=qwen callstream bench analysis --text --no-speed

That server takes a schema as response_format {"type": "json_object", "schema": ...}: OpenAI's
{"type": "json_schema", "json_schema": {"schema": ...}}, which callstream sends, is translated to
it before the request is read. Its stream reports no token usage (callstream refuses a provider
that reports none), so a streamed request is answered whole and sent back as one content event,
one finish event and one usage event."""
import json
import sys

import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ModelSettings, ServerSettings

model, port = sys.argv[1], int(sys.argv[2])
app = create_app(
    server_settings=ServerSettings(host="127.0.0.1", port=port),
    model_settings=[ModelSettings(model=model, model_alias="qwen", n_ctx=8192, n_threads=2,
                                  n_batch=512, verbose=False)],
)


class Translate:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = json.loads(body)
        wanted = request.get("response_format")
        if wanted and wanted.get("type") == "json_schema":
            request["response_format"] = {"type": "json_object",
                                          "schema": wanted["json_schema"]["schema"]}
        streamed = request.get("stream", False)
        request["stream"] = False
        request.pop("stream_options", None)
        body = json.dumps(request).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = dict(scope, headers=headers)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if not streamed:
            return await self.app(scope, replay, send)
        status, answer = 200, b""

        async def keep(message):
            nonlocal status, answer
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                answer += message.get("body", b"")

        await self.app(scope, replay, keep)
        if status != 200:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": answer})
            return
        whole = json.loads(answer)
        choice = whole["choices"][0]
        events = [
            {"id": whole["id"], "object": "chat.completion.chunk", "model": whole["model"],
             "choices": [{"index": 0, "delta": {"role": "assistant",
                                                "content": choice["message"]["content"]},
                          "finish_reason": None}]},
            {"id": whole["id"], "object": "chat.completion.chunk", "model": whole["model"],
             "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
            {"id": whole["id"], "object": "chat.completion.chunk", "model": whole["model"],
             "choices": [], "usage": whole["usage"]},
        ]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": text.encode()})


uvicorn.run(Translate(app), host="127.0.0.1", port=port, log_level="warning")
