"""Small pieces of the HTTP doubles the tests run (http.server handlers)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def reply_json(handler: BaseHTTPRequestHandler, status: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def chat_completion(content: str, model: str) -> dict[str, Any]:
    """An OpenAI-compatible `/v1/chat/completions` answer holding `content`."""
    message = {"role": "assistant", "content": content}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
