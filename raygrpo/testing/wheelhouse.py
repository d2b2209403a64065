"""A caching simple index (PEP 503) that serves pip inside image builds the packages the host downloads.

On the development machines and CI, containers (image builds included) reach Debian's mirror but not the pip
index, so task Dockerfiles that `RUN pip install ...` fail there. The host can reach the index: this server, bound
to the docker bridge address, answers pip's `/simple/<project>/` requests with the upstream index's page, its file
links rewritten to point back here, and answers those file requests by downloading through the host once and
serving the cached copy after that. `scripts/docker-dev.sh` starts it and bakes its URL into the stand-in base
images' `/etc/pip.conf`, so builds use it without any change to the task's Dockerfile.

It fetches only files the upstream index's pages link to (hosts seen in those pages): it is not an open proxy, and a
build that downloads from anywhere else still fails. Index pages are fetched fresh each time and the last good copy
is served when the upstream does not answer.

    python -m raygrpo.testing.wheelhouse --host 172.17.0.1 --port 3141 --cache /var/lib/raygrpo-docker/wheelhouse
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
from aiohttp import web

logger = logging.getLogger(__name__)

DEFAULT_UPSTREAM = "https://pypi.org/simple"
_HREF = re.compile(r'href="([^"]+)"')
_HTML_ACCEPT = "application/vnd.pypi.simple.v1+html, text/html;q=0.9"


def normalize(project: str) -> str:
    """A project name as PEP 503 normalizes it (`Pytest_JSON.ctrf` -> `pytest-json-ctrf`)."""
    return re.sub(r"[-_.]+", "-", project).lower()


class Wheelhouse:
    """The index's state: the upstream, the cache folder, the hosts its pages link to.

    Args:
        cache_dir: Where fetched index pages (`simple/<project>.html`, as the upstream sent them) and files
            (`files/<host>/<path>`) are kept.
        upstream: The simple index to mirror (its `/<project>/` pages).
        timeout_s: Deadline of one upstream request.
    """

    def __init__(self, cache_dir: str | os.PathLike, upstream: str = DEFAULT_UPSTREAM, timeout_s: float = 60.0) -> None:
        self.cache = Path(cache_dir)
        self.upstream = upstream.rstrip("/") + "/"
        self.timeout_s = timeout_s
        #: Host -> scheme of the hosts the served pages link files on: the only hosts files are fetched from.
        self.file_hosts: dict[str, str] = {}
        self._client: httpx.AsyncClient | None = None
        self._locks: dict[str, asyncio.Lock] = {}

    # ── the app ───────────────────────────────────────────────────────────────────────────────────────────────────

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/simple/", self._root)
        app.router.add_get("/simple/{project}/", self._page)
        app.router.add_get("/simple/{project}", self._page)
        app.router.add_get("/files/{host}/{path:.+}", self._file)
        app.on_cleanup.append(self._close)
        return app

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=True)
        return self._client

    async def _close(self, _app: web.Application) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _root(self, _request: web.Request) -> web.Response:
        return web.Response(text="<!DOCTYPE html><html><body></body></html>\n", content_type="text/html")

    # ── index pages ───────────────────────────────────────────────────────────────────────────────────────────────

    async def _page(self, request: web.Request) -> web.StreamResponse:
        project = normalize(request.match_info["project"])
        url = f"{self.upstream}{project}/"
        cached = self.cache / "simple" / f"{project}.html"
        try:
            response = await self.client.get(url, headers={"Accept": _HTML_ACCEPT})
        except httpx.HTTPError as exc:
            if cached.exists():
                logger.warning("%s: upstream did not answer (%s); serving the cached page", project, exc)
                return self._html(cached.read_text(), url)
            raise web.HTTPBadGateway(text=f"the upstream index did not answer for {project}: {exc}\n") from None
        if response.status_code == 404:
            raise web.HTTPNotFound(text=f"{project} is not on {self.upstream}\n")
        if response.status_code != 200:
            if cached.exists():
                return self._html(cached.read_text(), url)
            raise web.HTTPBadGateway(text=f"the upstream index answered {response.status_code} for {project}\n")
        page_url = str(response.url)
        _write_atomic(cached, response.content)
        logger.info("page %s from %s", project, page_url)
        return self._html(response.text, page_url)

    def _html(self, text: str, page_url: str) -> web.Response:
        return web.Response(text=self.rewrite(text, page_url), content_type="text/html")

    def rewrite(self, html: str, page_url: str) -> str:
        """The page with every link made absolute against `page_url` and pointed at this server's `/files/`
        (fragments such as `#sha256=...` kept); records the hosts linked to."""

        def local(match: re.Match[str]) -> str:
            target, _, fragment = urljoin(page_url, match.group(1).replace("&amp;", "&")).partition("#")
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                return match.group(0)
            self.file_hosts[parts.netloc] = parts.scheme
            return f'href="/files/{parts.netloc}{parts.path}{"#" + fragment if fragment else ""}"'

        return _HREF.sub(local, html)

    # ── files ─────────────────────────────────────────────────────────────────────────────────────────────────────

    async def _file(self, request: web.Request) -> web.StreamResponse:
        host, path = request.match_info["host"], request.match_info["path"]
        if ".." in path.split("/"):
            raise web.HTTPForbidden(text="no '..' in file paths\n")
        target = self.cache / "files" / host / path
        if not target.exists():
            scheme = self.file_hosts.get(host)
            if scheme is None:
                raise web.HTTPForbidden(text=f"{host} is not linked from the index: not fetched\n")
            lock = self._locks.setdefault(str(target), asyncio.Lock())
            async with lock:
                if not target.exists():
                    await self._download(f"{scheme}://{host}/{path}", target)
        return web.FileResponse(target)

    async def _download(self, url: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                async with self.client.stream("GET", url) as response:
                    if response.status_code == 404:
                        raise web.HTTPNotFound(text=f"{url} is not there\n")
                    if response.status_code != 200:
                        raise web.HTTPBadGateway(text=f"{url} answered {response.status_code}\n")
                    async for chunk in response.aiter_bytes():
                        out.write(chunk)
            os.replace(tmp, target)
            logger.info("file %s (%d bytes)", url, target.stat().st_size)
        except httpx.HTTPError as exc:
            raise web.HTTPBadGateway(text=f"downloading {url} failed: {exc}\n") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (the docker bridge's, for builds)")
    parser.add_argument("--port", type=int, default=3141)
    parser.add_argument("--cache", required=True, help="folder of cached pages and files")
    parser.add_argument("--upstream", default=DEFAULT_UPSTREAM, help="the simple index to mirror")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("aiohttp.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    house = Wheelhouse(args.cache, args.upstream)
    logger.info("wheelhouse for %s on http://%s:%d/simple, cache %s", house.upstream, args.host, args.port, args.cache)
    web.run_app(house.app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
