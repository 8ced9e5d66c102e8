"""TLS contexts shared by the processes that speak TLS: the front end's TCP port, the HTTP port,
the HTTP process's own connection to the front end and the front end's links to peer nodes
(`TLS_CERT_FILE`/`TLS_KEY_FILE`, `peer_tls_ca_file`)."""

from __future__ import annotations

import ssl

__all__ = ["loopback_client_context", "peer_client_context", "server_context"]


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server side, TLS 1.2 or later (the config checked that the pair loads).

    It sends no TLS 1.3 session tickets. A ticket arrives after the handshake, while the
    client may already be writing its first command; a client that reads and writes one TLS
    socket from two threads, as bunqueue-client does, then corrupts its TLS state: a reader
    thread processing the ticket raced the Auth being written, and about 1 connection in 12
    hung or failed on this machine. The cost is a full handshake on every reconnect.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.num_tickets = 0
    context.load_cert_chain(cert_file, key_file)
    return context


def loopback_client_context(cert_file: str) -> ssl.SSLContext:
    """A client that trusts exactly the server's own certificate, whatever names it carries.

    The HTTP process reaches its front end by a local address, which a certificate made for
    the public name does not list, and may be signed by a CA this machine does not trust:
    pinning the certificate itself checks what matters, that the peer holds our key.
    """
    context = ssl.create_default_context(cafile=cert_file)
    context.check_hostname = False  # before verify_flags: the pin replaces the name check
    # The file's certificates become trust anchors themselves, the leaf included.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def peer_client_context(cert_file: str, ca_file: str) -> ssl.SSLContext | None:
    """The client side of a link to a peer node (docs/cluster.md "TLS between nodes"); None
    when this node's TCP port is plain, and so are its peers'.

    Without `ca_file` the peer must hold this node's own certificate (pinned as
    `loopback_client_context` does: every node shares one certificate, the common case).
    With it, the peer's certificate must chain to that bundle and name the peer's
    `advertise` host, as any TLS client would check.
    """
    if not cert_file:
        return None
    if not ca_file:
        context = loopback_client_context(cert_file)
    else:
        context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
