"""A local S3-compatible server for tests and benchmarks: moto's standalone server over HTTP on 127.0.0.1.

    with local_s3("calsweep-test") as s3:
        os.environ.update(s3.env)               # AWS_ENDPOINT_URL and test credentials, as AWS users give them
        ... --results-dir s3://calsweep-test/run ...
        s3.keys("run/trials/")                  # what the bucket holds
        s3.stop(); ...; s3.start()              # an outage: the same port, the bucket's contents kept

The server runs in this process (a thread); moto keeps the buckets in process memory, so they outlive a
``stop``/``start``. ``requests`` counts what the server answered (method, path, bytes in and out), for
measuring a client's traffic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import urllib.request
from typing import Any, Iterator

from werkzeug.serving import WSGIRequestHandler, make_server

from common.ports import free_port

_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclasses.dataclass(frozen=True)
class Request:
    """One request the server answered: its method, path (with the query), status and body bytes each way."""
    method: str
    path: str
    status: int
    bytes_in: int
    bytes_out: int


class _CountingInput:
    """A request's body stream that counts the bytes read from it (a chunked upload has no Content-Length)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.count = stream, 0

    def read(self, *args: Any) -> bytes:
        data = self.stream.read(*args)
        self.count += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.stream.readline(*args)
        self.count += len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


def _counting(app: Any, log: list[Request], lock: threading.Lock) -> Any:
    """``app`` (a WSGI application) with every request appended to ``log``."""
    def counted(environ: dict, start_response: Any) -> Any:
        status = [0]
        environ["wsgi.input"] = body_in = _CountingInput(environ["wsgi.input"])

        def start(code: str, headers: list, *args: Any) -> Any:
            status[0] = int(code.split()[0])
            return start_response(code, headers, *args)

        body = list(app(environ, start))
        query = environ.get("QUERY_STRING")
        request = Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "") + (f"?{query}" if query else ""),
                          status[0], body_in.count, sum(len(chunk) for chunk in body))
        with lock:
            log.append(request)
        return body
    return counted


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any) -> None:  # no line per request on stderr
        pass


class LocalS3:
    """A running moto server: ``endpoint`` (http URL), ``bucket``, ``env`` (the variables a client needs)."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = free_port()  # kept across stop/start
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, **_CREDENTIALS}

    def start(self) -> None:
        """Serve on ``port`` (again, after ``stop``: the buckets and their objects are still there)."""
        from moto.server import DomainDispatcherApplication, create_backend_app

        app = _counting(DomainDispatcherApplication(create_backend_app), self.requests, self._lock)
        self._server = make_server("127.0.0.1", self.port, app, threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the port: clients get connection refused until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None

    def check_credentials(self, on: bool = True) -> None:
        """Refuse requests signed with keys moto's IAM does not hold (``env``'s test keys among them), as AWS refuses
        wrong credentials; ``on=False``: accept any (moto's default, restored by ``local_s3`` on entry)."""
        from moto import settings

        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0 if on else float("inf")

    @contextlib.contextmanager
    def exported(self) -> Iterator[None]:
        """``env`` in this process's environment for the block (pyarrow reads AWS_ENDPOINT_URL from it), the
        previous values restored after."""
        previous = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                            region_name=_CREDENTIALS["AWS_DEFAULT_REGION"])

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key of the bucket under ``prefix``, sorted."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@contextlib.contextmanager
def local_s3(bucket: str = "calsweep-test") -> Iterator[LocalS3]:
    """Start a local S3 server with an empty ``bucket`` (a valid S3 bucket name) and nothing else (moto's state is
    per process: an earlier server's buckets are cleared); stop it on exit."""
    s3 = LocalS3(bucket)
    s3.check_credentials(False)
    s3.start()
    try:
        urllib.request.urlopen(urllib.request.Request(f"{s3.endpoint}/moto-api/reset", method="POST")).close()
        s3.client().create_bucket(Bucket=bucket)  # after the reset: an earlier server's buckets are gone
        yield s3
    finally:
        s3.stop()
