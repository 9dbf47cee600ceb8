/*
 * libFuzzer target for the release path of net/ (release.c, state.c): the
 * manifest parser and verifier, signed rollback requests and the strict JSON
 * reader, fed any bytes.
 *
 * Manifests and rollback requests arrive from the network before anything
 * about them is trusted, so any byte string must give a result or an error,
 * never a crash, an over-read, undefined behaviour or a leak. The input is
 * read three ways: as a manifest verified without keys (so the parser,
 * expiry and replay checks run on it), as a manifest with a signature made
 * from its last 64 bytes against a fixed key (the signature path), and as a
 * rollback request. A manifest with a rollout that verifies is also decided
 * for a few hosts (net/rollout.c), written back and read again: the same
 * steps must come back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static hkn_state *state;
static hkn_trust keyed, open_trust;

static void init(void) {
    hkn_seckey k;
    if (hkn_keygen(&k) || hkn_state_open(NULL, &state, NULL) ||
        hkn_state_accept(state, "add", 5, NULL))
        abort();
    memset(&keyed, 0, sizeof keyed);
    keyed.keys[0] = k.pub;
    keyed.nkeys = 1;
    memset(&open_trust, 0, sizeof open_trust);
    open_trust.allow_unsigned = 1;
}

static void check_manifest(const hkn_manifest *m) {
    /* What verifies must be usable as documented. */
    if (!hkn_valid_name(m->module, sizeof m->module) || m->version == 0 ||
        m->nartifacts < 1 || m->nartifacts > HKN_MAX_ARTIFACTS)
        abort();
    for (size_t i = 0; i < m->nartifacts; i++)
        if (strlen(m->artifacts[i].sha256) != 64 ||
            !hkn_valid_name(m->artifacts[i].name, sizeof m->artifacts[i].name))
            abort();
    if (hkn_pick_artifact(m, "sm_90") >= m->nartifacts)
        abort();
    const hkn_rollout *r = &m->rollout;
    if (!r->present)
        return;
    if (r->step >= r->nsteps || r->nsteps > HKN_ROLLOUT_MAX_STEPS ||
        hkn_rollout_target(r, m->version) != (r->aborted ? r->previous : r->release))
        abort();
    /* Cumulative: a host in the share of an earlier step is in this one. */
    const char *labels[] = {"canary", "gpu=h100"};
    for (uint32_t b = 0; b < HKN_BUCKETS; b += 997)
        if (b < r->steps[0].percent * 100u && !hkn_rollout_covers(r, b, "h", labels, 2))
            abort();
    hkn_rollout copy;
    if (hkn_rollout_copy(&copy, r) == 0) {
        if (copy.nsteps != r->nsteps || hkn_rollout_validate(&copy, NULL) != 0)
            abort();
        hkn_rollout_free(&copy);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!state)
        init();
    /* A NUL-terminated copy, as the HTTP and file readers hand over. */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    hk_report rep = HK_REPORT_INIT;
    hkn_manifest m;
    int64_t now = (int64_t)time(NULL);
    if (hkn_verify_manifest(&open_trust, state, text, size, NULL, 0, now, &m, &rep) == 0) {
        check_manifest(&m);
        char *out;
        size_t len;
        if (hkn_manifest_write(&m, &out, &len) == 0) {
            /* What was written reads back with the same steps. */
            hkn_manifest back;
            if (hkn_manifest_parse(out, len, &back, NULL) != 0 ||
                back.rollout.present != m.rollout.present ||
                back.rollout.nsteps != m.rollout.nsteps || back.release != m.release)
                abort();
            hkn_manifest_free(&back);
            free(out);
        }
        hkn_manifest_free(&m);
    }
    hk_report_clear(&rep);
    if (size > 64) {
        char sig[128];
        sodium_bin2base64(sig, sizeof sig, data + size - 64, 64, sodium_base64_VARIANT_ORIGINAL);
        if (hkn_verify_manifest(&keyed, state, text, size - 64, sig, strlen(sig), now, &m, &rep) ==
            0)
            abort(); /* a forged signature verified */
        hk_report_clear(&rep);
        hkn_rollback_req rq;
        if (hkn_rollback_verify(&keyed, text, size - 64, sig, strlen(sig), now, &rq, &rep) == 0)
            abort();
        hk_report_clear(&rep);
    }
    unsigned char bin[64];
    (void)hkn_decode_fixed(text, size, bin, sizeof bin);
    cJSON *j = hkn_json_parse_strict(text, size);
    cJSON_Delete(j);
    free(text);
    return 0;
}
