"""A fake LLM server for tests: OpenAI Chat Completions and Anthropic Messages on 127.0.0.1.

It speaks the real wire formats (POST /v1/chat/completions, POST /v1/messages, GET /v1/models), so the
official SDK clients talk to it unchanged. `respond(prompt) -> list[Step]` scripts the answers: each
request with the same last user message takes the next step of its list (the last one repeats). Usage
is counted as characters / 4, deterministically, and every request is logged.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Step:
    """One scripted response: an answer, or a fault."""

    text: str = ""
    # "" | "429" | "500" | "400" (a request the server rejects: not retried) | "timeout" | "malformed" |
    # "refusal" | "hang" (never answers) |
    # "no-usage" (an answer without usage) | "length" (the provider says it stopped at max_tokens) |
    # "drip" (one byte a second from the status line on, never finishing) | "drip-body" (the headers at once,
    # then one byte of the body a second, never finishing: no read ever waits long enough to time out)
    fault: str = ""
    tokens_out: int | None = None  # the usage to report (None: characters / 4), e.g. more than max_tokens
    retry_after: str | None = None  # the 429's retry-after header
    sleep_s: float = 0.0  # before answering (a slow model: lets requests overlap)


@dataclass
class Seen:
    """A request the server received."""

    path: str
    at: float
    headers: dict[str, str]  # names in lower case
    body: dict
    prompt: str  # the last user message
    tokens_in: int = 0
    tokens_out: int = 0
    status: int = 200


@dataclass
class FakeLLM:
    """The server; use as a context manager. `url` is http://127.0.0.1:PORT."""

    respond: Callable[[str], list[Step]]
    key: str = ""  # when set, requests must carry it (Authorization: Bearer or x-api-key), else 401
    list_fault: str = ""  # "drip": the model listing (GET /v1/models) comes a byte a second, never finishing
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()  # ends the hanging requests when the server stops
        self._steps: dict[str, int] = {}
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def __enter__(self) -> FakeLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                if fake.list_fault == "drip":
                    return fake._drip(self, True)
                if not fake._authorized(self.headers):
                    return self._json(401, {"error": {"type": "authentication_error", "message": "invalid key"}})
                self._json(200, {"object": "list", "data": [{"id": "fake-coder", "object": "model", "created": 0,
                                                             "owned_by": "test", "type": "model",
                                                             "display_name": "fake", "created_at":
                                                             "2025-01-01T00:00:00Z"}],
                                 "has_more": False, "first_id": "fake-coder", "last_id": "fake-coder"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                fake._answer(self, body)

            def _json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self._raw(status, data, headers)

            def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def completions(self) -> list[Seen]:
        """The generation requests (not model listings)."""
        return [s for s in self.seen if s.path != "/v1/models"]

    def _authorized(self, headers: object) -> bool:
        if not self.key:
            return True
        got = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")  # type: ignore[attr-defined]
        return got == self.key

    def _drip(self, h: BaseHTTPRequestHandler, head_too: bool) -> None:
        """Send a response of 1 MB one byte a second until the server stops (or the client goes)."""
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
        data = head + b'{"id": "x", "choices": [{"message": {"content": "' + b"x" * 999_900
        if not head_too:
            h.wfile.write(head)
            data = data[len(head):]
        for i in range(len(data)):
            try:
                h.wfile.write(data[i:i + 1])
            except OSError:
                return  # the client cut the connection
            if self._stop.wait(1.0):
                return

    def _answer(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        anthropic = h.path.rstrip("/").endswith("/messages")
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        content = users[-1]["content"] if users else ""
        prompt = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        seen = Seen(h.path, time.monotonic(), {k.lower(): v for k, v in h.headers.items()}, body, prompt)
        with self._lock:
            self.seen.append(seen)
            steps = self.respond(prompt)
            i = self._steps.get(prompt, 0)
            self._steps[prompt] = i + 1
            step = steps[min(i, len(steps) - 1)]
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if not self._authorized(h.headers):
                seen.status = 401
                return h._json(401, {"type": "error", "error": {"type": "authentication_error",
                                                                "message": "invalid x-api-key"}})
            time.sleep(step.sleep_s)
            if step.fault == "429":
                seen.status = 429
                headers = {"retry-after": step.retry_after} if step.retry_after is not None else {}
                return h._json(429, {"type": "error", "error": {"type": "rate_limit_error",
                                                                "message": "slow down"}}, headers)
            if step.fault == "400":
                seen.status = 400
                return h._json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                "message": "this request is not accepted"}})
            if step.fault == "500":
                seen.status = 500
                return h._json(500, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
            if step.fault == "timeout":
                time.sleep(2.0)  # longer than the client's timeout in the tests
            if step.fault == "hang":
                self._stop.wait()  # until the server stops: a model that never answers
                return None
            if step.fault in ("drip", "drip-body"):
                return self._drip(h, step.fault == "drip")
            if step.fault == "malformed":
                return h._raw(200, b'{"id": "x", "choices": [{"message": {"content": "trunc')
            seen.tokens_in = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4 + \
                len(str(body.get("system", ""))) // 4
            seen.tokens_out = len(step.text) // 4 if step.tokens_out is None else step.tokens_out
            if anthropic:
                stop = {"refusal": "refusal", "length": "max_tokens"}.get(step.fault, "end_turn")
                blocks = [{"type": "text", "text": step.text}] if step.text or step.fault != "refusal" else []
                payload = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
                           "content": blocks, "stop_reason": stop, "stop_sequence": None,
                           "usage": {"input_tokens": seen.tokens_in, "output_tokens": seen.tokens_out}}
            else:
                message = {"role": "assistant", "content": None if step.fault == "refusal" else step.text,
                           "refusal": step.text if step.fault == "refusal" else None}
                finish = "length" if step.fault == "length" else "stop"
                payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                           "model": body.get("model"), "choices": [{"index": 0, "message": message,
                                                                    "finish_reason": finish}],
                           "usage": {"prompt_tokens": seen.tokens_in, "completion_tokens": seen.tokens_out,
                                     "total_tokens": seen.tokens_in + seen.tokens_out}}
            if step.fault == "no-usage":
                payload.pop("usage")
                seen.tokens_in = seen.tokens_out = 0
            h._json(200, payload)
        finally:
            with self._lock:
                self.in_flight -= 1
