/*
 * Names of the kernel image formats, and the library's version. A file of
 * its own because the release code in net/ writes format names into
 * manifests and is also built (for fuzzing) without the rest of the engine.
 */
#include "hotkern/hotkern.h"

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
