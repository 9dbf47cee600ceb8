/*
 * Output of the hotkern tool: text for people, or one JSON document for
 * scripts (--json).
 *
 * Every subcommand reports errors through hkc_usage/hkc_fail, so the two
 * modes cannot drift apart: in text mode they print at once, in JSON mode
 * they fill the document's error fields, and hkc_finish prints the document
 * once at the end. A document is built with cJSON and printed unformatted on
 * one line, so that a script can also read a stream of them line by line.
 *
 * Text for people may carry strings of an endpoint or an origin (messages,
 * build logs, status), which a hostile or on-path server could fill with
 * terminal escapes: text goes out through hkc_put_clean, which shows every
 * control byte and malformed UTF-8 as \xNN instead of sending it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "net/net.h"
#include "util/util.h"

void hkc_put_clean(FILE *f, const char *text, int multiline) {
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    while (*s) {
        /* Printable UTF-8 only: no C0 or C1 control (CSI is U+009B), no DEL. */
        uint32_t cp = 0;
        size_t n = hku_utf8_next(s, &cp);
        int ok = (n && cp >= 0x20 && cp != 0x7f && !(cp >= 0x80 && cp <= 0x9f)) ||
                 (multiline && (*s == '\n' || *s == '\t'));
        if (ok) {
            fwrite(s, 1, n, f);
            s += n;
        } else {
            fprintf(f, "\\x%02x", *s);
            s++;
        }
    }
}

void hkc_set(hkc_out *o, const char *key, cJSON *item) {
    if (!o->doc) {
        cJSON_Delete(item);
        return;
    }
    if (!item)
        item = cJSON_CreateNull();
    if (!item)
        return;
    if (cJSON_HasObjectItem(o->doc, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o->doc, key, item);
    else
        cJSON_AddItemToObject(o->doc, key, item);
}

void hkc_set_str(hkc_out *o, const char *key, const char *s) {
    if (o->doc)
        hkc_set(o, key, s ? cJSON_CreateString(s) : NULL);
}

cJSON *hkc_int(long long v) {
    /* Raw text, so that integers near 2^53 print exactly (cJSON prints
     * numbers through a double with 15 significant digits). */
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return cJSON_CreateRaw(buf);
}

void hkc_set_int(hkc_out *o, const char *key, long long v) {
    if (o->doc)
        hkc_set(o, key, hkc_int(v));
}

void hkc_declare(hkc_out *o, ...) {
    va_list ap;
    va_start(ap, o);
    for (const char *k = va_arg(ap, const char *); k; k = va_arg(ap, const char *))
        hkc_set(o, k, NULL);
    va_end(ap);
}

void hkc_out_init(hkc_out *o, const char *cmd) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
}

void hkc_out_json(hkc_out *o) {
    if (o->json)
        return;
    o->json = 1;
    o->doc = cJSON_CreateObject();
    hkc_set(o, "ok", cJSON_CreateFalse());
    hkc_set_str(o, "command", o->cmd);
    hkc_set_int(o, "exit", 0);
    hkc_declare(o, "error", NULL);
    hkc_set_int(o, "code", 0);
    hkc_declare(o, "message", "log", NULL);
}

void hkc_out_text(hkc_out *o) {
    cJSON_Delete(o->doc);
    o->doc = NULL;
    o->json = 0;
}

/* Records the error fields (the first error only). */
static void record(hkc_out *o, int err, const char *log, const char *msg) {
    if (o->failed)
        return;
    o->failed = 1;
    hkc_set_str(o, "error", hk_err_name(err));
    hkc_set_int(o, "code", err);
    hkc_set_str(o, "message", msg);
    hkc_set_str(o, "log", log && log[0] ? log : NULL);
}

/* Reports one error: recorded (JSON) or printed (text, a usage error with
 * the pointer to --help). */
static void verror(hkc_out *o, int err, int usage, const char *log, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (o->json) {
        record(o, err, log, msg);
    } else if (usage) {
        fprintf(stderr, "hotkern %s: ", o->cmd);
        hkc_put_clean(stderr, msg, 0);
        fprintf(stderr, " (see 'hotkern %s --help')\n", o->cmd);
    } else {
        /* Messages and logs may come from an endpoint or an origin: no
         * terminal escape of theirs reaches the terminal. */
        fprintf(stderr, "hotkern %s: %s: ", o->cmd, hk_err_name(err));
        hkc_put_clean(stderr, msg, 0);
        fputc('\n', stderr);
        hkc_put_clean(stderr, log, 1);
        if (log && log[0] && log[strlen(log) - 1] != '\n')
            fputc('\n', stderr);
    }
}

int hkc_usage(hkc_out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(o, HK_ERR_INVALID, 1, NULL, fmt, ap);
    va_end(ap);
    return 2;
}

int hkc_fail(hkc_out *o, int err, const char *log, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(o, err, 0, log, fmt, ap);
    va_end(ap);
    return 1;
}

int hkc_fail_report(hkc_out *o, const hk_report *rep) {
    return hkc_fail(o, rep->error ? rep->error : HK_ERR_INVALID, rep->log, "%s", rep->message);
}

int hkc_finish(hkc_out *o, int status) {
    if (!o->json)
        return status;
    if (status && !o->failed) /* every failure path records; this is a guard */
        record(o, HK_ERR_INVALID, NULL, "failed");
    hkc_set(o, "ok", cJSON_CreateBool(status == 0));
    hkc_set_int(o, "exit", status);
    char *text = o->doc ? cJSON_PrintUnformatted(o->doc) : NULL;
    if (text) {
        printf("%s\n", text);
        free(text);
    } else {
        /* cJSON could not allocate the document or its text: still one. */
        printf("{\"ok\":false,\"command\":\"%s\",\"exit\":1,\"error\":\"HK_ERR_NOMEM\","
               "\"code\":%d,\"message\":\"out of memory\",\"log\":null}\n",
               o->cmd, HK_ERR_NOMEM);
        status = status ? status : 1;
    }
    fflush(stdout);
    cJSON_Delete(o->doc);
    o->doc = NULL;
    return status;
}
