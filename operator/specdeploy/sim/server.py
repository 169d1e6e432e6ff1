"""The simulator's HTTP side: vLLM's OpenAI-compatible API as a plain ASGI app.

Routes: `POST /v1/completions` and `/v1/chat/completions` (streaming or not), `GET /health`,
`/v1/models`, `/metrics`, `/version`; and the simulator's own `GET`/`PUT /sim/faults`, the
fault knobs in force (a test or a person changes them at run time, as llm-d's simulator takes
`POST /admin/config`). Errors have vLLM's statuses and body
(`{"error": {"message", "type", "param", "code"}}`): 404 for an unknown model, 400 for a prompt
longer than the context or a bad field, the fault knobs' statuses before the engine. Any
`--middleware` class (an ASGI middleware, as vLLM loads them) wraps the app, so the probe's
middleware runs here as it does inside vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from specdeploy.sim.engine import SimEngine, SimRequest, count_tokens, stable_hash
from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import Faults, ProfileError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
VLLM_VERSION = "0.32.0"


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


ERROR_KINDS = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


@dataclass(frozen=True)
class _Call:
    """One completion call in flight: its request in the engine, its outputs, its connection."""

    request: SimRequest
    queue: asyncio.Queue[tuple[str, str | None]]
    chat: bool
    model: str
    receive: Receive
    send: Send


@dataclass
class ServedModel:
    names: tuple[str, ...]
    root: str
    max_model_len: int


class SimApp:
    """The ASGI app of one simulated engine."""

    def __init__(self, engine: SimEngine, served: ServedModel, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.served = served
        self.clock = clock
        self.metrics: EngineMetrics = engine.metrics
        self.created = int(time.time())
        self.counter = 0
        self._loop_task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self._ensure_loop()
        started = time.monotonic()
        method, path = scope["method"], scope["path"]
        sizes = [0, 0]

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                sizes[1] += len(message.get("body", b""))
            await send(message)

        status = 500
        try:
            status = await self._route(method, path, receive, counted_send, sizes=sizes)
        finally:
            handler = path if path in ROUTES else "none"
            self.metrics.http.observe(
                method, handler, status, time.monotonic() - started, (sizes[0], sizes[1])
            )

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(
                self.engine.run_forever(self.clock)
            )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._ensure_loop()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._loop_task is not None:
                    self._loop_task.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(
        self, method: str, path: str, receive: Receive, send: Send, *, sizes: list[int]
    ) -> int:
        if method == "GET" and path == "/health":
            return await respond(send, 200, b"", "application/json")
        if method == "GET" and path == "/version":
            return await respond_json(send, 200, {"version": VLLM_VERSION})
        if method == "GET" and path == "/v1/models":
            return await respond_json(send, 200, self._models())
        if method == "GET" and path == "/metrics":
            return await respond(send, 200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        if path == FAULTS_PATH:
            return await self._faults(method, receive, send)
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                return await respond_json(send, 405, {"detail": "Method Not Allowed"})
            raw = await read_body(receive)
            sizes[0] = len(raw)
            try:
                return await self._complete(path, raw, receive, send)
            except ApiError as err:
                return await respond_json(send, err.status, err.body())
        return await respond_json(send, 404, {"detail": "Not Found"})

    async def _faults(self, method: str, receive: Receive, send: Send) -> int:
        """GET: the fault knobs in force; PUT: replace them all (the profile's are the start)."""
        if method == "PUT":
            try:
                raw = json.loads(await read_body(receive) or b"{}")
                if not isinstance(raw, dict):
                    raise ProfileError(f"{FAULTS_PATH}: the body must be a JSON object")
                self.engine.faults = Faults.parse(raw, FAULTS_PATH)
            except (ValueError, ProfileError) as err:
                return await respond_json(
                    send, 400, ApiError(400, str(err), "BadRequestError").body()
                )
        elif method != "GET":
            return await respond_json(send, 405, {"detail": "Method Not Allowed"})
        return await respond_json(send, 200, self.engine.faults.to_json())

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": self.served.root,
                    "parent": None,
                    "max_model_len": self.served.max_model_len,
                    "permission": [],
                }
                for name in self.served.names
            ],
        }

    # --- completions ----------------------------------------------------------------------

    def _parse(self, path: str, raw: bytes) -> tuple[dict[str, Any], str]:
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as err:
            raise ApiError(
                400, f"JSON decode error: {err.msg}", "Bad Request", f"body.{err.pos}"
            ) from err
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", "BadRequestError")
        model = body.get("model") or self.served.names[0]
        if model not in self.served.names:
            aliases = ", ".join(self.served.names)
            raise ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {aliases}.",
                "NotFoundError",
                "model",
            )
        if path.endswith("/chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages: a non-empty list is required", "BadRequestError")
            prompt = "".join(
                f"<|{m.get('role', 'user')}|>{m.get('content', '')}\n"
                for m in messages
                if isinstance(m, dict)
            )
        else:
            raw_prompt = body.get("prompt")
            if isinstance(raw_prompt, list) and len(raw_prompt) == 1:
                raw_prompt = raw_prompt[0]
            if not isinstance(raw_prompt, str):
                raise ApiError(400, "prompt: a string is required", "BadRequestError")
            prompt = raw_prompt
        return body, prompt

    def _injected_error(self, counter: int) -> ApiError | None:
        for status, rate in sorted(self.engine.faults.error_rates.items()):
            if stable_hash("http", status, counter) % 10_000 < rate * 10_000:
                kind = ERROR_KINDS.get(status, "InternalServerError")
                return ApiError(status, f"injected by the simulator's fault knobs ({status})", kind)
        return None

    async def _complete(self, path: str, raw: bytes, receive: Receive, send: Send) -> int:
        body, prompt = self._parse(path, raw)
        chat = path.endswith("/chat/completions")
        prompt_tokens = count_tokens(prompt)
        max_tokens = (body.get("max_completion_tokens") if chat else None) or body.get("max_tokens")
        check_lengths(prompt, prompt_tokens, max_tokens, self.served.max_model_len)
        room = self.served.max_model_len - prompt_tokens
        # vLLM shortens a completion that would not fit beside its prompt (finish "length").
        max_tokens = room if max_tokens is None else min(int(max_tokens), room)
        self.counter += 1
        injected = self._injected_error(self.counter)
        if injected is not None:
            raise injected
        crash = self.engine.faults.crash_after_requests
        if crash is not None and self.counter > crash:
            print("specdeploy-sim: crash_after_requests reached, exiting", file=sys.stderr)
            os._exit(1)
        temperature = body.get("temperature", 1.0)
        greedy = isinstance(temperature, (int, float)) and temperature == 0
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        now = self.clock()
        queue: asyncio.Queue[tuple[str, str | None]] = asyncio.Queue()
        request = SimRequest(
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            arrival=now,
            seed=self.engine.request_seed(prompt, greedy, self.counter),
            stop=stop,
            not_before=now + self.engine.faults.first_token_extra_ms / 1000.0,
            on_output=lambda text, reason: queue.put_nowait((text, reason)),
        )
        self.engine.add(request)
        call = _Call(request, queue, chat, body.get("model") or self.served.names[0], receive, send)
        if body.get("stream"):
            options = body.get("stream_options") or {}
            usage = isinstance(options, dict) and options.get("include_usage") is True
            return await self._stream(call, usage)
        return await self._whole(call)

    async def _next(
        self, request: SimRequest, queue: asyncio.Queue[tuple[str, str | None]], receive: Receive
    ) -> tuple[str, str | None] | None:
        """The next output, or None once the client went away (the request is then aborted)."""
        got = asyncio.ensure_future(queue.get())
        gone = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
        if got in done:
            gone.cancel()
            return got.result()
        got.cancel()
        self.engine.abort(request, self.clock())
        return None

    def _usage(self, request: SimRequest) -> dict[str, int]:
        return {
            "prompt_tokens": request.prompt_tokens,
            "total_tokens": request.prompt_tokens + len(request.output),
            "completion_tokens": len(request.output),
        }

    async def _whole(self, call: _Call) -> int:
        request, queue, chat, model = call.request, call.queue, call.chat, call.model
        receive, send = call.receive, call.send
        reason: str | None = None
        while reason is None:
            item = await self._next(request, queue, receive)
            if item is None:
                return 499
            reason = item[1]
        if reason == "error":
            raise ApiError(500, "the engine failed the request", "InternalServerError")
        text = "".join(request.output)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        choice["stop_reason"] = None
        return await respond_json(
            send,
            200,
            {
                "id": request.request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": self._usage(request),
            },
        )

    async def _stream(self, call: _Call, usage: bool) -> int:
        request, queue, chat, model = call.request, call.queue, call.chat, call.model
        receive, send = call.receive, call.send
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str, reason: str | None, first: bool) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
            if chat:
                choice["delta"] = (
                    {"role": "assistant", "content": text} if first else {"content": text}
                )
            else:
                choice["text"] = text
                choice["stop_reason"] = None
            return {
                "id": request.request_id,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [choice],
            }

        async def event(payload: dict[str, Any] | str) -> bool:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            try:
                await send(
                    {
                        "type": "http.response.body",
                        "body": f"data: {data}\n\n".encode(),
                        "more_body": True,
                    }
                )
            except OSError:
                self.engine.abort(request, self.clock())
                return False
            return True

        first = True
        if chat and not await event(chunk("", None, True)):
            return 200
        first = not chat
        reason: str | None = None
        while reason is None:
            item = await self._next(request, queue, receive)
            if item is None:
                return 200
            text, reason = item
            if reason == "error":
                await event(
                    {
                        "error": ApiError(
                            500, "the engine failed the request", "InternalServerError"
                        ).body()["error"]
                    }
                )
                break
            if not await event(chunk(text, reason, first)):
                return 200
            first = False
        if usage:
            await event(
                {
                    "id": request.request_id,
                    "object": kind,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(request),
                }
            )
        await event("[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200


#: vLLM refuses a prompt of more characters than this many a token of the context, before it
#: tokenizes it.
CHARACTERS_PER_TOKEN_BOUND = 9


def check_lengths(prompt: str, prompt_tokens: int, max_tokens: Any, limit: int) -> None:
    """vLLM's refusals of a prompt or max_tokens that cannot fit the context (400s)."""
    bound = CHARACTERS_PER_TOKEN_BOUND * limit
    if len(prompt) > bound:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {len(prompt)} characters (more than {bound} characters, which is the "
            f"upper bound for {limit} input tokens). Please reduce the length of the input "
            f"prompt. (parameter=input_text, value={len(prompt)})",
            "BadRequestError",
            "input_text",
        )
    if prompt_tokens >= limit:
        seen = min(prompt_tokens, limit + 1)
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains at least {seen} input tokens, which exceeds this limit even without any "
            f"output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={seen})",
            "BadRequestError",
            "input_tokens",
        )
    if max_tokens is None:
        return
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(
            400,
            f"max_tokens must be at least 1, got {max_tokens}. "
            f"(parameter=max_tokens, value={max_tokens})",
            "BadRequestError",
            "max_tokens",
        )
    if max_tokens > limit:
        raise ApiError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please "
            f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "BadRequestError",
            "max_tokens",
        )


#: The simulator's own endpoint for its fault knobs (no vLLM route; left out of the HTTP
#: families, so that the same client traffic counts the same on both).
FAULTS_PATH = "/sim/faults"
ROUTES = frozenset(
    {
        "/health",
        "/version",
        "/v1/models",
        "/metrics",
        "/v1/completions",
        "/v1/chat/completions",
        FAULTS_PATH,
    }
)


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, body: bytes, content_type: str) -> int:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
    return status


async def respond_json(send: Send, status: int, payload: Any) -> int:
    return await respond(send, status, json.dumps(payload).encode(), "application/json")
