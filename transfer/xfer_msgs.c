/* xfer_msgs.c — small frames: queued for a peer (or a refusal's endpoint) and handed to UCX from pump, never from a
 * UCX callback; endpoints closed after their last frame; acknowledgements. It calls nothing above xfer_util.c. */
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

static void close_ep(kvhal_xfer_agent *a, ucp_ep_h ep, bool force);

void queue_msg(kvhal_xfer_agent *a, kvhal_xfer_peer *p, ucp_ep_h ep, const void *hdr, size_t len,
               const void *data, size_t data_len, bool close_after)
{
    pending_msg *m = calloc(1, sizeof *m);
    void *b = malloc(len ? len : 1);
    void *d = data_len ? malloc(data_len) : NULL;
    if (!m || !b || (data_len && !d)) {
        free(m);
        free(b);
        free(d);
        if (close_after) close_ep(a, ep, true);
        return;
    }
    if (len) memcpy(b, hdr, len);
    if (data_len) memcpy(d, data, data_len);
    m->peer = p;
    m->ep = ep;
    m->buf = b;
    m->len = len;
    m->data = d;
    m->data_len = data_len;
    m->data_owned = d;
    m->close_after = close_after;
    if (a->msgs_tail) a->msgs_tail->next = m;
    else a->msgs = m;
    a->msgs_tail = m;
}

static void close_ep(kvhal_xfer_agent *a, ucp_ep_h ep, bool force)
{
    if (!ep) return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *r = ucp_ep_close_nbx(ep, &prm);
    if (force && UCS_PTR_IS_ERR(r)) { /* UCX forces only endpoints with peer-failure handling (see ep_create): the
                                       * refusal left this one open, so it is closed by flushing */
        prm.flags = 0;
        r = ucp_ep_close_nbx(ep, &prm);
    }
    if (!r || !UCS_PTR_IS_PTR(r)) return;
    closing_ep *c = malloc(sizeof *c);
    if (!c) { /* cannot track it: finish it here */
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(a->worker);
        ucp_request_free(r);
        return;
    }
    c->req = r;
    c->next = a->closing;
    a->closing = c;
}

static void msg_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    ((pending_msg *)user_data)->done = true;
    ucp_request_free(request);
}

/* Hands the queued frames to UCX without waiting for them (a peer that does not progress must not stall us): a
 * frame's buffers stay on a->sent until its send completes. An endpoint closed after its frame: at once when
 * forced (the frame may be dropped; its request completes with an error), else once the frame went out. */
void flush_msgs(kvhal_xfer_agent *a)
{
    while (a->msgs) {
        pending_msg *m = a->msgs;
        a->msgs = m->next;
        if (!a->msgs) a->msgs_tail = NULL;
        ucp_ep_h ep = m->ep ? m->ep : (m->peer && m->peer->state != P_FAILED ? m->peer->ep : NULL);
        m->ep = ep;
        m->done = true;
        if (ep && m->len) {
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                                       UCP_OP_ATTR_FIELD_FLAGS,
                                       .cb.send = msg_sent_cb, .user_data = m, .flags = UCP_AM_SEND_FLAG_EAGER};
            void *r = ucp_am_send_nbx(ep, XW_AM_ID, m->buf, m->len, m->data, m->data_len, &prm);
            if (r && UCS_PTR_IS_PTR(r)) m->done = false;
        }
        if (ep && m->close_after && (m->force || m->done)) {
            close_ep(a, ep, m->force);
            m->close_after = false;
        }
        m->next = a->sent;
        a->sent = m;
    }
    for (pending_msg **pp = &a->sent; *pp;) {
        pending_msg *m = *pp;
        if (!m->done) {
            pp = &m->next;
            continue;
        }
        if (m->ep && m->close_after) close_ep(a, m->ep, m->force);
        *pp = m->next;
        free(m->buf);
        free(m->data_owned);
        free(m);
    }
}

void send_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t xfer_id, uint32_t frame, kvhal_status st,
              uint64_t bytes, const char *reason)
{
    xw_ack ack;
    memset(&ack, 0, sizeof ack);
    ack.c = (xw_common){XW_MAGIC, XW_VERSION, XW_ACK, p->their_session};
    ack.xfer_id = xfer_id;
    ack.frame = frame;
    ack.status = (int32_t)st;
    ack.bytes = bytes;
    copy_name(ack.reason, sizeof ack.reason, reason);
    queue_msg(a, p, NULL, &ack, sizeof ack, NULL, 0, false);
}
