/* xfer_auth.c — the handshake's primitives: fresh nonces (getrandom) and the proofs of the token, HMAC-SHA-256
 * (Nettle) over the handshake's transcript (xw_transcript, xfer_wire.h), compared in constant time. A bottom room
 * beside xfer_util.c: it calls no other room. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "xfer_internal.h"

bool auth_nonce(uint8_t *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        const ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}

void kvhal__xfer_proof(const char *token, const xw_transcript *t, const char *label, uint8_t out[XW_PROOF])
{
    xw_transcript c = *t;
    memset(c.label, 0, sizeof c.label);
    memcpy(c.label, label, strnlen(label, sizeof c.label - 1));
    struct hmac_sha256_ctx h;
    hmac_sha256_set_key(&h, strnlen(token, XW_TOKEN_LEN - 1), (const uint8_t *)token);
    hmac_sha256_update(&h, sizeof c, (const uint8_t *)&c);
    hmac_sha256_digest(&h, XW_PROOF, out);
    explicit_bzero(&h, sizeof h); /* the key's pads */
}

bool auth_check(const char *token, const xw_transcript *t, const char *label, const uint8_t proof[XW_PROOF])
{
    uint8_t want[XW_PROOF];
    kvhal__xfer_proof(token, t, label, want);
    const bool ok = memeql_sec(want, proof, XW_PROOF) != 0;
    explicit_bzero(want, sizeof want);
    return ok;
}
