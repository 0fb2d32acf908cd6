"""Node-to-node authentication, rule by rule: requests bound to their receiver, answers
bound to the request they answer, and TLS that completes only between holders of the
secret (engine/cluster/auth.py, engine/cluster/tls.py)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from engine.cluster.auth import (
    HELLO,
    NotInCluster,
    Verifier,
    check_answer,
    check_body,
    sign,
)
from engine.cluster.tls import client_context, cluster_certificate, server_context


def test_a_request_is_accepted_once_and_only_by_the_node_it_was_signed_for():
    b, c = Verifier("s", "node-b"), Verifier("s", "node-c")
    h = sign("s", "node-a", "POST", "/shoal/peer/stop", b"{}", to="node-b")
    assert b.verify("POST", "/shoal/peer/stop", h, b"{}").node == "node-a"
    with pytest.raises(NotInCluster, match="replay"):
        b.verify("POST", "/shoal/peer/stop", h, b"{}")
    # captured on the way to b, spent at c: refused
    with pytest.raises(NotInCluster, match="another node") as e:
        c.verify("POST", "/shoal/peer/stop", h, b"{}")
    assert e.value.code == "wrong_node"
    with pytest.raises(NotInCluster, match="another cluster secret"):  # another path
        b.verify("POST", "/shoal/peer/start", sign("s", "a", "POST", "/x", to="node-b"), b"")
    with pytest.raises(NotInCluster, match="another cluster secret"):  # the body changed
        b.verify("POST", "/x", sign("s", "a", "POST", "/x", b"{}", to="node-b"), b"[]")
    with pytest.raises(NotInCluster, match="another cluster secret"):  # the sender's name
        h = sign("s", "node-a", "GET", "/shoal/node", to="node-b")
        b.verify("GET", "/shoal/node", {**h, "X-Shoal-Node": "node-z"}, b"")
    with pytest.raises(NotInCluster, match="not signed"):
        b.verify("GET", "/shoal/node", {}, b"")
    with pytest.raises(NotInCluster, match="clock"):
        b.verify("GET", "/shoal/node", sign("s", "a", "GET", "/shoal/node", now=1e6,
                                            to="node-b"), b"")


def test_only_the_hello_goes_out_before_the_receivers_id_is_known():
    b = Verifier("s", "node-b")
    assert b.verify("GET", HELLO, sign("s", "a", "GET", HELLO), b"").node == "a"
    with pytest.raises(NotInCluster, match="another node"):
        b.verify("GET", "/shoal/node", sign("s", "a", "GET", "/shoal/node"), b"")
    with pytest.raises(NotInCluster, match="another node"):
        b.verify("POST", HELLO, sign("s", "a", "POST", HELLO), b"")


def test_an_answer_proves_the_secret_and_answers_this_request_only():
    b = Verifier("s", "node-b")
    sent = sign("s", "node-a", "GET", "/shoal/node", to="node-b")
    caller = b.verify("GET", "/shoal/node", sent, b"")
    body = b'{"id": "node-b"}'
    head = b.answer_headers(caller, 200, body)
    assert check_answer("s", "node-a", sent, 200, head, "node-b") == "node-b"
    check_body(head, body)
    with pytest.raises(NotInCluster, match="body"):
        check_body(head, b'{"id": "evil"}')
    with pytest.raises(NotInCluster, match="not signed"):  # another status
        check_answer("s", "node-a", sent, 500, head)
    other = sign("s", "node-a", "GET", "/shoal/node", to="node-b")
    with pytest.raises(NotInCluster, match="not signed"):  # an old answer, a new request
        check_answer("s", "node-a", other, 200, head)
    with pytest.raises(NotInCluster, match="not signed"):  # meant for another requester
        check_answer("s", "node-c", sent, 200, head)
    with pytest.raises(NotInCluster, match="unsigned"):  # a stranger's plain answer
        check_answer("s", "node-a", sent, 200, {})
    with pytest.raises(NotInCluster, match="not signed"):  # signed with another secret
        check_answer("s", "node-a", sent, 200,
                     Verifier("other", "node-b").answer_headers(caller, 200, body))
    with pytest.raises(NotInCluster, match="not node-x"):
        check_answer("s", "node-a", sent, 200, head, "node-x")
    streamed = b.answer_headers(caller, 200, None)
    check_answer("s", "node-a", sent, 200, streamed)
    with pytest.raises(NotInCluster, match="body"):  # a whole answer must declare its hash
        check_body(streamed, body)


def test_the_clusters_certificate_is_the_secrets_and_nothing_of_the_seed_shows():
    pem, seed = cluster_certificate("s")
    assert cluster_certificate.__wrapped__("s") == (pem, seed)  # every member, the same
    assert cluster_certificate.__wrapped__("t")[0] != pem
    assert seed.hex() not in pem.decode() and b"PRIVATE" not in pem


def test_tls_completes_only_between_holders_of_the_same_secret():
    async def talk(server_secret: str, client: ssl.SSLContext) -> bytes:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.read(5))
            await w.drain()
            w.close()
        srv = await asyncio.start_server(echo, "127.0.0.1", 0,
                                         ssl=server_context(server_secret))
        port = srv.sockets[0].getsockname()[1]
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client)
            w.write(b"hello")
            await w.drain()
            got = await asyncio.wait_for(r.read(), 5)
            w.close()
            return got
        finally:
            srv.close()

    assert asyncio.run(talk("s", client_context("s"))) == b"hello"
    with pytest.raises(ssl.SSLCertVerificationError):  # its certificate isn't ours
        asyncio.run(talk("s", client_context("t")))
    anyone = ssl.create_default_context()
    anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
    try:  # a client with no certificate of the cluster's: the server says nothing
        got = asyncio.run(talk("s", anyone))
    except (ssl.SSLError, ConnectionError):
        got = b""
    assert got == b""
