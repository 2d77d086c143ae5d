"""Django's HTTP handling under Daphne, with one thread hop per request.

Django's own ASGI handler runs a synchronous middleware chain and view from the event loop
with a ``sync_to_async`` hop for every middleware's request and response step, the view and
the signals, on a thread pool of one thread that it starts for every request: the event
loop's share of a REST request was most of its cost. Here the whole synchronous chain
(middleware, view, response) runs in one worker thread, which keeps its database
connection between requests (``CONN_MAX_AGE``); long-polling pulls have threads of their
own, so they never hold a thread other requests need. The view's thread reaches this event
loop's dispatcher through ``request.loop_dispatcher`` (:mod:`api.loopdispatch`)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve

from api.loopdispatch import LoopDispatcher

#: Worker threads of HTTP requests, and apart from them those of views marked
#: ``long_poll`` (REST pulls), which may wait without taking a thread from other requests.
VIEW_THREADS = ThreadPoolExecutor(max_workers=settings.SMQP_API_THREADS,
                                  thread_name_prefix="http")
PULL_THREADS = ThreadPoolExecutor(max_workers=settings.SMQP_API_PULL_THREADS,
                                  thread_name_prefix="http-pull")


def threads_for(request: HttpRequest) -> ThreadPoolExecutor:
    try:
        view = resolve(request.path_info).func
    except Resolver404:
        return VIEW_THREADS
    return PULL_THREADS if getattr(view, "long_poll", False) else VIEW_THREADS


class ThreadedASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def __call__(self, scope, receive, send) -> None:
        # Without Django's ThreadSensitiveContext, which starts a thread per request for
        # the hops this handler does not make.
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP, not {scope['type']}")
        await self.handle(scope, receive, send)

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        loop = asyncio.get_running_loop()
        request.loop_dispatcher = LoopDispatcher(loop)  # type: ignore[attr-defined]
        response = await loop.run_in_executor(threads_for(request), self._respond, request)
        response._handler_class = self.__class__  # type: ignore[attr-defined]
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        return response

    def _respond(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return self.get_response(request)
        finally:
            close_old_connections()  # as request_finished does on Django's own thread
