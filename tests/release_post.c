/*
 * hkt_post_release: a release directory framed (net/frame.c) and POSTed with
 * libcurl, as `hotkern push` does with the files it signs.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "net/net.h"
#include "tests/harness.h"
#include "tests/release_post.h"

long hkt_post_release(unsigned port, const char *dir, char **body) {
    char path[PATH_MAX], url[128], *man = NULL, *sig = NULL, *bytes[HKN_MAX_ARTIFACTS] = {0};
    size_t mlen = 0, slen = 0;
    hkn_blob blobs[HKN_MAX_ARTIFACTS];
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    long status = -1;
    unsigned char *frame = NULL;
    size_t flen = 0;
    memset(&m, 0, sizeof m);
    if (body)
        *body = NULL;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (hku_read_file(path, 1 << 20, &man, &mlen, &rep))
        goto out;
    snprintf(path, sizeof path, "%s/manifest.json.sig", dir);
    if (hku_read_file(path, 4096, &sig, &slen, &rep) || hkn_manifest_parse(man, mlen, &m, &rep))
        goto out;
    for (size_t i = 0; i < m.nartifacts; i++) {
        size_t len = 0;
        snprintf(path, sizeof path, "%s/artifacts/%s", dir, m.artifacts[i].sha256);
        if (hku_read_file(path, 256u << 20, &bytes[i], &len, &rep))
            goto out;
        blobs[i] = (hkn_blob){.name = m.artifacts[i].name, .bytes = bytes[i], .size = len};
    }
    if (hkn_frame_write(man, mlen, sig, slen, blobs, m.nartifacts, &frame, &flen))
        goto out;
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: " HKN_FRAME_TYPE);
    hkt_body r = {calloc(1, 1), 0};
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/release", port);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)frame);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)flen);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hkt_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    status = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (body)
        *body = r.data;
    else
        free(r.data);
out:
    if (status < 0)
        fprintf(stderr, "hkt_post_release %s: %s\n", dir, rep.message);
    free(frame);
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(bytes[i]);
    free(man);
    free(sig);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
    return status;
}
