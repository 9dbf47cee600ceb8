/*
 * Names of the kernel image formats. A file of its own because the release
 * code in net/ writes them into manifests and is also built (for fuzzing)
 * without the rest of the engine.
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
