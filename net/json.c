/*
 * Names and JSON: the checks every text of the network code goes through
 * (net/net.h, "names and JSON"). Manifests, rollback requests, request
 * bodies and the anti-rollback state file (net/state.c) are parsed strictly:
 * one JSON value filling the whole text, no NUL byte or \u0000 escape, which
 * cJSON would cut a string at; integers are written exactly. Module and
 * artifact names are kept to an alphabet that is safe in file names, URLs
 * and metric labels. No state; thread-safe.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "net/net.h"

int hkn_json_rest_blank(const char *p, const char *end) {
    if (!p)
        return 0;
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return 0;
    return 1;
}

int hkn_json_has_nul_escape(const char *s, size_t len) {
    /* Backslashes occur only inside strings in valid JSON; each escape is
     * skipped whole, so "\\u0000" (an escaped backslash) is not a match. */
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && i + 5 < len && !memcmp(s + i + 2, "0000", 4))
            return 1;
        i++;
    }
    return 0;
}

cJSON *hkn_json_parse_strict(const char *text, size_t len) {
    if (!text || hkn_json_has_nul_escape(text, len) || memchr(text, '\0', len))
        return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root && !hkn_json_rest_blank(end, text + len)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *hkn_json_add_int(cJSON *obj, const char *name, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return cJSON_AddRawToObject(obj, name, buf);
}

/* Names reach file systems (the CLI's pull writes artifacts by name) and
 * label sets: keep them to a conservative alphabet. */
int hkn_valid_name(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n >= max || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}
