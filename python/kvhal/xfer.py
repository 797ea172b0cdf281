"""kvhal.xfer: the transfer agent (libkvhal-xfer over UCX) that hands a request's KV pages from one process to another.

A decode process (receiver) and a prefill process (sender) each make an :class:`Agent` with one registered
:class:`kvhal.PagedCache`. The sender connects to the receiver's :attr:`Agent.address` (bytes, handed over out of
band) with the receiver's token; the receiver sees a ``peer_connected`` :class:`XferEvent` from
:meth:`Agent.progress`, allocates pages and posts them with :meth:`Peer.post_receive`; the sender gets a ``grant``
event (``pages``: the receiver's page ids) and sends its own pages into them with :meth:`Peer.send_pages`, layer by
layer if it likes. Both sides' :class:`Transfer` complete (``recv_done``, ``send_done`` events, or
:meth:`Transfer.wait`). On one host, :meth:`Peer.offer_pages` hands pages over without a grant.

Available only when kvhal was built with the transfer library (meson ``-Dtransfer=ucx``, or ``auto`` with UCX found:
Debian's libucx-dev and nettle-dev; ``pip install .`` builds it into the wheel when they are found); otherwise
importing this module raises ImportError saying so.
"""
from . import _kvhal

if not getattr(_kvhal, "_have_xfer", 0):
    raise ImportError("kvhal.xfer: this kvhal was built without the transfer library libkvhal-xfer "
                      "(UCX and Nettle were not found when it was built: apt-get install libucx-dev nettle-dev, "
                      "then build again, with meson -Dtransfer=ucx or pip install .)")

Agent = _kvhal._XferAgent
Peer = _kvhal._XferPeer
Transfer = _kvhal._XferTransfer
XferEvent = _kvhal._XferEvent

__all__ = ["Agent", "Peer", "Transfer", "XferEvent"]
