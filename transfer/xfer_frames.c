/* xfer_frames.c — what sending and receiving frames share: the IOV of a frame's chunks, the buffer UCX sends a frame
 * from or receives it into, and posting a send frame (its completion settles its transfer). */
#include <stdlib.h>

#include "xfer_rooms.h"

/* IOV over pages x layers x {K, V} in wire order, adjacent chunks merged. */
ucp_dt_iov_t *build_iov(const kvhal_xfer_agent *a, const int32_t *pages, int32_t n, int32_t l0, int32_t nl,
                        size_t *count)
{
    const size_t max = (size_t)n * (size_t)nl * 2;
    ucp_dt_iov_t *iov = malloc(max * sizeof *iov);
    if (!iov) return NULL;
    size_t c = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = l0; l < l0 + nl; l++)
            for (int s = 0; s < 2; s++) {
                uint8_t *p = a->host_base + chunk_off(a, l, s, pages[i]);
                if (c && (uint8_t *)iov[c - 1].buffer + iov[c - 1].length == p)
                    iov[c - 1].length += a->g.chunk_bytes;
                else
                    iov[c++] = (ucp_dt_iov_t){p, a->g.chunk_bytes};
            }
    *count = c;
    return iov;
}

/* What UCX sends a frame from or receives it into, as prm's datatype and count: a contiguous buffer (gathered,
 * staged) as bytes, else the host chunks: their one run as bytes, or the IOV. */
void *frame_buffer(ucp_dt_iov_t *iov, size_t iov_count, void *contig, size_t bytes, ucp_request_param_t *prm,
                   size_t *count)
{
    prm->datatype = ucp_dt_make_contig(1);
    *count = bytes;
    if (contig) return contig;
    if (iov_count == 1) return iov[0].buffer;
    prm->datatype = ucp_dt_make_iov();
    *count = iov_count;
    return iov;
}

void send_cb(void *request, ucs_status_t status, void *user_data)
{
    send_frame *f = user_data;
    kvhal_xfer *x = f->x;
    f->in_flight = false;
    x->sends_inflight--;
    frame_unbounce(x->agent, f);
    ucp_request_free(request);
    if (status != UCS_OK && !x->failing) /* settles: may free x */
        xfer_finish(x, KVHAL_PEER_FAILED, "sending frame to peer %s failed: %s", x->peer ? x->peer->name : "?",
                    ucs_status_string(status));
    else
        xfer_settle(x);
}

/* Posts frame fi of x to p (its header, then count units of buf as prm's datatype says); a send still in flight is
 * counted until send_cb. false when UCX refused it: x has failed then, and the caller posts no further frame. */
bool post_frame(kvhal_xfer_peer *p, kvhal_xfer *x, int32_t fi, const void *buf, size_t count,
                const ucp_request_param_t *prm)
{
    send_frame *f = &x->frames[fi];
    /* a peer attached without an endpoint (kvhal__xfer_attach_peer, the fuzzer's) drops what it is sent */
    void *r = p->ep ? ucp_am_send_nbx(p->ep, XW_AM_ID, f->hdr, f->hdr_len, buf, count, prm) : NULL;
    if (UCS_PTR_IS_ERR(r)) {
        frame_unbounce(x->agent, f);
        xfer_finish(x, KVHAL_PEER_FAILED, "UCX refused frame %d: %s", (int)fi, ucs_status_string(UCS_PTR_STATUS(r)));
        return false;
    }
    f->posted = true;
    if (r) {
        f->in_flight = true;
        x->sends_inflight++;
    } else {
        frame_unbounce(x->agent, f); /* sent already */
    }
    return true;
}
