/*
 * The names and messages of hotkern's error codes, from the one table in
 * hotkern.h (HK_ERROR_TABLE), so that the enum, hk_strerror and hk_err_name
 * cannot drift apart. At the bottom (base/, see base/driver.h): the builds
 * in ptx/ and the release code in net/ name errors too, and net/ is also
 * built (for fuzzing) without the rest of the engine.
 */
#include "hotkern/hotkern.h"

const char *hk_strerror(int err) {
    switch (err) {
#define HK_ERROR_MESSAGE_(name, value, message)                                                    \
    case name:                                                                                     \
        return message;
        HK_ERROR_TABLE(HK_ERROR_MESSAGE_)
#undef HK_ERROR_MESSAGE_
    default:
        return "unknown error";
    }
}

const char *hk_err_name(int err) {
    switch (err) {
#define HK_ERROR_NAME_(name, value, message)                                                       \
    case name:                                                                                     \
        return #name;
        HK_ERROR_TABLE(HK_ERROR_NAME_)
#undef HK_ERROR_NAME_
    default:
        return "HK_ERR_UNKNOWN";
    }
}

int hk_err_is_verdict(int err) {
    switch (err) {
    /* What the engine concluded from the version's bytes (and the program's
     * declared tests and attributes): the same bytes get the same answer. */
    case HK_ERR_FORMAT:
    case HK_ERR_COMPILE:
    case HK_ERR_ARCH:
    case HK_ERR_MISSING_KERNEL:
    case HK_ERR_LAYOUT:
    case HK_ERR_GLOBAL_SIZE:
    case HK_ERR_REJECTED:
    case HK_ERR_ATTRIBUTE:
    case HK_ERR_CANARY:
    case HK_ERR_QUARANTINED:
        return 1;
    default:
        /* Busy, closing, out of memory, the disk, the driver or the device,
         * a build that timed out on a loaded host, a canary that could not
         * run: the state of this host, not of the version. */
        return 0;
    }
}
