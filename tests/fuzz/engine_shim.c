/*
 * The one engine symbol the release code uses, for fuzz targets that link
 * net/ without the engine (loader/runtime.c defines the real one; the names
 * are the release manifest's format field and must stay the same).
 */
#include "hotkern/hotkern.h"

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
