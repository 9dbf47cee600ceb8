/*
 * Names of the kernel image formats, the library's version, and
 * hk_report_clear: public plumbing every part of the library uses, so it is
 * on the ground floor (base/), beside the error codes' names and messages
 * (base/error.c). The release code in net/ writes format names and clears
 * reports, and is also built (for fuzzing) without the rest of the engine.
 */
#include <stdlib.h>
#include <string.h>

#include "hotkern/hotkern.h"
#include "base/abi.h"

#define HK_STR_(x) #x
#define HK_STR(x)  HK_STR_(x)

const char *hk_version(void) {
    return HK_STR(HK_VERSION_MAJOR) "." HK_STR(HK_VERSION_MINOR) "." HK_STR(HK_VERSION_PATCH);
}

const char *hk_format_name(hk_format fmt) {
    switch (fmt) {
    case HK_FORMAT_AUTO:
        return "auto";
    case HK_FORMAT_CUDA_C:
        return "cuda";
    case HK_FORMAT_PTX:
        return "ptx";
    case HK_FORMAT_CUBIN:
        return "cubin";
    case HK_FORMAT_FATBIN:
        return "fatbin";
    }
    return "unknown";
}

/* Within the report's own size only (a caller built against an older
 * layout has nothing past it), and never below the first layout. */
void hk_report_clear(hk_report *r) {
    if (!r || r->size < HKB_REPORT_SIZE0)
        return;
    free(r->log);
    size_t n = r->size < sizeof *r ? r->size : sizeof *r;
    memset((char *)r + sizeof r->size, 0, n - sizeof r->size);
}
